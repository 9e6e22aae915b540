"""``brisk bench foundation``: model load cold and warm; TTFT and decode speed of our loop against ``generate()``.

The loop runs with speculative decoding off (``SPECULATIVE``), as ``generate()`` does, so the two
decode the same way, one token per step; ``brisk bench speculative`` measures the sources.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from engine.bench.common import Runner, fresh_data_dir, median, run_python, table

SPECULATIVE = "off"  # the baseline: plain decode, like generate()
PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "List three tips for learning a new language.",
]


def bench_load(model: str | None) -> list[dict[str, Any]]:
    from engine.api import ModelSpec
    from engine.model.loader import load_model

    rows = []
    with fresh_data_dir():
        for label in ("cold (first start: convert GGUF)", "warm (cached conversion)", "warm again"):
            t = time.perf_counter()
            load_model(ModelSpec(source=model or "", dtype="float32"))
            rows.append({"load": label, "seconds": time.perf_counter() - t})
        rows.append({"load": "warm, new process, imports included", "seconds": load_in_subprocess(model)})
    return rows


def load_in_subprocess(model: str | None) -> float:
    """Seconds from a fresh interpreter's first import to a loaded model (what a restart costs)."""
    code = (
        "import time; t = time.perf_counter()\n"
        "from engine.api import ModelSpec\nfrom engine.model.loader import load_model\n"
        f"load_model(ModelSpec(source={model or ''!r}, dtype='float32'))\n"
        "print(time.perf_counter() - t)"
    )
    return float(run_python(code).strip().splitlines()[-1])


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
    from engine.runtime.prompt import build_prompt

    tok = runner.model.tokenizer
    results: dict[str, dict[str, list[float]]] = {"brisk loop": {}, "model.generate()": {}}
    for name in results:
        results[name] = {"ttft": [], "tps": []}
    for _ in range(runs):
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            ids = build_prompt(tok, messages, runner.model.context_length, max_tokens).ids
            # the same prompt, the same length, alternating so drift hits both
            done = runner.ask(messages, max_tokens=max_tokens, prefix_cache=False, speculative=SPECULATIVE)
            results["brisk loop"]["ttft"].append(float("nan") if done.metrics.ttft_s is None else done.metrics.ttft_s)
            if done.metrics.tokens_per_s:
                results["brisk loop"]["tps"].append(done.metrics.tokens_per_s)
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    load = bench_load(args.model)
    print(table("Model load (in-process, after imports)", load))
    runner = Runner(args.model, "float32")
    try:
        decode = bench_loop_vs_generate(runner, args.runs)
    finally:
        runner.close()
    print(table(f"Decode loop vs generate() (greedy, 64 new tokens, 3 prompts, speculative {SPECULATIVE})", decode))
    return {"load": load, "decode": decode, "speculative": SPECULATIVE}
