"""``brisk bench SCENARIO``: benchmarks that print a table and write JSON.

Scenarios: ``foundation`` (model load cold/warm; TTFT and decode speed of our
loop against ``model.generate()``), ``prefix`` (TTFT with and without the
prefix cache: a long shared system prompt, and a 10-turn chat), ``all``.
Variants are compared side by side in one run; we report medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.events import Done, Request, Sampling

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "List three tips for learning a new language.",
]


def table(title: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{title}: no rows"
    cols = list(rows[0])
    body = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    return f"\n## {title}\n\n" + markdown_table(cols, body)


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table with columns padded to their widest cell."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in body]
    return "\n".join(lines)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Runner:
    """One engine, driven synchronously."""

    def __init__(self, model: str | None, dtype: str | None = None, draft: str = "") -> None:
        from engine.cli import Session

        ns = argparse.Namespace(model=model, device=None, dtype=dtype, draft_model=draft)
        self.session = Session(ns)
        self.loaded = self.session.load()
        assert self.session.engine.loaded is not None
        self.model = self.session.engine.loaded

    def ask(self, messages: list[dict[str, str]], max_tokens: int = 64, **kw: Any) -> Done:
        request = Request(id=uuid.uuid4().hex, messages=tuple(messages), sampling=Sampling(max_tokens=max_tokens), **kw)
        last = None
        for event in self.session.stream(request):
            last = event
        if not isinstance(last, Done):
            raise RuntimeError(f"request failed: {last}")
        return last

    def close(self) -> None:
        self.session.close()


def bench_load(model: str | None) -> list[dict[str, Any]]:
    from engine.model_loader import ModelSpec, load_model

    rows = []
    with fresh_data_dir():
        for label in ("cold (first start: convert GGUF)", "warm (cached conversion)", "warm again"):
            t = time.perf_counter()
            load_model(ModelSpec(source=model or "", dtype="float32"))
            rows.append({"load": label, "seconds": time.perf_counter() - t})
        rows.append({"load": "warm, new process, imports included", "seconds": load_in_subprocess(model)})
    return rows


@contextlib.contextmanager
def fresh_data_dir() -> Iterator[str]:
    """Point BRISK_DATA_DIR at an empty temporary folder for the block, so first loads are real."""
    previous = os.environ.get("BRISK_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="brisk-bench-") as fresh:
        os.environ["BRISK_DATA_DIR"] = fresh
        try:
            yield fresh
        finally:
            if previous is None:
                os.environ.pop("BRISK_DATA_DIR", None)
            else:
                os.environ["BRISK_DATA_DIR"] = previous


def load_in_subprocess(model: str | None) -> float:
    """Seconds from a fresh interpreter's first import to a loaded model (what a restart costs)."""
    import subprocess
    import sys

    code = (
        "import time; t = time.perf_counter()\n"
        "from engine.model_loader import ModelSpec, load_model\n"
        f"load_model(ModelSpec(source={model or ''!r}, dtype='float32'))\n"
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def generate_timed(model: Any, ids: list[int], max_tokens: int) -> tuple[float, float, int]:
    """TTFT, decode tokens/s and token count of ``model.generate()`` (greedy)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    clock = Clock()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, streamer=clock, min_new_tokens=max_tokens
        )
    n = out.shape[1] - len(ids)
    first = clock.times[1]  # times[0] is the prompt itself
    decode = clock.times[-1] - first
    return first - t0, (n - 1) / decode if n > 1 else float("nan"), n


def bench_loop_vs_generate(runner: Runner, runs: int, max_tokens: int = 64) -> list[dict[str, Any]]:
    from engine.prompt import build_prompt

    tok = runner.model.tokenizer
    results: dict[str, dict[str, list[float]]] = {"brisk loop": {}, "model.generate()": {}}
    for name in results:
        results[name] = {"ttft": [], "tps": []}
    for _ in range(runs):
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            ids = build_prompt(tok, messages, runner.model.context_length, max_tokens).ids
            # the same prompt, the same length, alternating so drift hits both
            done = runner.ask(messages, max_tokens=max_tokens, prefix_cache=False)
            results["brisk loop"]["ttft"].append(done.metrics["ttft_s"])
            if done.metrics.get("tokens_per_s"):
                results["brisk loop"]["tps"].append(done.metrics["tokens_per_s"])
            ttft, tps, _ = generate_timed(runner.model.model, ids, max_tokens)
            results["model.generate()"]["ttft"].append(ttft)
            results["model.generate()"]["tps"].append(tps)
    base = median(results["model.generate()"]["tps"])
    return [
        {
            "decoder": name,
            "ttft_ms (median)": 1000 * median(r["ttft"]),
            "decode tok/s (median)": median(r["tps"]),
            "vs generate": median(r["tps"]) / base,
            "samples": len(r["tps"]),
        }
        for name, r in results.items()
    ]


def run_foundation(args: argparse.Namespace) -> dict[str, Any]:
    load = bench_load(args.model)
    print(table("Model load (in-process, after imports)", load))
    runner = Runner(args.model, "float32")
    try:
        decode = bench_loop_vs_generate(runner, args.runs)
    finally:
        runner.close()
    print(table("Decode loop vs generate() (greedy, 64 new tokens, 3 prompts)", decode))
    return {"load": load, "decode": decode}


def run_quant(args: argparse.Namespace) -> dict[str, Any]:
    from engine import quant_bench

    rows = quant_bench.run(args.runs)
    print(f"\n## Quantization on the bundled model (CPU, median of {args.runs} runs)\n")
    print(quant_bench.table(rows))
    print(quant_bench.verdict(rows))
    print(quant_bench.reply_verdict(rows))
    return {"rows": rows, "verdict": quant_bench.verdict(rows), "reply_verdict": quant_bench.reply_verdict(rows)}


SCENARIOS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"foundation": run_foundation}


def run_bench(args: argparse.Namespace) -> int:
    from engine import bench_prefix, bench_spec

    SCENARIOS.setdefault("prefix", bench_prefix.run)
    SCENARIOS.setdefault("speculative", bench_spec.run)
    SCENARIOS.setdefault("quant", run_quant)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; choose one of: all, {', '.join(SCENARIOS)}")
        return 2
    from engine.doctor import report

    for name in names:
        started = time.time()
        data = {"scenario": name, "machine": report(), "started": started, "results": SCENARIOS[name](args)}
        out = Path(args.out) if args.out and len(names) == 1 else Path("bench/results") / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2, default=str))
        print(f"\nwrote {out}")
    return 0
