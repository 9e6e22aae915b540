"""``brisk bench branch`` on the tiny model: every row measured, the branch warm, the cold chat cold, same tokens."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.bench import branch


def test_the_branch_bench_times_a_warm_branch_against_a_cold_chat(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(branch, "REPLY_TOKENS", 4)
    monkeypatch.setattr(branch, "TURNS", branch.TURNS[: branch.BRANCH_AFTER])
    args = argparse.Namespace(model=str(tiny_dir), dtype="float32", quant="none", runs=2)
    result = branch.run(args)
    rows = result["rows"]
    assert set(rows) == set(branch.ROWS) and all(len(r) == 2 for r in rows.values())
    assert all(r["cached_tokens"] == 0 for r in rows["cold"])
    for r, cold in zip(rows["branch"], rows["cold"], strict=True):
        assert r["prompt_tokens"] == cold["prompt_tokens"]
        assert r["computed_tokens"] < r["cached_tokens"], "the branch starts from its parent's cached prompt"
    first, second = (r["cached_tokens"] for r in rows["tail"])
    assert first == second, "each round's fork is a first fork, not warmed by the round before"
    assert result["identical"]
    out = capsys.readouterr().out
    assert "| branch after reply 6, first reply" in out and "branch / follow-up:" in out
