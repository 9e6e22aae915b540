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
    monkeypatch.setattr(typing_prefill, "STEADY", "When is it open?")
    monkeypatch.setattr(typing_prefill, "STEADY_CPS", (30.0,))
    monkeypatch.setattr(typing_prefill, "PASTE_TO_SEND_S", 0.3)
    text = tmp_path / "note.txt"
    text.write_text(f"A note:\n\n{words}\n\nWhat does it say?", encoding="utf-8")
    args = argparse.Namespace(
        model=str(tiny_dir), dtype="float32", quant="none", runs=2, text_file=str(text), json=True
    )
    result = typing_prefill.run(args)
    rows = {row["message"]: row for row in result["rows"]}
    assert set(rows) == {"short", "long", "note.txt", "steady 30 cps", "long paste"}
    assert all(row["identical"] == "yes" for row in rows.values())
    ready, total = rows["note.txt"]["ready at Send"].split(" of ")
    assert 0 < int(ready) <= int(total)  # typed and pasted before Send: prefilled then
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


def test_a_steady_typists_draft_is_handed_over_every_few_hundred_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "x" * 36  # 3 s at 12 characters a second, no pause
    handed = typing_prefill.hand_overs(typing_prefill.steady(text, 12.0), 1 / 12)
    times = [at for at, _draft in handed]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(handed) >= 8 and max(gaps) <= typing_prefill.EVERY_S + 1 / 12  # from the next key: a key's time more
    assert all(text.startswith(draft) for _at, draft in handed)
    monkeypatch.setattr(typing_prefill, "EVERY_S", None)  # the old composer: after a pause only
    assert typing_prefill.hand_overs(typing_prefill.steady(text, 12.0), 1 / 12) == []


def test_a_paste_is_handed_over_at_once_and_a_pause_after_it() -> None:
    steps = [("a", 0.0), ("a" + "b" * 50, 0.1), ("a" + "b" * 50 + "c", 0.1)]
    handed = typing_prefill.hand_overs(steps, 1.0)
    assert [draft for _at, draft in handed] == ["a" + "b" * 50, "a" + "b" * 50 + "c"]
    assert handed[0][0] == pytest.approx(0.1) and handed[1][0] == pytest.approx(0.2 + typing_prefill.PAUSE_S)
