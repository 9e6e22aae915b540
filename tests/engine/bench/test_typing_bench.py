"""``brisk bench typing`` replays typed and pasted messages against the engine (tiny model, short text)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine.bench import typing_prefill


def test_the_typing_replay_prefills_before_send_and_changes_no_token(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(typing_prefill, "TYPED_CHARS", 4)
    monkeypatch.setattr(typing_prefill, "TYPING_CPS", 60.0)
    monkeypatch.setattr(typing_prefill, "PAUSE_BEFORE_SEND_S", 0.3)
    words = " ".join(["harbour"] * 30)
    monkeypatch.setattr(typing_prefill, "SIZES", {"short": ["Hi there"], "long": ["Rules:", words, "Sum them up."]})
    text = tmp_path / "note.txt"
    text.write_text(f"A note:\n\n{words}\n\nWhat does it say?", encoding="utf-8")
    args = argparse.Namespace(
        model=str(tiny_dir), dtype="float32", quant="none", runs=2, text_file=str(text), json=True
    )
    result = typing_prefill.run(args)
    rows = {row["message"]: row for row in result["rows"]}
    assert set(rows) == {"short", "long", "note.txt"}
    assert all(row["identical"] == "yes" for row in rows.values())
    assert rows["note.txt"]["prefilled before Send"] > 0  # typed and pasted before Send: prefilled then
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary) == {
        "tokens",
        "ttft_on_s",
        "ttft_off_s",
        "ttft_short_s",
        "prefilled_before_send",
        "max_interference_s",
        "identical",
    }
    assert summary["identical"] is True and summary["prefilled_before_send"] > 0
    assert summary["max_interference_s"] is not None and summary["max_interference_s"] < 1.0


def test_keystrokes_type_the_ends_and_paste_the_middle() -> None:
    steps = typing_prefill.keystrokes(["Hello", "middle part", "the end"])
    drafts = [draft for draft, _pause in steps]
    assert drafts[0] == "H" and drafts[-1] == "Hello\n\nmiddle part\n\nthe end"
    assert "Hello\n\nmiddle part" in drafts  # pasted in one step
    assert all(pause > 0 for _draft, pause in steps[1:])
