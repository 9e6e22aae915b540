"""Chat with documents (issue 29): the context meter shows the attached documents' share, and follows an attach
or a detach at once; the banner for a folder's unreadable files counts no messages as files.

Real windows on a real history file and the real document index (``tests/support/gui_harness.py``); the fake
engine counts one token per word and replies with the metrics the test gives it (what the reply's prompt held)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from app.state.attachments import problems_text
from app.state.context import Usage, meter_text, meter_tip, usage
from app.window import MainWindow
from engine.api import Metrics
from tests.support.fake_engine import METRICS
from tests.support.gui_harness import chat, fake

REPORT_WORDS, NOTES_WORDS = 3000, 800
TAGS = 12  # the tokens of the tags around a whole document in the prompt (the engine's, not the chip's)
PROMPT = 3400  # the first reply's prompt: the report whole (3,012 with its tags) and 388 of the chat


def words(n: int, stem: str) -> str:
    return " ".join(f"{stem}{k}" for k in range(n)) + "\n"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "report.md").write_text(words(REPORT_WORDS, "report"), encoding="utf-8")
    (folder / "notes.md").write_text(words(NOTES_WORDS, "note"), encoding="utf-8")
    return folder


def settle(qtbot, window: MainWindow) -> None:  # noqa: ANN001
    docs = window.documents
    qtbot.waitUntil(lambda: not docs.indexing and docs.pending == 0, timeout=15_000)


def with_context(qtbot, window: MainWindow, length: int) -> None:  # noqa: ANN001
    """Load the fake model again, now with a known context length."""
    fake(window).load_info |= {"context_length": length}
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        window.load_model()


def attach(qtbot, window: MainWindow, path: Path) -> dict[str, Any]:  # noqa: ANN001
    assert window.documents.attach([str(path)])
    settle(qtbot, window)
    return next(d for d in window.session.documents() if d["name"] == path.name)


def detach_with_chip(qtbot, window: MainWindow, doc: dict[str, Any]) -> None:  # noqa: ANN001
    chip = window.composer.chips.chip(doc["id"])
    assert chip is not None
    qtbot.mouseClick(chip.close_button, Qt.MouseButton.LeftButton)


def reply_reading(window: MainWindow, doc: dict[str, Any]) -> None:
    """The next reply's prompt holds ``doc`` whole (``PROMPT`` tokens in all)."""
    source = {"doc_id": doc["id"], "name": doc["name"], "path": doc["path"], "chunk": -1, "start": 0,
              "end": doc["chars"], "label": doc["name"]}  # fmt: skip
    fake(window).metrics = Metrics(
        **{**METRICS.to_dict(), "prompt_tokens": PROMPT, "document_tokens": REPORT_WORDS + TAGS, "sources": (source,)}
    )


def test_the_meter_shows_documents_and_follows_attach_and_detach(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    with_context(qtbot, window, 8192)
    meter = window.composer.context
    report = attach(qtbot, window, files / "report.md")
    assert meter.text() == "Context: 3,000 of 8,192 tokens (37 %)", "before a reply the count is all documents"
    assert "System prompt and messages: counted after the first reply" in meter.toolTip()

    reply_reading(window, report)
    chat(qtbot, window, "What does the report say?")
    used = PROMPT + METRICS.completion_tokens  # 3,405: the prompt (the report with its tags) and the reply
    in_chat = used - REPORT_WORDS - TAGS  # 393
    assert meter.text() == "Context: 3,405 of 8,192 tokens (documents 3,012)"
    tip = meter.toolTip()
    assert tip.startswith("Context: 3,405 of 8,192 tokens (42 %), of which:"), "the tooltip keeps the percentage"
    assert f"System prompt and messages: {in_chat}" in tip and "Documents, whole: 3,012" in tip

    notes = attach(qtbot, window, files / "notes.md")  # after a reply that read documents: counted at once
    assert meter.text() == f"Context: {in_chat + 3800:,} of 8,192 tokens (documents 3,800)"
    assert "Documents, whole: 3,800" in meter.toolTip()

    detach_with_chip(qtbot, window, notes)  # back to what the reply read: its own count
    assert meter.text() == "Context: 3,405 of 8,192 tokens (documents 3,012)"

    detach_with_chip(qtbot, window, report)  # no document left: the chat alone, at once
    assert window.session.documents() == []
    assert meter.text() == f"Context: {in_chat} of 8,192 tokens (5 %)"
    assert "documents" not in meter.text() and "Documents" not in meter.toolTip()

    window.open_conversation(window.session.conversation_id or "")  # the same when the chat is opened again
    assert meter.text() == f"Context: {in_chat} of 8,192 tokens (5 %)"


def test_searched_passages_are_their_own_part_of_the_documents() -> None:
    whole = {"id": "a", "name": "a.md", "chars": 4000, "tokens": 1000}
    long = {"id": "b", "name": "b.md", "chars": 400_000, "tokens": 100_000}
    sources = [
        {"doc_id": "a", "chunk": -1, "start": 0, "end": 4000},
        {"doc_id": "b", "chunk": 3, "start": 0, "end": 2000},
        {"doc_id": "b", "chunk": 7, "start": 9000, "end": 11000},
    ]
    reply = {"prompt_tokens": 2500, "completion_tokens": 100, "document_tokens": 2010, "sources": sources}
    parts = usage([reply], [whole, long], searched={"b"})
    assert parts == Usage(chat=590, whole=1000, passages=1010, estimated=False, searched=1)
    assert parts.total == 2600, "what the reply's prompt held, as measured"
    assert meter_text(parts, 8192) == "Context: 2,600 of 8,192 tokens (documents 2,010)"
    tip = meter_tip(parts, 8192)
    assert "Documents, whole: 1,000" in tip and "Documents, searched passages: 1,010 (the last reply's)" in tip
    assert "1 document is too long to go whole" in tip

    gone = usage([reply], [whole])  # the long one detached: its passages go with it
    assert (gone.whole, gone.passages, gone.total) == (1000, 0, 1590)
    only_long = usage([reply], [long], searched={"b"})  # the whole one detached: the passages' length tells
    assert (only_long.whole, only_long.passages, only_long.total) == (0, 1000, 1590)
    new = {"id": "c", "name": "c.md", "chars": 800, "tokens": None}  # not counted yet: an estimate
    more = usage([reply], [whole, long, new], searched={"b"})
    assert (more.whole, more.passages, more.estimated) == (1200, 1010, True)
    assert meter_text(more, 0) == "Context: \u2248 2,800 tokens (documents 2,210)"


def test_a_folders_problems_are_not_counted_as_files(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    for name in ("a.xyz", "b.xyz", "c.dat"):  # kinds Brisk cannot read: one line for all three
        (files / name).write_bytes(b"\x00\x01 not text")
    for name in ("empty1.md", "empty2.md"):  # and one for both empty files
        (files / name).write_text("", encoding="utf-8")
    window = harness.open()
    assert window.documents.attach([str(files)])
    settle(qtbot, window)
    banner = window.banner("documents")
    assert banner is not None and banner.kind == "warning"
    lines = banner.text().splitlines()
    assert lines[0] == "Some files could not be attached:", "five files, in two lines: neither is the count"
    assert any(line.startswith("\u2022 3 files of kinds Brisk cannot read") for line in lines)
    assert any(line.startswith("\u2022 2 empty files") for line in lines)
    assert lines[-1] == "The other 2 were attached."
    assert sorted(d["name"] for d in window.session.documents()) == ["notes.md", "report.md"]

    one = problems_text(["gone.md does not exist."], 0)
    assert one == "Some files could not be attached:\n\u2022 gone.md does not exist."
    many = problems_text([f"file{n}.bin looks binary." for n in range(8)], 1)
    assert many.splitlines()[0] == "Some files could not be attached:"
    assert many.splitlines()[-2:] == ["\u2022 and 2 more.", "The other 1 was attached."]
