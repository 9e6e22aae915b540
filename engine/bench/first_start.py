"""First start of the window as a new user meets it: time to a usable chat, and what the status bar said.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/brisk bench first-start --runs 3`` (or
``python -m engine.bench.first_start [ROUNDS]``, 3 unless given); prints a table and writes
``bench/results/first-start.json`` (``first_start.json`` from ``python -m``).  Each run is a new process,
``python -m app.first_start_probe`` (the window's side: this engine-side module cannot open a window), that
opens the real window offscreen on the bundled model (as ``brisk`` with no arguments does), interleaved
round by round:

* ``empty data folder``: a new data folder, the native step already built (``make run`` builds it first);
* ``empty, no native step yet``: a new data folder and a new torch extensions folder, so the native decode
  step is compiled in the background while the user chats (a source install where ``make`` did not build
  it, or a new torch version);
* ``restart``: the data folder of the previous ``empty data folder`` run.

Measured from the process's start: when the window showed, when Send became usable (a model is loaded
and the composer takes a message), the first reply's TTFT (asked the moment Send is usable), when the
background measurement of the weight modes ended (``tuned``; a first start only), and the status line's
texts with their times; ``backwards`` counts the times the progress bar went back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.bench.common import markdown_table, save, spread

ROOT = Path(__file__).resolve().parents[2]  # the repository, where ``python -m app.first_start_probe`` runs


def start(data: Path, extensions: Path | None) -> dict[str, object]:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BRISK_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}
    if extensions is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    started = time.time()
    probe = [sys.executable, "-m", "app.first_start_probe", str(out), repr(started)]
    subprocess.run(probe, env=env, check=False, cwd=ROOT)
    record = json.loads(out.read_text() or "{}")
    out.unlink()
    return record


def run(args: argparse.Namespace) -> dict[str, list[dict[str, object]]]:
    """``brisk bench first-start``: ``--runs`` rounds of the three variants; the table and the timelines."""
    rounds = max(1, int(getattr(args, "runs", None) or 3))
    rows: dict[str, list[dict[str, object]]] = {"empty data folder": [], "empty, no native step yet": [], "restart": []}
    scratch = Path(tempfile.mkdtemp(prefix="brisk-first-start-"))
    try:
        for i in range(rounds):
            data = scratch / f"data-{i}"
            rows["empty data folder"].append(start(data, None))
            rows["restart"].append(start(data, None))
            rows["empty, no native step yet"].append(start(scratch / f"data-native-{i}", scratch / f"ext-{i}"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    body = []
    for name, records in rows.items():
        window = [float(r["window_s"]) for r in records if "window_s" in r]  # type: ignore[arg-type]
        usable = [float(r["usable_s"]) for r in records if "usable_s" in r]  # type: ignore[arg-type]
        ttft = [1000 * float(r["ttft_s"]) for r in records if r.get("ttft_s") is not None]  # type: ignore[arg-type]
        tuned = [float(r["tuned_s"]) for r in records if "tuned_s" in r]  # type: ignore[arg-type]
        back = sum(int(r.get("backwards", 0)) for r in records)  # type: ignore[call-overload]
        body.append([name, *(spread(v, "{:.1f}") for v in (window, usable, ttft, tuned)), str(back)])
    print(markdown_table(["variant", "window s", "usable s", "first TTFT ms", "tuned s", "backwards"], body))
    for name, records in rows.items():
        for r in records:
            if "error" in r:
                print(f"  {name}: error: {r['error']}")
    print("\nstatus line of the last run of each variant (seconds from process start):")
    for name, records in rows.items():
        print(f"  {name}:")
        for t, text in records[-1].get("statuses", []):  # type: ignore[attr-defined]
            print(f"    {t:7.2f}  {text}")
    return rows


if __name__ == "__main__":
    found = run(argparse.Namespace(runs=int(sys.argv[1]) if len(sys.argv) > 1 else 3))
    print(f"\nwrote {save('first_start', found)}")
