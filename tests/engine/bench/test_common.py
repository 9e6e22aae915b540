"""``engine.bench.common``: the one median, percentile, spread, table and cold-question harness."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from engine.bench import common


def test_median_percentile_and_spread() -> None:
    assert common.median([3.0, 1.0, 2.0, 10.0]) == 2.5
    assert math.isnan(common.median([]))
    values = [float(v) for v in (7, 1, 3, 9, 5, 2, 8)]
    # linear interpolation between the closest ranks, as numpy's percentile does by default
    assert common.percentile(values, 50) == 5.0
    assert common.percentile(values, 95) == pytest.approx(8.7)
    assert common.percentile(values, 0) == 1.0 and common.percentile(values, 100) == 9.0
    assert common.percentile([4.0], 95) == 4.0
    assert math.isnan(common.percentile([], 50))
    assert common.spread([1200.0, 980.4, None, 1510.0]) == "1,200 (980-1,510)"
    assert common.spread([0.5, 0.25], "{:.2f}") == "0.38 (0.25-0.50)"
    assert common.spread([None]) == "-"


def test_tables_pad_every_column_to_its_widest_cell() -> None:
    text = common.markdown_table(["measure", "ms"], [["TTFT cold", "1,200 (980-1,510)"], ["warm", "88"]])
    lines = text.splitlines()
    assert lines[0] == "| measure   | ms                |"
    assert lines[1] == "|-----------|-------------------|"
    assert lines[2] == "| TTFT cold | 1,200 (980-1,510) |"
    assert len({len(line) for line in lines}) == 1
    rows = [{"variant": "a", "tok/s": 12.3456, "runs": 3}]
    assert common.table("Title", rows) == "\n## Title\n\n" + common.markdown_table(
        ["variant", "tok/s", "runs"], [["a", "12.346", "3"]]
    )
    assert common.table("Empty", []) == "Empty: no rows"


FAKE_BRISK = """
import json, sys, time
args = sys.argv[1:]
assert args[0] == "ask" and "--json" in args, args
print("loading...", file=sys.stderr)
if "--fail" in args:
    print("error: no model here", file=sys.stderr)
    sys.exit(3)
print("not json")
print(json.dumps({"type": "token", "t": 0.1, "text": "Hi"}), flush=True)
time.sleep(0.05)
print(json.dumps({"type": "done", "t": 0.2, "metrics": {"ttft_s": 0.1, "question": args[1]}}))
"""


def test_a_cold_question_reads_the_done_metrics_and_times_the_first_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(common, "BRISK", [sys.executable, "-c", FAKE_BRISK])
    cold = common.ask_in_new_process("Why?", ["--max-tokens", "8"], data_dir=tmp_path)
    assert cold.returncode == 0
    assert cold.done() == {"ttft_s": 0.1, "question": "Why?"}
    assert cold.first_token_s is not None and 0 < cold.first_token_s < cold.total_s
    assert cold.total_s - cold.first_token_s >= 0.05  # the token was timed when it came, not at the end
    assert cold.peak_rss_bytes > 1_000_000  # a Python process's own peak, in bytes
    assert "loading..." in cold.stderr

    failed = common.ask_in_new_process("Why?", ["--fail"])
    assert failed.returncode == 3 and failed.first_token_s is None
    with pytest.raises(RuntimeError, match=r"(?s)brisk ask failed \(3\): .*no model here"):
        failed.done()


def test_run_python_returns_what_the_child_printed() -> None:
    out = common.run_python("import os; print(os.environ['BRISK_BENCH_PROBE'])", env={"BRISK_BENCH_PROBE": "seen"})
    assert out.strip() == "seen"


def test_every_scenario_of_brisk_bench_is_a_module_with_run() -> None:
    import importlib

    from engine.bench import SCENARIOS

    for name, module in SCENARIOS.items():
        assert module.startswith("engine.bench."), name
        assert callable(getattr(importlib.import_module(module), "run", None)), name
