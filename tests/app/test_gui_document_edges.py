"""Rough edges of attaching in the window (issue "Chat with documents"): a Cancel while a folder is listed ends
quietly, the progress line moves on while a file is indexed (and Cancel still works there), and a changed file
attached again (in another chat, or by ``brisk documents add``) replaces its older text in every chat.

Real windows on a real history file and the real document index in the test's data folder; the fake engine
records each request's ``documents``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt

from app.window import MainWindow
from app.window.document_controller import progress_line
from engine.documents.chunking import chunk
from engine.documents.library import DocumentLibrary, indexing_name
from engine.documents.store import DocumentStore
from tests.support.gui_harness import chat, fake, words_only_library

HANDBOOK = "# Handbook\n\nThe office opens at nine and closes at five. Coffee is free on Fridays.\n"
LONG = "\n\n".join(f"Paragraph {n}: " + " ".join(f"word{n}x{m}" for m in range(120)) for n in range(60))


def settle(qtbot, window: MainWindow) -> None:  # noqa: ANN001
    docs = window.documents
    qtbot.waitUntil(lambda: not docs.indexing and docs.pending == 0, timeout=15_000)


def ids_of(window: MainWindow, conversation: str | None = None) -> list[str]:
    if conversation is None:
        return [d["id"] for d in window.session.documents()]
    return [d["id"] for d in window.store.get_conversation(conversation).documents]


def attach(qtbot, window: MainWindow, *paths: Path) -> None:  # noqa: ANN001
    assert window.documents.attach([str(p) for p in paths])
    settle(qtbot, window)


class HeldLibrary:
    """The real library; once ``hold`` is set, an attach waits for Cancel before it begins (so a folder's
    listing is what the Cancel stops)."""

    def __init__(self) -> None:
        self.real = words_only_library()
        self.store = self.real.store
        self.hold = False
        self.reached = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def attach(self, paths: Any, progress: Any = None, cancel: Any = None) -> Any:
        if self.hold:
            self.reached.set()
            stop = threading.Event()
            while not cancel() and not stop.wait(0.01):
                pass
        return self.real.attach(paths, progress, cancel)


def test_a_cancel_while_a_folder_is_listed_ends_quietly_and_keeps_what_was_attached(
    harness, qtbot, tmp_path: Path
) -> None:  # noqa: ANN001
    handbook = tmp_path / "handbook.md"
    handbook.write_text(HANDBOOK, encoding="utf-8")
    folder = tmp_path / "project"
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "guide.md").write_text("A guide.\n", encoding="utf-8")
    library = HeldLibrary()
    window = harness.open(document_library=lambda: library)
    cid = chat(qtbot, window, "Hello")
    attach(qtbot, window, handbook)
    before = ids_of(window)
    assert len(before) == 1

    library.hold = True
    assert window.documents.attach([str(folder)])
    qtbot.waitUntil(library.reached.is_set, timeout=15_000)
    qtbot.mouseClick(window.composer.chips.cancel_button, Qt.MouseButton.LeftButton)
    settle(qtbot, window)
    # was: a red "No file was attached: Reading the folder project was cancelled."
    assert window.banner("documents") is None, "a cancel is not a problem with a file"
    assert window.composer.hint.text() == "Stopped reading files; 0 attached."
    assert ids_of(window) == before and ids_of(window, cid) == before, "what was attached stays"
    assert not window.composer.chips.progress_row.isVisible()
    chat(qtbot, window, "Still there?")
    assert fake(window).requests[-1].documents == tuple(before)


def test_the_progress_line_says_which_passages_are_indexed() -> None:
    assert progress_line(0, 1, indexing_name("big.pdf", 120, 800)) == "Indexing big.pdf: 120 of 800 passages\u2026"
    assert progress_line(2, 5, indexing_name("a.md", 0, 1)) == "Indexing a.md: 0 of 1 passage\u2026 (file 3 of 5)"
    assert progress_line(0, 1, "report.pdf (12 of 40)") == "Reading report.pdf (12 of 40 pages)\u2026"
    assert progress_line(3, 300, "note003.md") == "Reading note003.md\u2026 (file 4 of 300)"


def test_the_progress_line_moves_on_while_a_file_is_indexed_and_cancel_still_works(
    harness, qtbot, tmp_path: Path
) -> None:  # noqa: ANN001
    big = tmp_path / "big.md"
    big.write_text(LONG, encoding="utf-8")
    passages = len(chunk(LONG.rstrip("\n") + "\n"))
    reached, gate = threading.Event(), threading.Event()

    def embed(texts: list[str]) -> np.ndarray:  # the embedding model at work on the first batch until let go
        reached.set()
        gate.wait(15)
        return np.ones((len(texts), 8), dtype=np.float32)

    window = harness.open(document_library=lambda: DocumentLibrary(embed=embed))
    chips = window.composer.chips
    assert window.documents.attach([str(big)])
    qtbot.waitUntil(reached.is_set, timeout=15_000)
    # was: "Reading big.md…" until the whole file was indexed
    qtbot.waitUntil(lambda: chips.progress_label.text() == f"Indexing big.md: 0 of {passages:,} passages\u2026")
    assert chips.cancel_button.isEnabled()
    qtbot.mouseClick(chips.cancel_button, Qt.MouseButton.LeftButton)
    assert chips.progress_label.text() == "Stopping\u2026"
    gate.set()
    settle(qtbot, window)
    assert window.banner("documents") is None
    assert window.composer.hint.text() == "Stopped reading files; 0 attached."
    assert window.session.documents() == [] and window.documents.library().store.list() == [], "nothing half-kept"


def attached_then_changed(harness, qtbot, tmp_path: Path) -> tuple[Any, Path, str, str]:  # noqa: ANN001
    """A window whose first chat holds handbook.md, then a new chat open and the file changed on disk:
    (window, the file, the first chat's id, the old text's id)."""
    handbook = tmp_path / "handbook.md"
    handbook.write_text(HANDBOOK, encoding="utf-8")
    window = harness.open()
    first = chat(qtbot, window, "First")
    attach(qtbot, window, handbook)
    (old,) = ids_of(window)
    window.new_chat()
    handbook.write_text(HANDBOOK + "\nThe office is closed on Sundays.\n", encoding="utf-8")
    return window, handbook, first, old


def test_a_changed_file_attached_in_another_chat_replaces_it_in_every_chat(harness, qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    window, handbook, first, old = attached_then_changed(harness, qtbot, tmp_path)
    attach(qtbot, window, handbook)  # for the next new chat
    (new,) = ids_of(window)
    assert new != old
    # was: the first chat still held the old id, "removed from the index", and no longer sent it
    assert ids_of(window, first) == [new]
    assert "Attached 1 document" in window.composer.hint.text()
    second = chat(qtbot, window, "Second")
    assert fake(window).requests[-1].documents == (new,)
    window.open_conversation(first)
    settle(qtbot, window)
    assert window.composer.chips.texts()[0].startswith("handbook.md \u00b7 ")
    assert "removed" not in window.composer.chips.texts()[0]
    chat(qtbot, window, "And Sundays?")
    assert fake(window).requests[-1].documents == (new,)

    handbook.write_text(HANDBOOK + "\nOpen on Sundays after all.\n", encoding="utf-8")
    attach(qtbot, window, handbook)  # again in the open chat: one chip, the newest text, in both chats
    (newest,) = ids_of(window)
    assert newest not in (old, new) and ids_of(window, second) == [newest]


def test_a_changed_file_added_by_the_command_line_replaces_it_when_the_chat_opens(
    harness, qtbot, tmp_path: Path, brisk_data_dir: Path
) -> None:  # noqa: ANN001
    window, handbook, first, old = attached_then_changed(harness, qtbot, tmp_path)
    other = DocumentStore(brisk_data_dir / "documents.db")  # `brisk documents add handbook.md`: another process
    try:
        (added,) = DocumentLibrary(other, embed=lambda texts: None).attach([handbook])
    finally:
        other.close()
    assert added.ok and added.replaced == old
    window.open_conversation(first)
    settle(qtbot, window)
    # was: "handbook.md · removed from the index", and the chat no longer sent it
    assert ids_of(window) == [added.doc_id]
    assert "removed" not in window.composer.chips.texts()[0]
    notes = window.banner("documents-notes")
    assert notes is not None and "handbook.md changed on disk" in notes.text()
    chat(qtbot, window, "And Sundays?")
    assert fake(window).requests[-1].documents == (added.doc_id,)
