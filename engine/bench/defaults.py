"""Which default sampling keeps the bundled model from looping: greedy, greedy with a repetition penalty, sampled.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/brisk bench defaults [--max-tokens N]`` (or
``python -m engine.bench.defaults [MAX_TOKENS]``; 256 tokens unless given); prints a table and writes
``bench/results/defaults.json`` (with every reply, to read).  One engine on the bundled
model (or ``--model``; its mode as installed), the answer cache off; each prompt is asked once per variant, the variants
interleaved prompt by prompt.  Per variant: how many replies loop (a 4-gram repeated 3 or more times, or a
line repeated), how many ran to the token limit, how many the loop stop ended, the share of repeated
4-grams and the median reply length.  The prompts are of many kinds, not picked for looping.  Speed is not
measured here (``brisk bench``): these are the replies' words.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import Counter
from typing import Any

from engine.api import AnswerCacheSettings, Done, ModelSpec, Request, Sampling
from engine.bench.common import markdown_table, median, save
from engine.client import Client, local_backend

PROMPTS = [
    "Write a haiku about rain.",
    "Explain photosynthesis to a child.",
    "Give me three tips for a job interview.",
    "What is the capital of Australia?",
    "Write a short story about a lighthouse keeper.",
    "How do I reverse a list in Python?",
    "What makes a good cup of tea?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "Translate 'good morning, how are you?' into French.",
    "List five fruits that are red.",
    "Why is the sky blue?",
    "Write an email asking my manager for a day off on Friday.",
    "What is 17 times 23?",
    "Describe a busy market in the morning.",
    "Give me a recipe for pancakes.",
    "What are the pros and cons of remote work?",
]
VARIANTS = {
    "greedy": Sampling(),
    "greedy, penalty 1.1": Sampling(repetition_penalty=1.1),
    "greedy, penalty 1.1, loop stop (default)": Sampling(repetition_penalty=1.1, stop_repeats=3),
    "greedy, penalty 1.2": Sampling(repetition_penalty=1.2),
    "sampled t=0.7 p=0.9, penalty 1.1": Sampling(temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=1),
}


def loops(ids: list[int], text: str) -> bool:
    """A 4-gram of tokens three times or more, or one non-empty line said three times or more."""
    grams = Counter(tuple(ids[i : i + 4]) for i in range(len(ids) - 3))
    lines = Counter(line.strip() for line in text.splitlines() if line.strip())
    return (bool(grams) and max(grams.values()) >= 3) or (bool(lines) and max(lines.values()) >= 3)


def repeated_share(ids: list[int]) -> float:
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``brisk bench defaults``: each variant on every prompt, ``--max-tokens`` (256) a reply; the table, and
    the replies themselves in the JSON."""
    max_tokens = int(getattr(args, "max_tokens", None) or 256)
    client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)), timeout=600)
    loaded = client.load(ModelSpec(source=getattr(args, "model", None) or "", quant="auto"))
    rows: dict[str, list[dict[str, object]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for i, prompt in enumerate(PROMPTS):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            sampling = VARIANTS[name]
            request = Request(
                uuid.uuid4().hex,
                ({"role": "user", "content": prompt},),
                Sampling(**{**sampling.__dict__, "max_tokens": max_tokens}),
            )
            events = list(client.stream(request))
            done = events[-1]
            assert isinstance(done, Done), done
            ids = [t for e in events for t in getattr(e, "ids", ())]
            rows[name].append(
                {
                    "prompt": prompt,
                    "text": done.text,
                    "tokens": len(ids),
                    "finish": done.finish_reason,
                    "loops": loops(ids, done.text),
                    "repeated": round(repeated_share(ids), 3),
                }
            )
    client.close()
    print(f"{loaded.model_name}, {loaded.info.quant}, max_tokens {max_tokens}, {len(PROMPTS)} prompts")
    body = []
    for name, replies in rows.items():
        n = len(replies)
        looped = sum(bool(r["loops"]) for r in replies)
        limit = sum(r["finish"] == "length" for r in replies)
        stopped = sum(r["finish"] == "repetition" for r in replies)
        share = median(float(r["repeated"]) for r in replies)  # type: ignore[arg-type]
        tokens = median(int(r["tokens"]) for r in replies)  # type: ignore[call-overload]
        body.append([name, f"{looped}/{n}", f"{limit}/{n}", f"{stopped}/{n}", f"{share:.2f}", f"{tokens:.0f}"])
    print(markdown_table(["variant", "loop", "to limit", "loop stop", "repeated 4-grams", "tokens"], body))
    return {"max_tokens": max_tokens, "rows": rows}


if __name__ == "__main__":
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    print(f"\nwrote {save('defaults', run(argparse.Namespace(max_tokens=max_tokens)))}")
