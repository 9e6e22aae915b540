"""The window's turns: send, stop, regenerate, edit, and the reply events that follow.

:class:`TurnActions` is a mixin of :class:`~app.window.main_window.MainWindow`
(it holds no state of its own).  A turn is set up by the
:class:`~app.state.session.ChatSession` (store first, so nothing is lost),
shown in the chat view, and its request goes out through the bridge; the
reply's events come back through ``_on_reply_event``.  A reply that is still
streaming blocks a new turn with a hint; so does a model that is not loaded.
``regenerate(message_id, fresh=True)`` asks with ``Request.fresh`` (a cached
reply's "Regenerate fresh").  Each finished reply is counted in the window's
answer-cache tally, shown on the latency panel.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog

from app.bridge import EngineBridge
from app.state.session import ChatSession, Turn
from app.views.chat_view import ChatView
from app.views.composer import Composer
from app.views.sidebar import Sidebar
from engine.storage import StoreError

LOADING_TIP = "The model is still loading. You can type; Send unlocks when it is ready."
FAILED_TIP = "No model is loaded. Pick another model in Settings."


class TurnActions:
    """Mixed into MainWindow, which provides these attributes and the methods called below."""

    session: ChatSession
    bridge: EngineBridge
    chat_view: ChatView
    composer: Composer
    sidebar: Sidebar
    stop_action: QAction
    model_ready: bool
    _store_error: Any
    _refresh_entry: Any
    _show_title: Any
    _messages: Any
    show_banner: Any
    banner: Any
    latency: Any
    parameters: Any
    cache_tally: Any
    typing: Any
    documents: Any

    def _on_reply_event(self, event: object) -> None:
        reply = self.session.apply(event)
        if reply is None:
            return
        shown = reply.conversation_id == self.session.conversation_id
        if reply.streaming:
            if shown and (reply.config is None or reply.config.stream):  # streaming off: shown at the end
                self.chat_view.reply_updated(reply)
            return
        if shown:
            self.chat_view.reply_finished(reply)
            self.show_context()
        if reply.status == "done":
            self.cache_tally.add(reply.metrics)
            self.latency.panel.numbers.show_session(self.cache_tally.text())
        self._set_busy(self.session.active is not None)
        self._refresh_entry(reply.conversation_id)
        if self.session.active is None:
            self.typing.reply_ended()  # what was typed meanwhile is prefilled now

    # -- turns ---------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        if not text.strip():
            self.composer.show_hint("Type a message first.")
            return False
        if self.documents.reading_for_open_chat():  # the message stays in the composer; nothing is lost
            self.composer.show_hint(
                "Still reading the files attached to this chat; send when they are in, or press Cancel to "
                "send without them."
            )
            return False
        try:
            turn = self.session.send(text)
        except StoreError as exc:
            self._store_error(exc)
            return False
        except RuntimeError as exc:  # a reply is still streaming
            self.composer.show_hint(str(exc))
            return False
        self.composer.clear()
        self._refresh_entry(turn.reply.conversation_id)
        self.sidebar.select(turn.reply.conversation_id)
        self._show_title()
        if turn.new_conversation:
            self.parameters.show_chat()  # the panel now edits the chat just made
        if turn.user_message_id is not None:
            self.chat_view.add_user_message(turn.user_message_id, text)
        self._start(turn)
        return True

    def stop(self) -> None:
        reply = self.session.stop()
        if reply is None:
            return
        self.bridge.cancel(reply.request_id)
        if reply.conversation_id == self.session.conversation_id:
            self.chat_view.reply_finished(reply)
        self._set_busy(False)
        self._refresh_entry(reply.conversation_id)

    def regenerate(self, message_id: int | None = None, fresh: bool = False) -> bool:
        if not self._can_start():
            return False
        if message_id is None:
            replies = [m.id for m in self._messages() if m.role == "assistant"]
            if not replies:
                return False
            message_id = replies[-1]
        try:
            turn = self.session.regenerate(message_id, fresh=fresh)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.remove_from(message_id)
        self._start(turn)
        return True

    def edit_message(self, message_id: int, text: str | None = None) -> bool:
        if not self._can_start():
            return False
        if text is None:
            old = next((m.content for m in self._messages() if m.id == message_id), "")
            text, ok = QInputDialog.getMultiLineText(
                self, "Edit message", "Edit your message. The replies after it will be replaced.", old
            )
            if not ok:
                return False
        if not text.strip():
            self.composer.show_hint("An edited message cannot be empty.")
            return False
        try:
            turn = self.session.edit(message_id, text)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.remove_from(message_id)
        if turn.user_message_id is not None:
            self.chat_view.add_user_message(turn.user_message_id, text)
        self._start(turn)
        return True

    def _can_start(self) -> bool:
        if self.session.active is not None:
            self.composer.show_hint("A reply is still streaming. Press Esc to stop it.")
            return False
        if not self.model_ready:
            self.composer.show_hint(FAILED_TIP if self.banner("load") else LOADING_TIP)
            return False
        return True

    def _start(self, turn: Turn) -> None:
        self.chat_view.start_reply(turn.reply)
        self._set_busy(True)
        self.bridge.submit(self.latency.begin(turn))  # the panel's switches, recorded on the reply

    def _set_busy(self, busy: bool) -> None:
        self.composer.set_busy(busy)
        self.chat_view.set_busy(busy)
        self.stop_action.setEnabled(busy)
