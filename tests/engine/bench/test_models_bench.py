"""`brisk bench models` and the draft pair of `brisk bench speculative` measure what they say they do."""

from __future__ import annotations

from pathlib import Path

from engine.bench import models as models_bench
from engine.bench.speculative import family_pair


def test_the_library_scan_row_lists_every_folder_and_remembers_them(library_home: Path) -> None:
    row = models_bench.measure_scan()
    assert row["models"] == models_bench.LIBRARY_SIZE + 1  # and the bundled model
    assert row["headers read"] == row["models"] and row["headers read again"] == 0


def test_the_draft_pair_keeps_greedy_output_and_drafts(brisk_data_dir: Path) -> None:
    rows = family_pair(1, {"open: fox": "Write a short story about a fox who learns to sail."})
    assert [row["identical"] for row in rows] == ["yes"]
    assert rows[0]["draft tok/s"] > 0
