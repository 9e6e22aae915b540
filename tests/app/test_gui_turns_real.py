"""Regenerate and chats side by side on the real engine with the tiny test model (issue 50).

A question asked twice is answered the second time from the answer cache; Regenerate on that cached
reply gets a new reply written by the model (sampled, no badge) and keeps the cached one as version 1,
and the answer cache still holds the greedy answer afterwards.  Two chats sent one after the other
without waiting both stream, and each ends with the text the engine wrote for its own request.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.window.main_window import MainWindow
from engine.api import Done, Loaded, LoadFailed
from engine.client import local_backend
from engine.storage import Settings, Store

QUESTION = "What do lighthouse keepers write in the log?"


def open_window(qtbot: QtBot, db: Path, settings: Settings) -> MainWindow:
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(Store(db), bridge, settings)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=120_000):
        window.load_model()
    assert window.model_ready, window.status_area.message_label.text()
    return window


def send(qtbot: QtBot, window: MainWindow, text: str) -> None:
    window.composer.editor.setPlainText(text)
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)


def ask(qtbot: QtBot, window: MainWindow, text: str) -> str:
    """Ask ``text`` in a new chat and wait for the reply; the reply as shown."""
    window.new_chat()
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000):
        send(qtbot, window, text)
    qtbot.waitUntil(lambda: window.session.active is None)
    return window.chat_view.bubbles()[-1].plain_text


def test_regenerate_and_two_chats_at_once_on_the_real_engine(
    qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path
) -> None:
    settings = Settings(
        model=str(tiny_dir), device="cpu", dtype="float32", quant="none", max_tokens=24, prefix_cache=False
    )
    window = open_window(qtbot, brisk_data_dir / "brisk.db", settings)
    try:
        greedy = ask(qtbot, window, QUESTION)
        assert ask(qtbot, window, QUESTION) == greedy
        cached = window.chat_view.bubbles()[-1]
        assert cached.badge.text().startswith("From cache, exact")

        with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000):
            assert window.regenerate(cached.message_id)
        qtbot.waitUntil(lambda: window.session.active is None)
        fresh = window.chat_view.bubbles()[-1]
        assert fresh.message_id == cached.message_id and fresh.badge.text() == ""
        assert fresh.plain_text and fresh.plain_text != greedy, "a new reply, sampled by the model"
        versions = window.store.versions(cached.message_id)
        assert [m.content for m in versions] == [greedy, fresh.plain_text]
        assert versions[0].metrics.get("answer_cache") == "exact" and not versions[1].metrics.get("answer_cache")
        assert ask(qtbot, window, QUESTION) == greedy, "the cache still answers with the greedy reply"
        assert window.chat_view.bubbles()[-1].badge.text().startswith("From cache, exact")

        # two chats, the second sent before the first's reply has come back: both stream, each its own reply
        done: dict[str, str] = {}
        window.bridge.event.connect(lambda e: done.__setitem__(e.request_id, e.text) if isinstance(e, Done) else None)
        window.new_chat()
        send(qtbot, window, "Name three birds of the coast.")
        first = window.session.conversation_id
        window.new_chat()
        assert window.composer.button.text() == "Send"
        send(qtbot, window, "How tall is a lighthouse?")
        second = window.session.conversation_id
        assert first and second and first != second
        streaming = {r.conversation_id: r.request_id for r in window.session.all_streaming()}
        assert set(streaming) == {first, second}
        qtbot.waitUntil(lambda: set(streaming.values()) <= set(done), timeout=60_000)
        qtbot.waitUntil(lambda: not window.session.all_streaming())
        for conversation in (first, second):
            reply = window.store.messages(conversation)[-1]
            assert (reply.status, reply.content) == ("done", done[streaming[conversation]])
    finally:
        window.close()
        window.bridge.shutdown()
        window.store.close()
