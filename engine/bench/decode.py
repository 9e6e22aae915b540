"""``brisk bench decode``: decode speed against the machine's limits: memory bandwidth and a busy core.

Two tables, each printed and returned as JSON:

* **Bandwidth.**  The machine's memory read bandwidth (summing a 256 MB float32
  tensor, median of 5), then per mode (float32 packed, fp16-cpu and q8-cpu with
  their native decode step and, for comparison, fp16-cpu on the eager path,
  int8-cpu, int4-cpu): weight bytes read per decode step (``engine.quant.weight_bytes``
  less the input embedding, of which a step reads one row), decode tok/s
  (median of one-token steps after a 64-token prompt, through
  ``engine.model.kv.forward``) and the fraction of the bandwidth limit reached:
  bytes per step x steps per second / bandwidth.
* **Background load.**  For one mode (``--quant``, default fp16-cpu), decode
  tok/s idle with all threads and with one thread, and with a CPU hog (a
  subprocess spinning ``while True: pass`` on the last core, always killed in
  a ``finally``) with all threads, one thread, and all threads with the thread
  governor on (``engine.runtime.threads``).  Each run decodes a few idle steps
  first (the governor's baseline), then starts the hog and measures.  Variants
  are interleaved over ``--runs`` rounds; the table gives medians and each
  row's ratio to one thread on an idle core (target under load: >= 0.8).

Both measure plain one-token steps (speculative decoding off): the model's own decode speed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import torch

from engine.api import ModelSpec
from engine.bench.common import median, table
from engine.quant import native

MODES = ("none", "fp16-cpu", "q8-cpu", "int8-cpu", "int4-cpu")
VARIANT_NAMES = {"none": "float32 (packed)", "fp16-cpu": "fp16-cpu (native step)", "q8-cpu": "q8-cpu (native step)"}
STEPS = 24
WARM = 12


def bandwidth_gbs() -> float:
    a = torch.ones(256 * 1024 * 1024 // 4)
    speeds = []
    for _ in range(5):
        t = time.perf_counter()
        a.sum()
        speeds.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return median(speeds)


def step_times(model: Any, steps: int, before: Any = None, observe: bool = False) -> list[float]:
    from engine.model.kv import KVState, forward
    from engine.runtime.threads import observe_step

    state = KVState()
    forward(model, state, list(range(10, 74)))
    for i in range(WARM):
        t = time.perf_counter()
        forward(model, state, [100 + i], decode=True)
        if observe:
            observe_step(time.perf_counter() - t)
    if before is not None:
        before()
    out = []
    for i in range(steps):
        t = time.perf_counter()
        forward(model, state, [200 + i], decode=True)
        out.append(time.perf_counter() - t)
        if observe:
            observe_step(out[-1])
    return out


def hog() -> subprocess.Popen[bytes]:
    last = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def pin() -> None:
        if last is not None:
            os.sched_setaffinity(0, {last})

    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)


def load_run(model: Any, runs: int) -> list[dict[str, Any]]:
    from engine.runtime import threads

    most = torch.get_num_threads()
    variants = {
        "idle, all threads": (False, most, False),
        "idle, 1 thread": (False, 1, False),
        "hog, all threads": (True, most, False),
        "hog, 1 thread": (True, 1, False),
        "hog, all threads + governor": (True, most, True),
    }
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, (busy, count, adapt) in variants.items():
            threads.set_adaptive(adapt)
            torch.set_num_threads(count)
            proc: list[subprocess.Popen[bytes]] = []
            try:

                def start(busy: bool = busy, proc: list[subprocess.Popen[bytes]] = proc) -> None:
                    if busy:
                        proc.append(hog())
                        time.sleep(0.3)

                times = step_times(model, STEPS, start, observe=adapt)
            finally:
                for p in proc:
                    p.kill()
                    p.wait()
                threads.set_adaptive(False)
                torch.set_num_threads(most)
            speeds[name].append(1 / median(times))
    single = median(speeds["idle, 1 thread"])
    return [
        {
            "variant": name,
            "tok/s (median)": round(median(v), 2),
            "vs 1 thread idle": round(median(v) / single, 2),
            "runs": [round(x, 1) for x in v],
        }
        for name, v in speeds.items()
    ]


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model.loader import load_model

    runs = max(1, int(getattr(args, "runs", 3) or 3))
    native_enabled = native.ENABLED
    gbs = bandwidth_gbs()
    rows = []
    models = {}
    for mode in MODES:
        loaded = load_model(
            ModelSpec(quant=mode, dtype="float32" if mode in ("none", "fp16-cpu", "q8-cpu") else "auto")
        )
        models[mode] = loaded.model
    built = native.module(wait=True) is not None
    # (label, mode, native step on): fp16-cpu with its native step and on the eager path
    variants = [(VARIANT_NAMES.get(m, m), m, True) for m in MODES]
    if built:
        variants.insert(2, ("fp16-cpu (eager path)", "fp16-cpu", False))
    speeds: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for _ in range(runs):
        for label, mode, on in variants:
            native.ENABLED = on and native_enabled
            try:
                speeds[label].append(1 / median(step_times(models[mode], 8)))
            finally:
                native.ENABLED = native_enabled
    for label, mode, _ in variants:
        from engine import quant

        model = models[mode]
        embed = model.get_input_embeddings().weight
        read = quant.weight_bytes(model) - embed.numel() * embed.element_size()
        tps = median(speeds[label])
        rows.append(
            {
                "mode": label,
                "MB read per step": round(read / 1e6, 1),
                "tok/s (median)": round(tps, 2),
                "GB/s reached": round(read * tps / 1e9, 2),
                "fraction of bandwidth": round(read * tps / (gbs * 1e9), 3),
            }
        )
    print(f"\nmemory read bandwidth: {gbs:.1f} GB/s (sum of 256 MB, {torch.get_num_threads()} threads)")
    print(table(f"Weight bytes per decode step and the bandwidth limit (speculative off, median of {runs} runs)", rows))
    mode = getattr(args, "quant", None) or "fp16-cpu"
    mode = mode if mode in models else "fp16-cpu"
    load = load_run(models[mode], runs)
    title = (
        f"Decode under background load ({mode}, speculative off, {STEPS} steps, hog on one core, median of {runs} runs)"
    )
    print(table(title, [{k: v for k, v in r.items() if k != "runs"} for r in load]))
    return {"bandwidth_gbs": round(gbs, 2), "modes": rows, "load_mode": mode, "load": load, "speculative": "off"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.runtime.threads import isolated

    return isolated(lambda: _run(args))  # torch work off the caller's thread (engine.runtime.threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quant", default="fp16-cpu", choices=MODES)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
