"""A chat that outgrows the model's context, in the window on the real engine with the tiny model (512 tokens):
the reply says which turns were left out, above it, and a chat set to "stop" is refused with the reason."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.window.main_window import MainWindow
from engine.api import Done, Error, Loaded, LoadFailed
from engine.client import local_backend
from engine.storage import Settings, Store

LINE = "the tide comes in and the tide goes out. "


def long_chat(store: Store, turns: int, params: dict[str, str] | None = None) -> str:
    conversation_id = store.create_conversation("Long", system_prompt="Answer briefly.", params=params or {})
    for n in range(1, turns + 1):
        store.add_message(conversation_id, "user" if n % 2 else "assistant", f"turn {n}: {LINE * 2}")
    return conversation_id


def open_window(qtbot: QtBot, store: Store, tiny_dir: Path) -> MainWindow:
    settings = Settings(
        model=str(tiny_dir), device="cpu", dtype="float32", quant="none", max_tokens=8, answer_cache=False
    )
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(store, bridge, settings)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=60_000):
        window.load_model()
    assert window.model_ready, window.status_area.message_label.text()
    return window


def send(qtbot: QtBot, window: MainWindow, text: str, ends: type) -> None:
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, ends), timeout=60_000):
        window.composer.editor.setPlainText(text)
        qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.session.active is None)


def test_a_long_chat_says_which_turns_left_the_context(qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path) -> None:
    store = Store(brisk_data_dir / "brisk.db")
    dropping = long_chat(store, 14)
    stopping = long_chat(store, 14, {"overflow": "stop"})
    window = open_window(qtbot, store, tiny_dir)
    try:
        window.open_conversation(dropping)
        send(qtbot, window, "And the moon?", Done)
        reply = window.chat_view.bubbles()[-1]
        assert reply.notice.isVisible()
        notice = reply.notice.text()
        assert notice.startswith("Turns 1\u2013") and "no longer in the model's context" in notice
        stored = store.messages(dropping)[-1].metrics
        first, last = stored["dropped"]
        assert first == 1 and 2 <= last <= 14, stored["dropped"]
        assert f"1\u2013{last} are" in notice
        window.open_conversation(dropping)  # opened again: the notice is stored with the reply
        assert window.chat_view.bubbles()[-1].notice.text() == notice

        window.open_conversation(stopping)
        send(qtbot, window, "And the moon?", Error)
        refused = window.chat_view.bubbles()[-1]
        assert "no longer fits the model's context" in refused.error.text()
        assert "Settings" in refused.error.text()
    finally:
        window.close()
        window.bridge.shutdown()
        store.close()
