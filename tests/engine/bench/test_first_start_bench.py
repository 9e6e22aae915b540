"""``brisk bench first-start``'s tables from canned timelines (no window is opened here)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from engine.bench import first_start


def timeline(speeds: tuple[float, float, float], beside: float) -> dict[str, Any]:
    replies = [
        {"asked_s": 9.0 + n, "ttft_s": 0.2, "tok_s": s, "mode": "none", "cpu": {"brisk-engine": 1.0, "x": beside}}
        for n, s in enumerate(speeds)
    ]
    return {"window_s": 1.0, "usable_s": 8.0, "ttft_s": 0.5, "tuned_s": 30.0, "replies": replies,
            "background": [(12.0, "Measuring the weight modes in the background: q8-cpu loaded")]}  # fmt: skip


def test_the_table_puts_the_first_reply_beside_the_later_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, Path]] = []

    def window(data: Path, code: Path, model: str, extensions: Path | None = None) -> dict[str, Any]:
        calls.append(("window", code))
        return timeline((100.0, 150.0, 150.0), 0.25)

    def chat(data: Path, code: Path, model: str) -> dict[str, Any]:
        calls.append(("chat", code))
        return {"usable_s": 20.0, "ttft_s": 0.5, "replies": [{"tok_s": 140.0}, {"tok_s": 150.0}, {"tok_s": 150.0}]}

    monkeypatch.setattr(first_start, "window", window)
    monkeypatch.setattr(first_start, "chat", chat)
    monkeypatch.setenv(first_start.BEFORE_ENV, "/elsewhere")
    rows = first_start.run(argparse.Namespace(runs=2, only="empty data folder", model=None))
    out = capsys.readouterr().out
    assert list(rows) == [
        "before: window, empty data folder",
        "window, empty data folder",
        "before: brisk chat, empty data folder",
        "brisk chat, empty data folder",
    ]
    assert [c for c in calls if c[0] == "window"][:2] == [("window", Path("/elsewhere")), ("window", first_start.ROOT)]
    assert [c for c in calls if c[0] == "window"][2:] == [("window", first_start.ROOT), ("window", Path("/elsewhere"))]
    line = next(x for x in out.splitlines() if x.startswith("| window, empty data folder"))
    assert "| 8.5 (8.5-8.5) " in line and "| 100.0 (100.0-100.0) " in line and "| 0.67 (0.67-0.67) " in line
    chat_line = next(x for x in out.splitlines() if x.startswith("| brisk chat, empty data folder"))
    assert "| 0.93 (0.93-0.93) " in chat_line
    cells = [[c.strip() for c in x.split("|")[1:-1]] for x in out.splitlines() if x.startswith("| window, empty")]
    assert cells[-1][:2] == ["window, empty data folder", "0.25 (0.25-0.25)"]  # the other threads' CPU, reply 1
    assert "background: Measuring the weight modes" in out
