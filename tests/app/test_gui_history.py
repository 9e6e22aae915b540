"""GUI: conversations in the sidebar: restart, order, open, title, rename, delete, search, export;
a 10,000-message conversation opens fast without a widget per message."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit, QMessageBox, QSplitter
from pytestqt.qtbot import QtBot

from app.state.session import make_title
from app.window import MainWindow
from engine.api import Done
from engine.storage import Conversation, SearchHit, Store
from tests.support.gui_harness import FULL_REPLY, FULL_STATS, Harness, chat, send_and_hold, widget_count

# -- history --------------------------------------------------------------------------------


def test_restart_finds_the_conversation(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Remember the pelicans")
    harness.close(window)

    again = harness.open()
    assert again.sidebar.model.ids() == [conversation_id]
    assert again.sidebar.model.titles() == ["Remember the pelicans"]
    assert again.session.conversation_id == conversation_id
    bubbles = again.chat_view.bubbles()
    assert [(b.role, b.plain_text) for b in bubbles] == [("user", "Remember the pelicans"), ("assistant", FULL_REPLY)]
    assert bubbles[1].stats.text() == FULL_STATS
    assert again.windowTitle().startswith("Remember the pelicans")


def test_sidebar_lists_most_recent_first(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    first = chat(qtbot, window, "First topic")
    window.sidebar.new_button.click()
    assert window.session.conversation_id is None
    assert window.chat_view.bubbles() == []
    second = chat(qtbot, window, "Second topic")
    assert second != first
    assert window.sidebar.model.ids() == [second, first]

    window.open_conversation(first)
    assert [b.plain_text for b in window.chat_view.bubbles()][0] == "First topic"
    chat(qtbot, window, "More on the first")
    assert window.sidebar.model.ids() == [first, second]
    assert [c.id for c in window.store.list_conversations()] == [first, second]


def test_clicking_a_conversation_opens_it(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    first = chat(qtbot, window, "Alpha")
    window.new_chat()
    chat(qtbot, window, "Beta")
    view = window.sidebar.list_view
    row = window.sidebar.model.row_of(first)
    assert row is not None
    rect = view.visualRect(window.sidebar.model.index(row))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert window.session.conversation_id == first
    assert window.chat_view.bubbles()[0].plain_text == "Alpha"


def test_first_message_titles_the_conversation() -> None:
    assert make_title("  Plan a   trip\nto Lisbon ") == "Plan a trip to Lisbon"
    long = make_title("Explain how speculative decoding keeps the output distribution exact")
    assert long.endswith("\u2026")
    assert len(long) <= 41
    assert long.startswith("Explain how speculative decoding")


def test_rename_in_place(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Something long about Lisbon")
    view = window.sidebar.list_view
    assert view.editTriggers() & view.EditTrigger.DoubleClicked
    window.sidebar.rename(conversation_id)
    editor = view.findChild(QLineEdit)
    assert editor is not None
    editor.setText("Lisbon trip")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.store.get_conversation(conversation_id).title == "Lisbon trip")
    assert window.sidebar.model.titles() == ["Lisbon trip"]
    assert window.windowTitle().startswith("Lisbon trip")


def test_delete_asks_first(qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    window = harness.open()
    keep = chat(qtbot, window, "Keep me")
    window.new_chat()
    drop = chat(qtbot, window, "Drop me")

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    assert not window.delete_conversation(drop)
    assert {c.id for c in window.store.list_conversations()} == {keep, drop}

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    assert window.delete_conversation(drop)
    assert [c.id for c in window.store.list_conversations()] == [keep]
    assert window.sidebar.model.ids() == [keep]
    assert window.session.conversation_id is None
    assert window.chat_view.bubbles() == []


def test_deleting_a_streaming_conversation(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = send_and_hold(qtbot, window, "Doomed")
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        assert window.delete_conversation(conversation_id, confirm=False)
    assert window.store.list_conversations() == []
    assert window.session.active is None and window.composer.button.text() == "Send"
    assert window.banner("store-error") is None
    assert engine.cancelled == [engine.requests[0].id]


def test_search_opens_the_hit(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    pelicans = chat(qtbot, window, "Tell me about pelicans")
    window.new_chat()
    volcanoes = chat(qtbot, window, "How do volcanoes erupt")
    window.open_conversation(pelicans)

    window.sidebar.search_box.setText("volcano")
    results = window.sidebar.results
    qtbot.waitUntil(lambda: results.count() > 0 and results.isVisible())
    texts = [results.item(i).text() for i in range(results.count())]
    assert all("volcanoes" in text.lower() for text in texts)
    assert not any("pelican" in text.lower() for text in texts)
    item = results.item(0)
    qtbot.mouseClick(results.viewport(), Qt.MouseButton.LeftButton, pos=results.visualItemRect(item).center())
    assert window.session.conversation_id == volcanoes
    assert window.chat_view.bubbles()[0].plain_text == "How do volcanoes erupt"

    window.sidebar.search_box.setText("zebra")
    qtbot.waitUntil(lambda: window.sidebar.no_results.isVisible())
    assert results.count() == 0
    window.sidebar.search_box.clear()
    assert window.sidebar.list_view.isVisible()


def test_export_markdown(qtbot: QtBot, harness: Harness, tmp_path: Path) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Export this")
    target = tmp_path / "out" / "chat.md"
    target.parent.mkdir()
    assert window.export_markdown(conversation_id, target) == target
    text = target.read_text(encoding="utf-8")
    assert text == window.store.export_markdown(conversation_id)
    assert text.startswith("# Export this")
    assert "Export this" in text.split("\n", 1)[1] and FULL_REPLY in text

    assert window.export_markdown(conversation_id, tmp_path / "missing" / "x.md") is None
    banner = window.banner("export")
    assert banner is not None and "Could not write" in banner.text()


def test_sidebar_never_scrolls_sideways_and_elides_long_titles(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    sidebar, view = window.sidebar, window.sidebar.list_view
    long_title = "A conversation title far too long to fit in the sidebar, however wide it is dragged"
    now = 1_700_000_000.0
    sidebar.set_conversations([Conversation("short", "Short", "", now, now)])
    # a longer title arriving by rename and moving to the top is what once made the list scroll sideways
    sidebar.upsert(Conversation("short", long_title, "", now, now + 1), to_top=True)
    sidebar.upsert(Conversation("other", "Other", "", now, now + 2), to_top=True)

    def fits() -> bool:
        rect = view.visualRect(sidebar.model.index(sidebar.model.row_of("short") or 0))
        return rect.right() < view.viewport().width() and view.horizontalScrollBar().maximum() == 0

    splitter = window.centralWidget()
    assert isinstance(splitter, QSplitter)
    for width in (240, 190, 320, 200):
        splitter.setSizes([width, 900 - width])
        qtbot.waitUntil(fits)
        assert not view.horizontalScrollBar().isVisible()
        rect = view.visualRect(sidebar.model.index(sidebar.model.row_of("short") or 0))
        shown = view.fontMetrics().elidedText(long_title, view.textElideMode(), rect.width())
        assert shown.endswith("\u2026") and shown != long_title
    index = sidebar.model.index(sidebar.model.row_of("short") or 0)
    assert long_title in sidebar.model.data(index, Qt.ItemDataRole.ToolTipRole)

    snippet = "an_unbreakable_identifier_that_is_much_wider_than_any_sidebar_could_ever_be_dragged"
    sidebar.show_results([SearchHit("short", 1, long_title, snippet)])
    results = sidebar.results
    qtbot.waitUntil(lambda: results.isVisible())
    qtbot.waitUntil(lambda: results.horizontalScrollBar().maximum() == 0)
    assert not results.horizontalScrollBar().isVisible()
    assert results.visualRect(results.model().index(0, 0)).right() < results.viewport().width()


# -- at scale ---------------------------------------------------------------------------------------


def _write_long_conversation(db_path: Path, count: int) -> str:
    """``count`` messages in one conversation of a real history file (one transaction, for speed)."""
    store = Store(db_path)
    conversation_id = store.create_conversation("Long")
    store.close()
    metrics = json.dumps({"ttft_s": 0.2, "tokens_per_s": 30.0, "completion_tokens": 40})
    rows = [
        (conversation_id, "user", f"Question {i}", "done", "{}", float(i))
        if i % 2 == 0
        else (conversation_id, "assistant", f"Answer {i}:\n\n```py\nx = {i}\n```\nDone **{i}**.", "done", metrics, i)
        for i in range(count)
    ]
    with sqlite3.connect(db_path) as db:
        db.executemany(
            "INSERT INTO messages (conversation_id, role, content, status, metrics, created) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    return conversation_id


def test_ten_thousand_messages_open_lazily_without_a_widget_each(qtbot: QtBot, harness: Harness) -> None:
    long_id = _write_long_conversation(harness.db_path, 10_000)
    window = harness.open(load=False)
    short_id = chat_free_conversation(window)
    window.open_conversation(short_id)
    widgets_before = widget_count(window)
    view = window.chat_view
    bar = view.verticalScrollBar()

    for attempt in ("open", "reopen"):
        start = time.perf_counter()
        window.open_conversation(long_id)
        view.viewport().repaint()
        qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
        elapsed = time.perf_counter() - start
        print(f"\n{attempt}: {elapsed:.2f} s for 10,000 messages")  # timed by app.bench_chat_view
        rows = view.chat_model.rows
        exact = sum(1 for item in rows if item.content_size is not None and item.content_size[4])
        assert exact <= 200, f"{attempt}: {exact} of 10,000 rows laid out exactly: measuring is not lazy"
        assert widget_count(window) < widgets_before + 20, "the chat view builds widgets per message"
        handles = view.bubbles()
        assert len(handles) == 10_000
        assert (handles[-1].role, handles[-1].plain_text) == (
            "assistant",
            "Answer 9999:\n\n```py\nx = 9999\n```\nDone **9999**.",
        )
        assert "30.0 tok/s" in handles[-1].stats.text()
        # the last message is on screen, whole, and the list ends right under it
        last = view.row_layout(handles[-1].message_id)
        assert last is not None
        viewport = view.viewport().rect()
        assert viewport.contains(last.bubble), f"last bubble {last.bubble} not within {viewport}"
        assert viewport.bottom() - last.bubble.bottom() <= 40
        window.open_conversation(short_id)
    assert widget_count(window) < widgets_before + 20


def chat_free_conversation(window: MainWindow) -> str:
    """A small conversation written through the store (no model needed); returns its id."""
    conversation_id = window.store.create_conversation("Short")
    window.store.add_message(conversation_id, "user", "Hi")
    window.store.add_message(conversation_id, "assistant", "Hello.")
    return conversation_id
