"""First question of a new process, ``brisk ask --json``: answer cache on/off x speculation auto/off, interleaved.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/brisk bench first-question --runs 10`` (or
``python -m engine.bench.first_question [ROUNDS]``, ten unless given; about five minutes for ten questions);
prints a table, writes ``bench/results/first-question.json`` (``first_question.json`` from ``python -m``).
Each question is asked once per variant, with a nonce so that no earlier run's answer serves it; the variant
that goes first rotates from question to question.  Each ask is :func:`engine.bench.common.ask_in_new_process`
on the data folder in use (``--model``, ``--quant`` and ``--dtype`` passed on when given).
"""

from __future__ import annotations

import argparse
import sys
import uuid

from engine.bench.common import ask_in_new_process, markdown_table, save, spread

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


def first_ttft_ms(question: str, flags: list[str]) -> float:
    metrics = ask_in_new_process(f"{question} [{uuid.uuid4().hex[:6]}]", ["--max-tokens", "32", *flags]).done()
    return 1000 * float(metrics["ttft_s"])


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    """``brisk bench first-question``: ``--runs`` questions, each once per variant; TTFT ms per variant."""
    count = max(1, int(getattr(args, "runs", None) or len(QUESTIONS)))
    given: list[str] = []
    for flag in ("model", "dtype", "quant"):
        if getattr(args, flag, None):
            given += [f"--{flag}", str(getattr(args, flag))]
    rows: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            rows[name].append(first_ttft_ms(question, [*given, *VARIANTS[name]]))
    body = [[name, spread(times)] for name, times in rows.items()]
    print(markdown_table(["`brisk ask` variant", "first-question TTFT ms, median (min-max)"], body))
    return rows


def main(argv: list[str]) -> None:
    rows = run(argparse.Namespace(runs=int(argv[0]) if argv else len(QUESTIONS)))
    print(f"wrote {save('first_question', rows)}")


if __name__ == "__main__":
    main(sys.argv[1:])
