"""``brisk bench project`` on the tiny model: the project's new chat starts from its prefill, the chat outside
it is cold, both give the same tokens."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.bench import SCENARIOS, project


def test_the_project_bench_times_a_prefilled_new_chat_against_a_cold_one(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(project, "ASK_TOKENS", 4)
    monkeypatch.setattr(project, "SYSTEM", project.SYSTEM[:60])  # the tiny model's context is 512 bytes
    monkeypatch.setattr(project, "TOWNS", project.TOWNS[:1])
    assert SCENARIOS["project"] == "engine.bench.project"
    args = argparse.Namespace(model=str(tiny_dir), dtype="float32", quant="none", runs=2)
    result = project.run(args)
    rows = result["rows"]
    assert set(rows) == set(project.ROWS) and all(len(r) == 2 for r in rows.values())
    assert all(r["cached_tokens"] == 0 for r in rows["cold"])
    for warm, cold in zip(rows["warm"], rows["cold"], strict=True):
        assert warm["prompt_tokens"] == cold["prompt_tokens"]
        assert warm["computed_tokens"] < warm["typed_tokens"] == warm["cached_tokens"], "its prefix was prefilled"
    assert result["identical"] and all(p > 0 for p in result["prefilled_s"])
    assert "| new chat in the open project (prefilled)" in capsys.readouterr().out
