"""``brisk bench answer-cache``: how fast the answer cache answers, and how often it is wrong.

1. Lookup to the complete answer (a 300-token reply) for an exact hit, a
   semantic hit (embedding the question included: the remembered vectors are
   dropped before each run) and a miss, with ``--entries`` other answers
   (default 2,000, random vectors) in the same context, so the numpy search
   sees a full cache.  Median and p95 of ``max(20, runs)`` lookups, wall time
   and this process's CPU time (what the lookup costs on an idle core).  Targets:
   exact under 20 ms, semantic under 60 ms.
2. The paraphrase hit rate and the false-hit rate on the near-miss set
   (``engine.answer_cache.pairs``) at the default threshold; target 0 false hits.

Runs on the CPU without the chat model; the embedding model is the packaged
all-MiniLM-L6-v2 (offline).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.answer_cache import AnswerCache, CacheConfig, CacheKey, Embedder, ModelIdentity
from engine.answer_cache.keys import normalise
from engine.answer_cache.pairs import evaluate
from engine.bench.common import median, percentile, table

MODEL = ModelIdentity("bench-model", "0" * 32, "float32", "none")
SYSTEM = [{"role": "system", "content": "You are a helpful assistant."}]
QUESTION = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"
MISS = "How do I repair a bicycle tyre puncture?"
TARGETS = {"exact": 0.020, "semantic": 0.060}


def _key(question: str) -> CacheKey:
    return CacheKey.for_messages(MODEL, [*SYSTEM, {"role": "user", "content": question}])


def _fill(cache: AnswerCache, entries: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    context = _key(QUESTION).context
    for i in range(entries):
        vector = rng.standard_normal(384).astype(np.float32)
        vector /= np.linalg.norm(vector)
        question = f"filler question {i}"
        cache.store.upsert(
            {
                "model_key": MODEL.key,
                "model_name": MODEL.name,
                "context_hash": context,
                "question_key": _key(question).question_key,
                "question_norm": normalise(question),
                "question": question,
                "answer": f"filler answer {i}",
                "token_ids": list(range(20)),
                "generation_s": 1.0,
                "embedding": vector.tobytes(),
            }
        )


def _time(cache: AnswerCache, question: str, runs: int, expect: str | None) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this process, all threads) of each lookup."""
    times, cpu = [], []
    for _ in range(runs):
        cache.embedder.forget()
        began, began_cpu = time.perf_counter(), time.process_time()
        hit = cache.lookup(_key(question))
        answer = hit.answer if hit else None  # the complete reply is in hand here
        times.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
        kind = hit.kind if hit else None
        if kind != expect or (hit and not answer):
            raise RuntimeError(f"Expected a {expect or 'miss'} for {question!r}, got {kind or 'a miss'}.")
    return times, cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = max(20, int(getattr(args, "runs", 5)))
    entries = int(getattr(args, "entries", 2000))
    embedder = Embedder()
    began = time.perf_counter()
    if not embedder.wait(600):
        raise RuntimeError(embedder.error or "The embedding model did not load within 10 minutes.")
    load_s = time.perf_counter() - began
    with tempfile.TemporaryDirectory(prefix="brisk-bench-cache-") as folder:
        cache = AnswerCache(Path(folder) / "brisk.db", CacheConfig(), embedder=embedder)
        _fill(cache, entries)
        answer_ids = list(range(300))
        cache.put(_key(QUESTION), "Paris is the capital of France. " * 40, answer_ids, generation_s=2.0)
        rows = []
        for name, question, expect in (
            ("exact hit", QUESTION.upper(), "exact"),
            ("semantic hit", PARAPHRASE, "semantic"),
            ("miss", MISS, None),
        ):
            times, cpu = _time(cache, question, runs, expect)
            target = TARGETS.get(expect or "")
            rows.append(
                {
                    "lookup": name,
                    "median_ms": 1000 * median(times),
                    "p95_ms": 1000 * percentile(times, 95),
                    "cpu_ms": 1000 * median(cpu),
                    "target_ms": f"< {1000 * target:.0f}" if target else "-",
                    "met": ("yes" if median(times) < target else "NO") if target else "-",
                }
            )
        cache.close()
        pairs_cache = AnswerCache(Path(folder) / "pairs.db", CacheConfig(), embedder=embedder)
        rates = evaluate(pairs_cache, MODEL)
        pairs_cache.close()
    print(table(f"Answer cache: lookup to complete answer ({entries} entries, {runs} runs each)", rows))
    pair_rows = [
        {
            "threshold": CacheConfig().threshold,
            "paraphrase_hits": f"{rates['paraphrase_hits']}/{rates['paraphrase_pairs']}",
            "paraphrase_hit_rate": rates["paraphrase_hit_rate"],
            "false_hits": f"{rates['near_miss_hits']}/{rates['near_miss_pairs']}",
            "false_hit_rate": rates["false_hit_rate"],
        }
    ]
    print(table("Answer cache: paraphrases and near misses", pair_rows))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nEmbedding model loaded in the background in {load_s:.1f} s. cpu_ms: CPU time of this process")
    print(f"(all threads) per lookup; load average {load:.1f} on {os.cpu_count()} cores during the run.")
    return {
        "lookups": rows,
        "pairs": pair_rows,
        "entries": entries,
        "runs": runs,
        "embedder_load_s": load_s,
        "load_average": load,
        "cores": os.cpu_count(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--entries", type=int, default=2000)
    run(parser.parse_args())
