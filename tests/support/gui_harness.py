"""The GUI tests' harness: real windows on a real store, each driven by a scripted FakeEngine.

:class:`Harness` opens :class:`~app.window.MainWindow` s on a store in the
test's data folder (the ``harness`` fixture in ``tests/app/conftest.py`` makes one per
test and closes what it opened); the helpers send a message, wait for or hold
a reply, click a message's actions, and read what the store and the chat view hold.  The fake engine
emits its events from a real background thread, so every test also covers the
thread hop through the bridge.  Everything waits on signals and conditions,
never on fixed sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.views.chat_view import MessageHandle
from app.window import MainWindow
from app.window.layout import LayoutFile
from engine.api import Done, Loaded, LoadFailed
from engine.storage import Message, Settings, Store
from tests.support.fake_engine import FakeEngine

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


def words_only_library() -> Any:
    """The real document index in this test's data folder, searched by words alone (no embedding model to
    load: a test's documents need none); opened on the window's worker at its first use."""
    from engine.documents.library import DocumentLibrary

    return DocumentLibrary(embed=lambda texts: None)


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
        layout_file: LayoutFile | None = None,
        size: tuple[int, int] = (900, 640),
        document_library: Callable[[], Any] | None = None,
    ) -> MainWindow:
        store = store or Store(self.db_path)
        bridge = EngineBridge(lambda on_event: FakeEngine(on_event, load_error=load_error))
        window = MainWindow(
            store,
            bridge,
            settings or Settings(),
            store_warning=store_warning,
            layout_file=layout_file,
            document_library=document_library or words_only_library,
        )
        self.qtbot.addWidget(window)
        window.resize(*size)
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


def fake(window: MainWindow) -> FakeEngine:
    engine = window.bridge.backend
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


def last_bubble(window: MainWindow) -> MessageHandle:
    """The last message as the user sees it (text, stats, notice, error, rendered content)."""
    return window.chat_view.bubbles()[-1]


def click_action(qtbot: QtBot, window: MainWindow, message_id: int, action: str) -> None:
    """Click an action drawn on a message ("copy", "regenerate", "edit", "compare"), where it is drawn."""
    view = window.chat_view
    view.scrollTo(view.index_of(message_id))
    rect = view.action_rect(message_id, action)
    assert not rect.isEmpty(), f"message {message_id} shows no {action!r} action"
    assert view.viewport().rect().contains(rect.center())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def widget_count(window: QWidget) -> int:
    return len(window.findChildren(QWidget))
