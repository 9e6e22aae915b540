"""First question of a new process, ``brisk ask --json``: answer cache on/off x speculation auto/off, interleaved.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/python bench/first_question.py [ROUNDS]`` (about
five minutes for the default ten questions); prints a table, writes ``bench/results/first_question.json``.
Each question is asked once per variant, with a nonce so that no earlier run's answer serves it; the
variant that goes first rotates from question to question.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain photosynthesis to a child.",
    "Give me three tips for a job interview.",
    "Describe a busy market in the morning.",
    "What makes a good cup of tea?",
    "Why do cats purr?",
    "How do volcanoes form?",
    "Plan a weekend in Rome.",
    "Write a haiku about rain.",
    "What is a black hole?",
]
VARIANTS = {
    "as installed": [],
    "--no-answer-cache": ["--no-answer-cache"],
    "--speculative off": ["--speculative", "off"],
    "--no-answer-cache --speculative off": ["--no-answer-cache", "--speculative", "off"],
}
LAUNCH = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"]


def first_ttft_ms(question: str, flags: list[str]) -> float:
    command = [*LAUNCH, "ask", "--json", "--max-tokens", "32", *flags, f"{question} [{uuid.uuid4().hex[:6]}]"]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False
    )
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("type") == "done":
                return 1000 * float(event["metrics"]["ttft_s"])
    raise RuntimeError(f"brisk ask failed ({result.returncode}): {result.stderr.strip()[-300:]}")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else len(QUESTIONS)
    rows: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            rows[name].append(first_ttft_ms(question, VARIANTS[name]))
    print("| `brisk ask` variant | first-question TTFT ms, median (min-max) |")
    print("|---|---|")
    for name, times in rows.items():
        print(f"| {name} | {statistics.median(times):.0f} ({min(times):.0f}-{max(times):.0f}) |")
    out = Path("bench/results/first_question.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
