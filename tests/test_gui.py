"""GUI tests: the real window, widgets and store, driven by a scripted fake engine.

The fake engine emits its events from a real background thread, so these tests
also cover the thread hop through the bridge.  They wait on signals and
conditions (``qtbot.waitSignal`` / ``waitUntil``), never on fixed sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engine import METRICS, FakeEngine, FakeSpec
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox, QSplitter
from pytestqt.qtbot import QtBot

from app import about_dialog
from app.about_dialog import NO_MODEL, AboutDialog
from app.bridge import EngineBridge
from app.chat_view import TRUNCATED_NOTICE
from app.composer import EMPTY_HINT
from app.launch import open_store
from app.main_window import MainWindow
from app.markdown_render import CODE_BG, DRAFT_COLOUR, render_reply
from app.message_widget import MessageWidget
from app.reply import stats_line
from app.session import make_title
from app.settings_dialog import SettingsDialog
from engine.api import Done, Loaded, LoadFailed, Warning
from engine.storage import Conversation, Message, SearchHit, Settings, Store, StoreError

FULL_REPLY = "Hello there, friend."
FULL_STATS = " \u00b7 ".join(
    [
        "TTFT 0.21 s",
        "38.2 tok/s",
        "5 tokens",
        "reused 1180 of 1200 prompt tokens",
        "accepted 3 of 4 drafted (75 %)",
        "1.8\u00d7 plain decode",
    ]
)


class Harness:
    """Opens MainWindows on a store in the test's data folder, each with its own FakeEngine."""

    def __init__(self, qtbot: QtBot, data_dir: Path) -> None:
        self.qtbot = qtbot
        self.db_path = data_dir / "brisk.db"
        self._open: list[tuple[MainWindow, EngineBridge, Store]] = []

    def open(
        self,
        *,
        store: Store | None = None,
        store_warning: str | None = None,
        load_error: str | None = None,
        settings: Settings | None = None,
        load: bool = True,
    ) -> MainWindow:
        store = store or Store(self.db_path)
        bridge = EngineBridge(lambda on_event: FakeEngine(on_event, load_error=load_error), FakeSpec)
        window = MainWindow(store, bridge, settings or Settings(), store_warning=store_warning)
        self.qtbot.addWidget(window)
        window.resize(900, 640)
        window.show()
        self._open.append((window, bridge, store))
        if load:
            with self.qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed)):
                window.load_model()
        return window

    def close(self, window: MainWindow) -> None:
        for entry in list(self._open):
            if entry[0] is window:
                self._open.remove(entry)
                window.close()
                entry[1].shutdown()
                entry[2].close()

    def close_all(self) -> None:
        for window, *_ in list(self._open):
            self.close(window)


@pytest.fixture
def harness(qtbot: QtBot, brisk_data_dir: Path) -> Iterator[Harness]:
    h = Harness(qtbot, brisk_data_dir)
    yield h
    h.close_all()


def fake(window: MainWindow) -> FakeEngine:
    engine = window.bridge.engine
    assert isinstance(engine, FakeEngine)
    return engine


def type_and_send(qtbot: QtBot, window: MainWindow, text: str) -> None:
    window.composer.editor.setPlainText(text)
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)


def send_and_hold(qtbot: QtBot, window: MainWindow, text: str) -> FakeEngine:
    """Send ``text`` and wait until the fake engine holds the reply after two tokens."""
    engine = fake(window)
    engine.hold_after = 2
    type_and_send(qtbot, window, text)
    qtbot.waitUntil(engine.held.is_set)
    return engine


def chat(qtbot: QtBot, window: MainWindow, text: str) -> str:
    """Send ``text``, wait for the reply to finish; return the conversation id."""
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        type_and_send(qtbot, window, text)
    qtbot.waitUntil(lambda: window.session.active is None)
    assert window.session.conversation_id is not None
    return window.session.conversation_id


def stored(window: MainWindow, conversation_id: str) -> list[Message]:
    return window.store.messages(conversation_id)


def last_bubble(window: MainWindow) -> MessageWidget:
    return window.chat_view.bubbles()[-1]


# -- streaming, Enter/Esc ------------------------------------------------------------------


def test_tokens_appear_before_done(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.hold_after = 2
    qtbot.keyClicks(window.composer.editor, "Hi there")
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(engine.held.is_set)
    reply = window.session.active
    assert reply is not None
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None
    qtbot.waitUntil(lambda: bubble.plain_text == "Hello there")
    qtbot.waitUntil(lambda: bubble.stats.text().startswith("TTFT "))
    assert "friend" not in bubble.content.text()
    assert window.composer.button.text() == "Stop"
    assert window.composer.editor.toPlainText() == ""
    [user, assistant] = stored(window, reply.conversation_id)
    assert (user.role, user.content) == ("user", "Hi there")
    assert assistant.status == "streaming"

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    assert bubble.plain_text == FULL_REPLY
    assert bubble.stats.text() == FULL_STATS
    assert window.composer.button.text() == "Send"
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == (FULL_REPLY, "done")
    assert assistant.metrics["cached_tokens"] == 1180
    request = engine.requests[0]
    assert request.messages == (
        {"role": "system", "content": Settings().system_prompt},
        {"role": "user", "content": "Hi there"},
    )
    assert request.conversation_id == reply.conversation_id
    assert request.prefix_cache is True


def test_enter_sends_shift_enter_adds_line_whitespace_is_not_sent(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    editor = window.composer.editor
    qtbot.keyClicks(editor, "line one")
    qtbot.keyClick(editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(editor, "line two")
    assert editor.toPlainText() == "line one\nline two"
    assert engine.requests == []

    saved = editor.toPlainText()
    editor.setPlainText("   \n\t  ")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    window.composer.button.click()
    assert engine.requests == []
    assert window.composer.hint.isVisible()
    assert window.composer.hint.text() == EMPTY_HINT
    assert editor.toPlainText() == "   \n\t  "  # nothing lost

    editor.setPlainText(saved)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(engine.requests) == 1)
    assert engine.requests[0].messages[-1] == {"role": "user", "content": "line one\nline two"}
    assert editor.toPlainText() == ""
    qtbot.waitUntil(lambda: window.session.active is None)


def test_typing_works_before_the_model_loads_but_send_waits(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open(load=False)
    button = window.composer.button
    assert not button.isEnabled()
    assert "loading" in button.toolTip().lower()
    qtbot.keyClicks(window.composer.editor, "early bird")
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    assert window.composer.editor.toPlainText() == "early bird"
    assert "loading" in window.composer.hint.text().lower()
    assert window.store.list_conversations() == []

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()
    assert button.isEnabled()
    assert window.status_area.model_label.text() == "fake-model"
    assert not window.status_area.progress.isVisible()
    chat(qtbot, window, window.composer.text())
    assert fake(window).requests[0].messages[-1]["content"] == "early bird"


def test_escape_stops_and_keeps_the_partial_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = send_and_hold(qtbot, window, "Tell me a story")
    reply = window.session.active
    assert reply is not None
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None
    qtbot.waitUntil(lambda: bubble.plain_text == "Hello there")

    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Escape)
    assert window.session.active is None
    assert window.composer.button.text() == "Send"
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Hello there", "cancelled")
    assert bubble.plain_text == "Hello there"
    assert bubble.stats.text().endswith("stopped")
    qtbot.waitUntil(lambda: engine.cancelled == [reply.request_id])
    # the engine's own Done(cancelled) adds its metrics to the stopped reply, not its text
    qtbot.waitUntil(lambda: "reused 1180 of 1200" in bubble.stats.text())
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Hello there", "cancelled")
    assert assistant.metrics["cached_tokens"] == 1180


def test_stop_button_toggles(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.hold_after = 1
    type_and_send(qtbot, window, "Go")
    qtbot.waitUntil(engine.held.is_set)
    assert window.composer.button.text() == "Stop"
    window.composer.button.click()
    assert window.composer.button.text() == "Send"
    qtbot.waitUntil(lambda: len(engine.cancelled) == 1)
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assert stored(window, conversation_id)[1].status == "cancelled"


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


# -- regenerate, edit, copy ------------------------------------------------------------------------


def test_regenerate_resubmits_the_same_history(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    conversation_id = chat(qtbot, window, "Hi")
    first = engine.requests[0]
    engine.tokens = ["Another", " answer"]
    button = last_bubble(window).regenerate_button
    assert button is not None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert len(engine.requests) == 2
    assert engine.requests[1].messages == first.messages
    assert engine.requests[1].id != first.id
    messages = stored(window, conversation_id)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "Hi", "done"),
        ("assistant", "Another answer", "done"),
    ]
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Hi", "Another answer"]


def test_edit_an_earlier_message_truncates_and_reasks(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    conversation_id = chat(qtbot, window, "Hi")
    chat(qtbot, window, "Second question")
    first_user = stored(window, conversation_id)[0]
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        assert window.edit_message(first_user.id, "Hello again")
    assert engine.requests[-1].messages[1:] == ({"role": "user", "content": "Hello again"},)
    assert [(m.role, m.content) for m in stored(window, conversation_id)] == [
        ("user", "Hello again"),
        ("assistant", FULL_REPLY),
    ]
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Hello again", FULL_REPLY]


def test_copy_puts_the_reply_on_the_clipboard(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    chat(qtbot, window, "Hi")
    QApplication.clipboard().setText("something else")
    qtbot.mouseClick(last_bubble(window).copy_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == FULL_REPLY


# -- notices and errors ------------------------------------------------------------------------------


def test_truncated_prompt_shows_a_notice(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).truncated = True
    chat(qtbot, window, "Hi")
    notice = last_bubble(window).notice
    assert notice.isVisible() and notice.text() == TRUNCATED_NOTICE


def test_engine_error_is_shown_and_partial_text_kept(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.fail_with = "The model failed while generating: out of memory. Try a shorter prompt."
    engine.tokens = ["Par", "tial"]
    type_and_send(qtbot, window, "Hi")
    qtbot.waitUntil(lambda: window.session.active is None)
    bubble = last_bubble(window)
    assert bubble.error.isVisible() and "out of memory" in bubble.error.text()
    assert bubble.plain_text == "Partial"
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assistant = stored(window, conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Partial", "error")
    assert "out of memory" in assistant.metrics["error"]
    assert window.composer.button.text() == "Send"


def test_load_failure_is_shown_and_another_model_can_be_picked(qtbot: QtBot, harness: Harness) -> None:
    message = "No model at /nope: the folder does not exist. Pick a model folder or a .gguf file."
    window = harness.open(load_error=message)
    banner = window.banner("load")
    assert banner is not None and message in banner.text()
    assert banner.action is not None and "Settings" in banner.action.text()
    assert message in window.status_area.message_label.text()
    assert not window.composer.button.isEnabled()
    assert "settings" in window.composer.button.toolTip().lower()

    engine = fake(window)
    engine.load_error = None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, model="/models/good"))
    assert engine.loads[-1] == FakeSpec(source="/models/good", device="auto", dtype="auto", quant="none")
    assert window.banner("load") is None
    assert window.composer.button.isEnabled()
    assert window.status_area.model_label.text() == "/models/good"


def test_draft_model_failure_is_a_warning_and_the_model_stays_usable(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.draft_error = "No model at /models/draft: the folder does not exist."
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Warning)):
        window.apply_settings(replace(window.settings, draft_model="/models/draft"))
    assert engine.loads[-1].draft == "/models/draft"
    warning = window.banner("draft")
    assert warning is not None and warning.kind == "warning"
    assert "Draft model not used" in warning.text() and "/models/draft" in warning.text()
    assert window.banner("load") is None
    assert window.model_ready and window.composer.button.isEnabled()
    assert "Loading failed" not in window.status_area.message_label.text()
    chat(qtbot, window, "Still works")
    assert last_bubble(window).plain_text == FULL_REPLY

    engine.draft_error = None  # a later load that works clears the warning
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, draft_model="/models/good-draft"))
    assert window.banner("draft") is None


def test_history_seeds_the_engine_answer_memory(qtbot: QtBot, harness: Harness) -> None:
    store = Store(harness.db_path)
    older = store.create_conversation("Older")
    store.add_message(older, "user", "What is a lighthouse?")
    store.add_message(older, "assistant", "A tower with a light.")
    store.add_message(older, "user", "And a foghorn?")
    store.add_message(older, "assistant", "Half an answer", status="cancelled")
    newer = store.create_conversation("Newer")
    store.add_message(newer, "user", "Who keeps it?")
    store.add_message(newer, "assistant", "The keeper.")
    store.add_message(newer, "user", "Why?")
    store.add_message(newer, "assistant", "", status="error")
    window = harness.open(store=store)
    expected = [("What is a lighthouse?", "A tower with a light."), ("Who keeps it?", "The keeper.")]
    qtbot.waitUntil(lambda: fake(window).remembered == expected)

    engine = fake(window)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, answer_cache=False, device="cpu"))
    assert engine.remembered == expected  # not seeded again: the user turned answer memory off


def test_damaged_database_falls_back_to_memory(qtbot: QtBot, harness: Harness) -> None:
    damaged = harness.db_path
    damaged.write_bytes(b"this is not a database, just bytes " * 200)
    before = damaged.read_bytes()
    store, warning = open_store(damaged)
    assert warning is not None and "will not be saved" in warning
    window = harness.open(store=store, store_warning=warning)
    banner = window.banner("store-fallback")
    assert banner is not None and banner.isVisible()
    assert "will not be saved" in banner.text()
    conversation_id = chat(qtbot, window, "Still works")
    assert stored(window, conversation_id)[1].content == FULL_REPLY
    assert damaged.read_bytes() == before
    assert sorted(p.name for p in damaged.parent.iterdir()) == ["brisk.db"]


def test_store_error_becomes_a_banner(qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Hi")

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreError("Could not rename: the disk is full. Free some space and try again.")

    monkeypatch.setattr(window.store, "rename_conversation", fail)
    window.rename_conversation(conversation_id, "New name")
    banner = window.banner("store-error")
    assert banner is not None and "disk is full" in banner.text()
    assert window.sidebar.model.titles() == ["Hi"]

    monkeypatch.setattr(window.store, "add_message", fail)
    type_and_send(qtbot, window, "Keep this text")
    assert window.composer.editor.toPlainText() == "Keep this text"
    assert window.session.active is None and window.composer.button.text() == "Send"


def test_store_error_while_streaming_keeps_the_reply_on_screen(
    qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = harness.open()

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreError("Could not save the message: the database is locked.")

    monkeypatch.setattr(window.store, "update_message", fail)
    type_and_send(qtbot, window, "Hi")
    qtbot.waitUntil(lambda: window.session.active is None)
    assert last_bubble(window).plain_text == FULL_REPLY
    banner = window.banner("store-error")
    assert banner is not None and "locked" in banner.text()
    assert window.composer.button.text() == "Send"


# -- rendering and responsiveness --------------------------------------------------------------------------


def test_stats_line_shows_only_what_exists() -> None:
    assert stats_line(METRICS.to_dict()) == FULL_STATS
    assert stats_line({"ttft_s": 0.5}) == "TTFT 0.50 s"
    assert stats_line({"prompt_tokens": 12, "completion_tokens": 3}) == "3 tokens \u00b7 12 prompt tokens"
    assert stats_line({}, "cancelled") == "stopped"
    assert stats_line({"completion_tokens": 9, "drafted": 0, "accepted": 0}) == "9 tokens"
    assert stats_line({"prompt_tokens": 35, "cached_tokens": 0}) == "reused 0 of 35 prompt tokens"
    assert stats_line({"drafted": 40, "accepted": 31, "speedup": 1.84}) == (
        "accepted 31 of 40 drafted (78 %) \u00b7 1.8\u00d7 plain decode"
    )
    assert stats_line({"completion_tokens": 2, "quant": "int8-cpu"}) == "2 tokens \u00b7 int8-cpu"


def test_markdown_rendering() -> None:
    html = render_reply("Use `x`:\n\n```python\nif a < b:\n    pass\n```\n<script>alert(1)</script>")
    assert CODE_BG in html and "monospace" in html
    assert "if a &lt; b:" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    coloured = render_reply([("plain ", False), ("drafted", True), ("\n# Head", True)], colour_drafts=True)
    assert coloured.count(DRAFT_COLOUR) == 2
    assert "<h1>" in coloured
    assert DRAFT_COLOUR not in render_reply([("drafted", True)], colour_drafts=False)
    half = render_reply("Here:\n```py\nx = 1", streaming=True)
    assert "monospace" in half and "```" not in half


def test_drafted_tokens_are_coloured_when_enabled(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).draft_every = 2
    chat(qtbot, window, "Hi")
    assert DRAFT_COLOUR in last_bubble(window).content.text()
    window.apply_settings(replace(window.settings, colour_draft_tokens=False))
    chat(qtbot, window, "Again")
    assert DRAFT_COLOUR not in last_bubble(window).content.text()


def test_fast_streams_are_throttled(qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = [f"w{i} " for i in range(300)]
    engine.token_pause = 0.0
    renders = 0
    original = MessageWidget.set_content

    def counting(self: MessageWidget, html: str, plain: str) -> None:
        nonlocal renders
        renders += 1
        original(self, html, plain)

    monkeypatch.setattr(MessageWidget, "set_content", counting)
    chat(qtbot, window, "Count")
    assert last_bubble(window).plain_text == "".join(engine.tokens)
    assert renders < 100


def test_view_stays_at_the_bottom_unless_scrolled_up(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = [f"Paragraph {i}.\n\n" for i in range(60)]
    bar = window.chat_view.verticalScrollBar()
    chat(qtbot, window, "Long one")
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())

    engine.hold_after = 10
    type_and_send(qtbot, window, "Another long one")
    qtbot.waitUntil(engine.held.is_set)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    bar.setValue(0)  # the user scrolls up to read
    assert not window.chat_view.pinned
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(lambda: last_bubble(window).plain_text.endswith("Paragraph 59.\n\n"))
    assert bar.value() == 0
    bar.setValue(bar.maximum())
    assert window.chat_view.pinned


def test_switching_conversations_mid_stream(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    other = chat(qtbot, window, "Other chat")
    window.new_chat()
    send_and_hold(qtbot, window, "Streaming chat")
    streaming = window.session.conversation_id
    assert streaming is not None
    window.open_conversation(other)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Other chat", FULL_REPLY]
    assert stored(window, streaming)[1].content == FULL_REPLY
    window.open_conversation(streaming)
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Streaming chat", FULL_REPLY]


# -- settings and the bridge -------------------------------------------------------------------------


def test_settings_dialog_round_trip(qtbot: QtBot) -> None:
    original = Settings(seed=7, speculative="off")
    dialog = SettingsDialog(original)
    qtbot.addWidget(dialog)
    dialog.model_edit.setText("  /models/qwen.gguf ")
    dialog.device_combo.setCurrentText("cuda")
    dialog.dtype_combo.setCurrentText("bfloat16")
    dialog.system_edit.setPlainText("Be brief.")
    dialog.temperature.setValue(0.7)
    dialog.top_k.setValue(40)
    dialog.seed_edit.setText("")
    dialog.max_tokens.setValue(1024)
    dialog.prefix_cache.setChecked(False)
    result = dialog.result_settings()
    assert (result.model, result.device, result.dtype) == ("/models/qwen.gguf", "cuda", "bfloat16")
    assert (result.system_prompt, result.temperature, result.top_k) == ("Be brief.", 0.7, 40)
    assert result.seed is None and result.max_tokens == 1024 and result.prefix_cache is False
    assert result.speculative == "off"  # fields the dialog does not show are kept
    dialog.seed_edit.setText("42")
    assert dialog.result_settings().seed == 42


def test_applying_settings_saves_and_reloads_only_when_needed(
    qtbot: QtBot, harness: Harness, brisk_data_dir: Path
) -> None:
    window = harness.open()
    engine = fake(window)
    window.apply_settings(replace(window.settings, temperature=0.8, max_tokens=64))
    assert len(engine.loads) == 1
    assert Settings.load(brisk_data_dir / "settings.json").temperature == 0.8
    chat(qtbot, window, "Hi")
    sampling = engine.requests[-1].sampling
    assert (sampling.temperature, sampling.max_tokens) == (0.8, 64)

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, device="cpu", dtype="float32"))
    assert engine.loads[-1] == FakeSpec(source="", device="cpu", dtype="float32", quant="none")

    window.apply_settings(replace(window.settings, system_prompt="Answer in French."))
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assert window.store.get_conversation(conversation_id).system_prompt == "Answer in French."
    chat(qtbot, window, "Bonjour")
    assert engine.requests[-1].messages[0] == {"role": "system", "content": "Answer in French."}


def test_about_this_machine_from_f1_and_from_settings(
    qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = {"python": "3.12.1", "torch": "2.5.0", "cuda": False, "cpu_threads": 16, "memory_gb": 62.5}
    monkeypatch.setattr(about_dialog, "default_report", lambda: facts)
    window = harness.open()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_F1)
    about = window.about
    assert about is not None and about.isVisible()
    qtbot.waitUntil(lambda: about.machine_facts().get("PyTorch") == "2.5.0")
    shown = about.machine_facts()
    assert shown["CUDA available"] == "no" and shown["Memory"] == "62.5 GB" and shown["CPU threads"] == "16"
    rows = about.model_rows()
    assert rows["Model"] == "fake-model" and rows["Device"] == "cpu" and rows["Precision"] == "float32"
    assert rows["Parameters"] == "135.0 M" and rows["Weights in memory"] == "257.5 MB"
    assert rows["Warm prompt caches from disk"] == "1"

    dialog = SettingsDialog(window.settings, window, loaded=window.loaded)
    qtbot.addWidget(dialog)
    qtbot.mouseClick(dialog.about_button, Qt.MouseButton.LeftButton)
    from_settings = dialog.about
    assert from_settings is not None and from_settings.isVisible()
    assert from_settings.model_rows()["Model"] == "fake-model"
    qtbot.waitUntil(lambda: from_settings.machine_facts().get("Python") == "3.12.1")


def test_about_dialog_reports_a_failing_check(qtbot: QtBot) -> None:
    def broken() -> dict[str, object]:
        raise ImportError("No module named 'torch'")

    dialog = AboutDialog(None, report=broken)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: "torch" in " ".join(dialog.machine_facts().values()))
    assert "Could not check this machine" in " ".join(dialog.machine_facts().values())
    assert list(dialog.model_rows().values()) == [NO_MODEL]


def test_bridge_delivers_events_on_the_gui_thread(qtbot: QtBot) -> None:
    bridge = EngineBridge(FakeEngine, FakeSpec)
    seen: list[int] = []
    bridge.event.connect(lambda _event: seen.append(threading.get_ident()))
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        bridge.load("tiny")
    engine = bridge.engine
    assert isinstance(engine, FakeEngine)
    assert engine._thread.ident != threading.get_ident()
    assert seen and set(seen) == {threading.get_ident()}
    bridge.shutdown()


def test_bridge_reports_an_engine_that_cannot_start(qtbot: QtBot) -> None:
    def broken(_on_event: object) -> FakeEngine:
        raise ImportError("No module named 'torch'")

    bridge = EngineBridge(broken, FakeSpec)
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, LoadFailed)) as blocker:
        bridge.load()
    assert "Could not start the engine" in blocker.args[0].message
    assert "torch" in blocker.args[0].message
    bridge.shutdown()


RUN_GUI_SCRIPT = """
import sys
sys.path.insert(0, "tests")
from fake_engine import FakeEngine, FakeSpec
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.bridge, app.launch
from app.main_window import MainWindow

app.launch.engine_factory_for = lambda settings: FakeEngine
app.bridge.default_spec_factory = FakeSpec

tries = [0]

def check():
    tries[0] += 1
    if tries[0] > 500:
        print("NOT READY", flush=True)
        QApplication.quit()
        return
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if windows and windows[0].isVisible() and windows[0].model_ready:
        engine = windows[0].bridge.engine
        print("READY", engine.loads[-1].source, windows[0].windowIcon().isNull(), flush=True)
        QApplication.quit()
    else:
        QTimer.singleShot(20, check)

QTimer.singleShot(0, check)
sys.exit(app.launch.run_gui(sys.argv[1], None))
"""


def test_run_gui_opens_loads_and_quits(brisk_data_dir: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(brisk_data_dir)}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", RUN_GUI_SCRIPT, "/models/cli-choice"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "READY /models/cli-choice False" in done.stdout
    assert (brisk_data_dir / "brisk.db").exists()
