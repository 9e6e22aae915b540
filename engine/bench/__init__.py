"""``brisk bench SCENARIO``: benchmarks that print a table and write JSON.

Scenarios: ``foundation`` (model load cold/warm; TTFT and decode speed of our
loop against ``model.generate()``), ``prefix`` (TTFT with and without the
prefix cache: a long shared system prompt, and a 10-turn chat), ``speculative``
(each draft source on grounded and open prompts), ``quant`` (each quantization
mode's speed and agreement), ``answer-cache`` (hit and miss times, false
hits), ``all``.  Variants are compared side by side in one run; we report
medians.  Each scenario lives in a module of its own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path
from typing import Any

SCENARIOS: dict[str, str] = {
    "foundation": "engine.bench.foundation",
    "prefix": "engine.bench.prefix",
    "speculative": "engine.bench.speculative",
    "quant": "engine.bench.quant",
    "answer-cache": "engine.bench.answer_cache",
}


def run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return importlib.import_module(SCENARIOS[name]).run(args)  # type: ignore[no-any-return]


def run_bench(args: argparse.Namespace) -> int:
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; choose one of: all, {', '.join(SCENARIOS)}")
        return 2
    from engine.doctor import report

    for name in names:
        started = time.time()
        data = {"scenario": name, "machine": report(), "started": started, "results": run_scenario(name, args)}
        out = Path(args.out) if args.out and len(names) == 1 else Path("bench/results") / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2, default=str))
        print(f"\nwrote {out}")
    return 0
