"""Chat with documents in the window (issue 29): attach, chips, the requests, sources, the Documents view.

Real windows on a real history file and the real document index in the test's data folder (searched by
words alone: no embedding model to load); the fake engine records each request (its ``documents``) and
counts tokens one per word, so each test checks what a reply is really asked with and what a chip says."""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox

from app.window import MainWindow
from engine.api import Metrics
from engine.storage import Settings, Store
from engine.storage import store as store_module
from tests.support.fake_engine import METRICS
from tests.support.gui_harness import chat, fake, last_bubble, type_and_send

HANDBOOK = "# Handbook\n\nThe office opens at nine and closes at five. Coffee is free on Fridays.\n"
NOTES = "Meeting notes.\n\n" + "\n\n".join(f"Part {n}: the budget line {n} was approved." for n in range(1, 9))


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    write(folder, "handbook.md", HANDBOOK)
    write(folder, "notes.txt", NOTES)
    return folder


def settle(qtbot, window: MainWindow) -> None:  # noqa: ANN001
    """Wait until the window's document workers have delivered everything asked of them."""
    docs = window.documents
    qtbot.waitUntil(lambda: not docs.indexing and docs.pending == 0, timeout=15_000)


def attach_with_paperclip(qtbot, window: MainWindow, monkeypatch, paths: list[Path]) -> None:  # noqa: ANN001
    """Click the paperclip as a user does; the file dialog answers ``paths``."""
    asked: list[str] = []

    def pick(parent: Any, caption: str, folder: str, filters: str) -> tuple[list[str], str]:
        asked.append(caption)
        return [str(p) for p in paths], filters

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", pick)
    button = window.composer.attach_button
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton, pos=QPoint(6, button.height() // 2))
    assert asked == ["Attach files"]
    settle(qtbot, window)


def drop(widget: Any, paths: list[Path]) -> bool:
    """Drag ``paths`` over ``widget`` and drop them, as a file manager does; True when the drop was taken."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    centre = QPointF(widget.rect().center())
    actions = Qt.DropAction.CopyAction
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(centre.toPoint(), actions, mime, buttons, keys)
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    dropped = QDropEvent(centre, actions, mime, buttons, keys)
    QApplication.sendEvent(widget, dropped)
    return dropped.isAccepted()


def attached_ids(window: MainWindow) -> list[str]:
    return [d["id"] for d in window.session.documents()]


def test_the_paperclip_attaches_files_before_the_first_message_and_every_request_carries_them(
    harness, qtbot, monkeypatch, files: Path
) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    assert window.composer.attach_button.isEnabled() and window.composer.attach_button.accessibleName()
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "handbook.md", files / "notes.txt"])
    chips = window.composer.chips
    assert chips.isVisible()
    words = {"handbook.md": len(HANDBOOK.split()), "notes.txt": len(NOTES.split())}
    # counted by the loaded model (the fake counts words); the chip's tooltip has the path
    assert chips.texts() == [f"{name} \u00b7 {n:,} tokens" for name, n in words.items()]
    assert chips.chips[0].toolTip().startswith(str(files / "handbook.md"))
    ids = attached_ids(window)
    assert len(ids) == 2 and window.session.conversation_id is None, "attached to the next new chat"
    # the meter counts them before a reply (the fake model's context length is not known: the count alone)
    assert window.composer.context.text() == f"Context: {sum(words.values()):,} tokens"

    window.composer.editor.setPlainText("When does the office open?")  # prefill while typing: with the documents
    qtbot.waitUntil(lambda: bool(fake(window).hints) and fake(window).hints[-1].documents == tuple(ids))
    cid = chat(qtbot, window, "When does the office open?")
    assert fake(window).requests[-1].documents == tuple(ids)
    kept = window.store.get_conversation(cid).documents
    assert [(d["name"], d["tokens"]) for d in kept] == list(words.items())
    chat(qtbot, window, "And when does it close?")
    assert fake(window).requests[-1].documents == tuple(ids), "every request of the chat carries them"

    window.new_chat()  # another chat has none
    assert not chips.isVisible() and chips.texts() == []
    chat(qtbot, window, "Hi")
    assert fake(window).requests[-1].documents == ()

    harness.close(window)  # a restart shows them again on their chat
    again = harness.open()
    again.open_conversation(cid)
    settle(qtbot, again)
    assert again.composer.chips.texts() == [f"{name} \u00b7 {n:,} tokens" for name, n in words.items()]


def test_a_dropped_folder_is_attached_and_a_chip_detaches(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    cid = chat(qtbot, window, "Hello")
    assert drop(window.chat_view.viewport(), [files])  # a folder: its files
    settle(qtbot, window)
    assert sorted(d["name"] for d in window.session.documents()) == ["handbook.md", "notes.txt"]
    assert window.store.get_conversation(cid).documents == window.session.documents()
    assert "Attached 2 documents" in window.composer.hint.text()

    assert drop(window.composer.editor.viewport(), [files / "handbook.md"])  # the composer takes drops too
    settle(qtbot, window)
    assert len(window.session.documents()) == 2 and window.composer.editor.toPlainText() == ""

    handbook = next(d for d in window.session.documents() if d["name"] == "handbook.md")
    chip = window.composer.chips.chip(handbook["id"])
    assert chip is not None
    qtbot.mouseClick(chip.close_button, Qt.MouseButton.LeftButton)
    assert [c.text().split(" \u00b7 ")[0] for c in window.composer.chips.chips] == ["notes.txt"]
    assert [d["name"] for d in window.store.get_conversation(cid).documents] == ["notes.txt"]
    chat(qtbot, window, "Again")
    assert handbook["id"] not in fake(window).requests[-1].documents
    assert len(fake(window).requests[-1].documents) == 1

    mime_text = QMimeData()  # a drag of plain text is the editor's, not an attachment
    mime_text.setText("just words")
    enter = QDragEnterEvent(
        QPoint(5, 5), Qt.DropAction.CopyAction, mime_text, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    QApplication.sendEvent(window.chat_view.viewport(), enter)
    assert not enter.isAccepted() and not window.documents.indexing


def test_files_that_cannot_be_read_are_each_named_and_the_others_attached(
    harness, qtbot, monkeypatch, files: Path
) -> None:  # noqa: ANN001
    (files / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (files / "latin1.txt").write_bytes("Café crème brûlée, à la française.\n".encode("cp1252"))
    window = harness.open()
    paths = [files / "blob.bin", files / "gone.md", files / "handbook.md", files / "latin1.txt"]
    attach_with_paperclip(qtbot, window, monkeypatch, paths)
    banner = window.banner("documents")
    assert banner is not None and banner.kind == "warning"
    text = banner.text()
    assert text.startswith("Some files could not be attached:")
    assert "blob.bin" in text and "binary" in text, "the library's own words for a binary file"
    assert "gone.md" in text and "does not exist" in text
    assert "The other 2 were attached." in text
    assert sorted(d["name"] for d in window.session.documents()) == ["handbook.md", "latin1.txt"]
    notes = window.banner("documents-notes")
    assert notes is not None and "latin1.txt is not UTF-8" in notes.text()
    cid = chat(qtbot, window, "Read them")
    assert len(fake(window).requests[-1].documents) == 2 and window.store.get_conversation(cid).documents


def notes_folder(tmp_path: Path, count: int) -> Path:
    """A folder of ``count`` short Markdown notes, ``note000.md`` on."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for n in range(count):
        write(folder, f"note{n:03}.md", f"Note {n}: something worth keeping, number {n}.\n")
    return folder


class GatedLibrary:
    """The real library, held before its fourth file until the test lets it go (or Cancel is pressed)."""

    def __init__(self) -> None:
        from tests.support.gui_harness import words_only_library

        self.real = words_only_library()
        self.store = self.real.store
        self.reached, self.gate = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def attach(self, paths: Any, progress: Any = None, cancel: Any = None) -> Any:
        def held(done: int, total: int, name: str) -> None:
            if progress is not None:
                progress(done, total, name)
            if done == 3 and name and "(" not in name:
                self.reached.set()
                while not self.gate.wait(0.01) and not (cancel is not None and cancel()):
                    pass

        return self.real.attach(paths, held, cancel)


def test_a_big_folder_reads_in_the_background_with_progress_and_cancel(harness, qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    folder = notes_folder(tmp_path, 300)
    library = GatedLibrary()
    window = harness.open(document_library=lambda: library)
    assert window.documents.attach([str(folder)])
    qtbot.waitUntil(library.reached.is_set, timeout=15_000)
    chips = window.composer.chips
    qtbot.waitUntil(lambda: "note003.md" in chips.progress_label.text())
    assert chips.progress_label.text() == "Reading note003.md\u2026 (file 4 of 300)"
    assert chips.isVisible() and chips.cancel_button.isEnabled()
    assert not window.documents.attach([str(folder)]), "one reading at a time"
    asked = len(fake(window).requests)
    type_and_send(qtbot, window, "Is everything in?")  # a Send now would go without the files: held, not lost
    assert len(fake(window).requests) == asked and "Still reading the files" in window.composer.hint.text()
    assert window.composer.editor.toPlainText() == "Is everything in?"
    qtbot.mouseClick(chips.cancel_button, Qt.MouseButton.LeftButton)
    settle(qtbot, window)
    assert not chips.progress_row.isVisible()
    assert [d["name"] for d in window.session.documents()] == ["note000.md", "note001.md", "note002.md"]
    assert window.composer.hint.text() == "Stopped reading files; 3 attached."
    assert window.banner("documents") is None, "a cancel is not a problem with a file"
    chat(qtbot, window, "Is everything in?")  # now it goes, with what was read
    assert len(fake(window).requests[-1].documents) == 3
    assert len(window.store.get_conversation(window.session.conversation_id or "").documents) == 3


def test_other_chats_stay_usable_while_files_are_read(harness, qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    folder = notes_folder(tmp_path, 20)
    library = GatedLibrary()
    window = harness.open(document_library=lambda: library)
    other = chat(qtbot, window, "An earlier chat")
    window.new_chat()
    assert window.documents.attach([str(folder)])
    qtbot.waitUntil(library.reached.is_set, timeout=15_000)
    window.open_conversation(other)
    chat(qtbot, window, "A reply while the folder is being read")
    assert fake(window).requests[-1].documents == ()
    library.gate.set()  # the files go on being read, for the new chat they were attached in
    settle(qtbot, window)
    assert window.store.get_conversation(other).documents == [], "they never join the chat that was open"
    assert window.banner("documents") is None and "to the new chat" in window.composer.hint.text()
    window.new_chat()  # they wait there, and go with its first message
    assert len(window.session.documents()) == 20
    chat(qtbot, window, "What do the notes say?")
    assert len(fake(window).requests[-1].documents) == 20


def test_a_reply_lists_its_sources_and_a_click_opens_the_passage(harness, qtbot, monkeypatch, files: Path) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "handbook.md", files / "notes.txt"])
    handbook, notes = window.session.documents()
    start = NOTES.index("Part 3")
    end = NOTES.index("\n", start)
    sources = (
        {"doc_id": handbook["id"], "name": "handbook.md", "path": handbook["path"], "chunk": -1, "start": 0,
         "end": len(HANDBOOK), "label": "handbook.md"},
        {"doc_id": notes["id"], "name": "notes.txt", "path": notes["path"], "chunk": 2, "start": start, "end": end,
         "label": "[1]"},
    )  # fmt: skip
    fake(window).metrics = Metrics(**{**METRICS.to_dict(), "document_tokens": 3012, "document_reused": 3012,
                                      "sources": sources})  # fmt: skip
    cid = chat(qtbot, window, "What was approved?")
    bubble = last_bubble(window)
    assert bubble.sources.text() == "Sources: handbook.md \u00b7 [1] notes.txt, part 3"
    window.latency.panel.flush()
    assert window.latency.panel.numbers.text("documents") == "3,012 tokens reused"

    view = window.chat_view
    reply_id = bubble.message_id
    rect = view.source_rect(reply_id, 1)
    assert not rect.isEmpty() and view.viewport().rect().contains(rect.center())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    dialog = window.documents.passage
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.passage != "")
    assert dialog.passage == "Part 3: the budget line 3 was approved."
    shown = dialog.text.toPlainText()  # among the text around it, highlighted
    assert shown.startswith("Meeting notes.") and "Part 2:" in shown and "Part 4:" in shown
    (mark,) = dialog.text.extraSelections()
    assert mark.cursor.selectedText() == dialog.passage
    assert "notes.txt, part 3" in dialog.windowTitle()
    assert dialog.where.text().startswith(f"Characters {start:,}\u2013{end:,} of {len(NOTES):,}")
    assert dialog.open_button.isEnabled() and dialog.path_label.text() == str(files / "notes.txt")
    dialog.close()

    harness.close(window)  # the reply's stored metrics keep its sources across a restart
    again = harness.open(size=(1100, 740))
    again.open_conversation(cid)
    old = last_bubble(again)
    assert old.sources.text() == "Sources: handbook.md \u00b7 [1] notes.txt, part 3"
    again.documents.show_source(old.message_id, 0)  # the whole document
    shown = again.documents.passage
    assert shown is not None
    qtbot.waitUntil(lambda: shown.passage != "")
    assert shown.passage == HANDBOOK and shown.text.toPlainText() == HANDBOOK
    menu = again.chat_view.context_menu(old.message_id)  # and for the keyboard, in the reply's menu
    assert [a.text() for a in menu.actions() if a.text().startswith("Source:")] == [
        "Source: handbook.md",
        "Source: [1] notes.txt, part 3",
    ]


def test_the_panel_says_whether_the_documents_were_computed(harness, qtbot) -> None:  # noqa: ANN001
    from app.panels.numbers import row_texts

    assert row_texts({"document_tokens": 3012, "document_reused": 0})["documents"] == "3,012 tokens computed"
    assert row_texts({"document_tokens": 3012, "document_reused": 2000})["documents"] == (
        "2,000 reused \u00b7 1,012 computed of 3,012 tokens"
    )
    assert row_texts({"prompt_tokens": 10})["documents"] == "\u2014"


def fake_kv_file(data_dir: Path, doc_id: str, size: int = 4096) -> Path:
    """A document KV file as the engine names it (a safetensors header listing the documents it holds)."""
    folder = data_dir / "cache" / "kv" / "documents-0123456789abcdef"
    folder.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"__metadata__": {"documents": json.dumps([doc_id])}}).encode()
    path = folder / "aaaa.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * size)
    return path


def test_the_documents_view_lists_and_removes_with_the_kv(
    harness, qtbot, monkeypatch, files: Path, brisk_data_dir: Path
) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "handbook.md", files / "notes.txt"])
    cid = chat(qtbot, window, "Keep these")
    handbook = window.session.documents()[0]
    kv = fake_kv_file(brisk_data_dir, handbook["id"])
    next(a for a in window.actions() if a.text() == "Documents\u2026").trigger()
    dialog = window.documents.dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: len(dialog.rows) == 2)
    table = dialog.table
    assert [table.item(r, 0).text() for r in range(2)] == ["handbook.md", "notes.txt"]
    assert table.item(0, 1).text() == "Keep these", "the chats it is attached to"
    assert table.item(0, 5).text() != "none yet" and table.item(1, 5).text() == "none yet", "KV on disk"
    assert table.item(0, 7).text() == str(files / "handbook.md")
    assert f"{len(HANDBOOK.split())} tokens" in table.item(0, 3).text()

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    assert dialog.select(handbook["id"])
    qtbot.mouseClick(dialog.remove_button, Qt.MouseButton.LeftButton)
    settle(qtbot, window)
    assert [r["name"] for r in dialog.rows] == ["notes.txt"]
    assert not kv.exists(), "its KV went with it"
    assert "Removed handbook.md" in dialog.status.text()
    chip = window.composer.chips.chip(handbook["id"])
    assert chip is not None and chip.text() == "handbook.md \u00b7 removed from the index"
    assert chip.objectName() == "docChipGone"
    chat(qtbot, window, "And now?")
    assert handbook["id"] not in fake(window).requests[-1].documents, "a removed document is no longer sent"
    assert len(fake(window).requests[-1].documents) == 1
    assert [d["name"] for d in window.store.get_conversation(cid).documents] == ["handbook.md", "notes.txt"]

    harness.close(window)  # after a restart the chat still says so (found when the chat is checked)
    again = harness.open()
    again.open_conversation(cid)
    settle(qtbot, again)
    assert again.composer.chips.texts()[0] == "handbook.md \u00b7 removed from the index"


def test_a_file_changed_on_disk_is_read_again_when_its_chat_opens(harness, qtbot, monkeypatch, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "handbook.md"])
    cid = chat(qtbot, window, "Open hours?")
    old = attached_ids(window)[0]
    write(files, "handbook.md", HANDBOOK + "\nThe office is closed on Sundays.\n")
    window.new_chat()
    window.open_conversation(cid)
    settle(qtbot, window)
    new = attached_ids(window)
    assert len(new) == 1 and new[0] != old, "the changed text is a new document"
    chat(qtbot, window, "And Sundays?")
    assert fake(window).requests[-1].documents == (new[0],)


def test_a_remote_engine_greys_the_paperclip(harness) -> None:  # noqa: ANN001
    servers = [{"name": "lab", "base_url": "http://127.0.0.1:9/v1", "model": "m"}]
    window = harness.open(settings=Settings(servers=servers, engine="lab"), load=False)
    button = window.composer.attach_button
    assert not button.isEnabled() and "does not read attached documents" in button.toolTip()
    assert not window.attach_action.isEnabled()
    window.apply_settings(Settings(servers=servers, engine="local"))
    assert button.isEnabled() and window.attach_action.isEnabled()


def test_an_older_history_file_opens_and_its_chats_have_no_documents(harness, qtbot, brisk_data_dir: Path) -> None:  # noqa: ANN001
    db = sqlite_utils.Database(brisk_data_dir / "brisk.db")  # a history file of schema 3, before documents
    for migration in store_module.MIGRATIONS[:3]:
        migration(db)
    db.execute("PRAGMA user_version = 3")
    db.execute(
        "INSERT INTO conversations (id, title, system_prompt, created, updated, params) "
        "VALUES ('old', 'From before', '', 1, 1, '{}')"
    )
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('old', 'user', 'Hello', 1)")
    db.close()
    window = harness.open()
    assert window.session.conversation_id == "old"
    assert window.session.documents() == [] and not window.composer.chips.isVisible()
    chat(qtbot, window, "Still works")
    assert fake(window).requests[-1].documents == ()
    raw = sqlite3.connect(brisk_data_dir / "brisk.db")
    assert raw.execute("PRAGMA user_version").fetchone() == (store_module.SCHEMA_VERSION,)
    assert raw.execute("SELECT documents FROM conversations WHERE id = 'old'").fetchone() == ("[]",)
    raw.execute("UPDATE conversations SET documents = '{not json' WHERE id = 'old'")  # damaged: none attached
    raw.commit()
    raw.close()
    with Store(brisk_data_dir / "brisk.db") as store:
        assert store.get_conversation("old").documents == []


def test_many_documents_fold_into_one_more_button(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(load=False)
    chips = window.composer.chips
    docs = [{"id": f"{n:064x}", "name": f"note{n:02}.md", "path": "", "chars": 400, "tokens": None} for n in range(20)]
    chips.set_documents(docs)
    assert len(chips.chips) == 8 and chips.more_button.text() == "+12 more"
    assert chips.texts()[0] == "note00.md \u00b7 \u2248 100 tokens", "an estimate until a model counts them"
    qtbot.mouseClick(chips.more_button, Qt.MouseButton.LeftButton)
    assert len(chips.chips) == 20 and chips.more_button.text() == "Show fewer"
    assert chips.chips[-1].geometry().bottom() <= chips.flow_host.height(), "every chip has room"


def test_re_index_reads_a_changed_file_for_every_chat_holding_it(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    first = chat(qtbot, window, "First")
    assert drop(window.composer, [files / "handbook.md"])
    settle(qtbot, window)
    window.new_chat()
    second = chat(qtbot, window, "Second")
    assert drop(window.composer, [files / "handbook.md"])
    settle(qtbot, window)
    old = attached_ids(window)[0]
    assert [d["id"] for d in window.store.get_conversation(first).documents] == [old], "one document, two chats"
    write(files, "handbook.md", HANDBOOK + "\nNew: the office is closed on Sundays.\n")
    dialog = window.documents.open_view()
    qtbot.waitUntil(lambda: len(dialog.rows) == 1)
    assert dialog.table.item(0, 1).text() == "Second + 1 more", "the chats holding it, latest first"
    assert dialog.select(old)
    qtbot.mouseClick(dialog.reindex_button, Qt.MouseButton.LeftButton)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: bool(dialog.rows) and dialog.rows[0]["id"] != old)
    new = dialog.rows[0]["id"]
    assert "changed on disk" in dialog.status.text()
    for cid in (first, second):
        assert [d["id"] for d in window.store.get_conversation(cid).documents] == [new]
    assert window.composer.chips.texts() == [f"handbook.md \u00b7 {len(HANDBOOK.split()) + 7} tokens"]
    chat(qtbot, window, "Sundays?")
    assert fake(window).requests[-1].documents == (new,)


def test_progress_says_which_file_and_page() -> None:
    from app.state.attachments import progress_text

    assert progress_text(0, 1, "report.pdf (12 of 40)") == "Reading report.pdf (12 of 40 pages)\u2026"
    assert progress_text(2, 10, "notes.txt (1 of 1)") == "Reading notes.txt\u2026 (file 3 of 10)"
    assert progress_text(0, 0, "") == "Looking for files\u2026"


def test_a_document_too_long_for_the_context_says_it_is_searched(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    fake(window).load_info |= {"context_length": 1024}  # a model with a short context, loaded again
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        window.load_model()
    big = write(files, "big.md", " ".join(f"word{n}" for n in range(900)))
    assert window.documents.attach([str(files / "handbook.md"), str(big)])
    settle(qtbot, window)
    budget = int((1024 - min(Settings().max_tokens, 512)) * 0.75)  # the engine's share for whole documents
    assert budget < 900, "the test's document must not fit"
    handbook = len(HANDBOOK.split())
    assert window.composer.chips.texts() == [
        f"handbook.md \u00b7 {handbook} tokens",
        "big.md \u00b7 900 tokens \u00b7 searched",
    ]
    assert "passages that match it" in window.composer.chips.chips[1].toolTip()
    assert window.composer.context.text().startswith(f"Context: {handbook} of 1,024 tokens"), "only what goes whole"


def test_compare_replays_a_message_with_the_chats_documents(harness, qtbot, monkeypatch, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "handbook.md"])
    ids = tuple(attached_ids(window))
    chat(qtbot, window, "When does the office open?")
    dialog = window.latency.compare_message()
    assert dialog is not None and dialog.documents == ids
    before = len(fake(window).requests)
    with qtbot.waitSignal(dialog.finished_run, timeout=10_000):
        dialog.run_button.click()
    replayed = fake(window).requests[before:]
    assert replayed and all(r.documents == ids for r in replayed), "each replay reads what the reply read"


def test_a_pdf_passage_is_listed_and_shown_with_its_page(harness, qtbot, monkeypatch, files: Path) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    attach_with_paperclip(qtbot, window, monkeypatch, [files / "notes.txt"])
    (notes,) = window.session.documents()
    start = NOTES.index("Part 3")
    end = NOTES.index("\n", start)
    sources = ({"doc_id": notes["id"], "name": "notes.txt", "path": notes["path"], "chunk": 2, "start": start,
                "end": end, "label": "[1]", "page": 12, "last_page": 13},)  # fmt: skip
    fake(window).metrics = Metrics(**{**METRICS.to_dict(), "document_tokens": 40, "sources": sources})
    chat(qtbot, window, "What was approved?")
    bubble = last_bubble(window)
    assert bubble.sources.text() == "Sources: [1] notes.txt, pages 12-13"
    rect = window.chat_view.source_rect(bubble.message_id, 0)
    qtbot.mouseClick(window.chat_view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    dialog = window.documents.passage
    assert dialog is not None
    qtbot.waitUntil(lambda: dialog.passage != "")
    assert "notes.txt, pages 12-13" in dialog.windowTitle()
    assert dialog.where.text().startswith(f"Pages 12-13, characters {start:,}\u2013{end:,} of {len(NOTES):,}")
    dialog.close()


def test_files_dropped_anywhere_on_the_window_are_attached(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open()
    chat(qtbot, window, "Hello")
    assert drop(window.sidebar, [files / "handbook.md"])  # the chat list, not only the chat and the composer
    settle(qtbot, window)
    assert [d["name"] for d in window.session.documents()] == ["handbook.md"]
    assert drop(window.statusBar(), [files / "notes.txt"])
    settle(qtbot, window)
    assert sorted(d["name"] for d in window.session.documents()) == ["handbook.md", "notes.txt"]
    system = window.parameters.panel.system_edit  # an editor of its own: the files go to the chat, not into it
    before = system.toPlainText()
    window.documents.detach(next(d["id"] for d in window.session.documents() if d["name"] == "handbook.md"))
    assert drop(system.viewport(), [files / "handbook.md"])
    settle(qtbot, window)
    assert system.toPlainText() == before
    assert sorted(d["name"] for d in window.session.documents()) == ["handbook.md", "notes.txt"]


def test_a_source_whose_text_was_replaced_or_removed_says_which(harness, qtbot, files: Path) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    assert drop(window.composer, [files / "notes.txt"])
    settle(qtbot, window)
    (notes,) = window.session.documents()
    start = NOTES.index("Part 3")
    sources = ({"doc_id": notes["id"], "name": "notes.txt", "path": notes["path"], "chunk": 2, "start": start,
                "end": start + 10, "label": "[1]"},)  # fmt: skip
    fake(window).metrics = Metrics(**{**METRICS.to_dict(), "document_tokens": 40, "sources": sources})
    chat(qtbot, window, "What was approved?")
    reply = last_bubble(window).message_id

    def opened() -> str:
        dialog = window.documents.show_source(reply, 0)
        assert dialog is not None
        qtbot.waitUntil(lambda: window.documents.pending == 0)
        return dialog.where.text()

    write(files, "notes.txt", NOTES + "\nPart 9: a late addition.\n")  # the file changed; Re-index reads it again
    window.documents.reindex(notes["id"])
    settle(qtbot, window)
    assert attached_ids(window) != [notes["id"]]
    said = opened()
    assert said.startswith("notes.txt changed on disk after this reply and was read again"), said
    window.documents.remove(attached_ids(window)[0], confirm=False)  # now the file's text is gone altogether
    settle(qtbot, window)
    said = opened()
    assert said.startswith("notes.txt is no longer in the document index (it was removed)"), said
