"""``brisk bench structured`` runs end to end (on the tiny model) and prints what the issue asks for."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.bench import structured
from engine.runtime import grammar


def test_the_structured_table_has_every_schema_and_its_numbers(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(model=str(tiny_dir), dtype="float32", quant="none", runs=2)
    result = structured.run(args)
    rows = {row["schema"]: row for row in result["rows"]}
    assert set(rows) == set(structured.SCHEMAS)
    for row in rows.values():
        assert row["valid, free"] == "0%"  # a random model writes no JSON unasked
        assert row["mask us/token"] > 0 and row["total s, format"] > 0
        assert int(row["forced"].rstrip("%")) > 0  # key names are forced on every schema
    assert grammar.JUMP_FORWARD  # put back after the no-jump-forward variant
    out = capsys.readouterr().out
    assert "valid, format" in out and "no jump-fwd" in out
