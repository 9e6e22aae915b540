"""The window's turns: send, stop, regenerate, edit, a reply's versions, and the reply events that follow.

:class:`TurnActions` is a mixin of :class:`~app.window.main_window.MainWindow`
(it holds no state of its own).  A turn is set up by the
:class:`~app.state.session.ChatSession` (store first, so nothing is lost),
shown in the chat view, and its request goes out through the bridge; the
reply's events come back through ``_on_reply_event``.

Busy is per chat: several chats may stream at once (the engine batches their
requests).  A reply still streaming blocks a new turn in its own chat only,
with a hint; so does a model that is not loaded.  The composer's Send/Stop,
the Stop action (Esc) and the greyed message actions follow the open chat
(:meth:`TurnActions.show_busy`, called again whenever another chat opens);
``stop()`` stops the open chat's reply, ``stop(conversation_id)`` another's,
``stop_all()`` every one (closing the window, another engine).

A message sent while the open chat's reply streams is queued
(``ChatSession.queue``): a greyed row "Queued — sends when the reply ends" at
the end of the chat and the composer's Cancel (``cancel_queued`` puts the
text back in the box); when that chat's reply ends (done, stopped, failed)
it is sent at once (:meth:`TurnActions.send_queued`), whether or not the chat
is open.  Its prompt holds the reply that just ended, so nothing of it can be
computed before that reply's last token: it starts from the conversation's
own cache entry, a warm follow-up.

``regenerate(message_id)`` streams a new, sampled reply into the same message,
past the answer cache; the old text stays one of its versions, browsed with
the "‹ 2/3 ›" in its header (``show_version``; each version keeps its own
timings).  Each finished reply is counted in the window's answer-cache tally,
shown on the latency panel.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog

from app.bridge import EngineBridge
from app.state.session import ChatSession, Turn
from app.views.chat_model import QUEUED_ID, queued_item
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
        self.show_busy()
        self._refresh_entry(reply.conversation_id)
        self.send_queued(reply.conversation_id)
        if shown and self.session.active is None:
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
        if self.session.active is not None:  # the open chat's reply streams: the message waits for its end
            return self.queue(text)
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

    def queue(self, text: str) -> bool:
        """Keep ``text`` to send when the open chat's streaming reply ends; shown greyed at the chat's end."""
        try:
            self.session.queue(text)
        except RuntimeError as exc:  # one message waits already
            self.composer.show_hint(str(exc))
            return False
        self.composer.clear()
        self.show_queued()
        self.chat_view.scroll_to_bottom()
        return True

    def cancel_queued(self) -> None:
        """Take back the open chat's queued message: its text goes back into an empty composer."""
        text = self.session.cancel_queued()
        if text is not None and not self.composer.text().strip():
            self.composer.set_text(text)
        self.show_queued()

    def send_queued(self, conversation_id: str) -> bool:
        """Send the message queued in ``conversation_id`` now that its reply has ended (it may not be open)."""
        text = self.session.queued(conversation_id)
        if text is None or not self.model_ready:
            return False
        try:
            turn = self.session.send_queued(conversation_id)
        except StoreError as exc:
            self._store_error(exc)
            return False
        if turn is None:
            return False
        shown = conversation_id == self.session.conversation_id
        if shown:
            self.show_queued()
            if turn.user_message_id is not None:
                self.chat_view.add_user_message(turn.user_message_id, text)
        self._refresh_entry(conversation_id)
        self._start(turn, shown=shown)
        return True

    def show_queued(self) -> None:
        """The open chat's queued message as its last row and the composer's Cancel, or neither."""
        text = self.session.queued()
        model = self.chat_view.chat_model
        row = model.item(QUEUED_ID)
        if row is not None and (text is None or row.text != text or model.row_of(QUEUED_ID) != model.count - 1):
            model.remove(QUEUED_ID)
            row = None
        if text is not None and row is None:
            model.append(queued_item(text))
        self.composer.set_queued(text is not None)

    def set_overflow(self, policy: str | None) -> None:
        """Keep the open chat's overflow policy (Settings' "This chat"); None or unchanged: nothing to do."""
        if policy is None or policy == self.session.overflow():
            return
        try:
            self.session.set_overflow(policy)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))

    def stop(self, conversation_id: str | None = None) -> None:
        """Stop the reply streaming in that chat (default: the open one), keeping its text; a message queued
        there is sent now."""
        reply = self.session.stop(conversation_id)
        if reply is None:
            return
        self.bridge.cancel(reply.request_id)
        if reply.conversation_id == self.session.conversation_id:
            self.chat_view.reply_finished(reply)
        self.show_busy()
        self._refresh_entry(reply.conversation_id)
        self.send_queued(reply.conversation_id)

    def stop_all(self) -> None:
        """Stop every reply still streaming, in any chat (each keeps its text); queued messages are dropped."""
        for reply in self.session.all_streaming():
            self.session.cancel_queued(reply.conversation_id)
            self.stop(reply.conversation_id)

    def regenerate(self, message_id: int | None = None) -> bool:
        """A new reply in place of ``message_id`` (None: the open chat's last reply); the old one stays a version."""
        if not self._can_start():
            return False
        if message_id is None:
            replies = [m.id for m in self._messages() if m.role == "assistant"]
            if not replies:
                return False
            message_id = replies[-1]
        try:
            turn = self.session.regenerate(message_id)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.remove_from(message_id + 1)  # what followed goes; the reply's own row streams anew
        self._start(turn)
        return True

    def show_version(self, message_id: int, number: int) -> bool:
        """Show version ``number`` of a reply of the open chat: its text and timings, and later turns go on
        from it."""
        if self.session.active is not None:
            self.composer.show_hint("A reply is still streaming. Press Esc to stop it.")
            return False
        try:
            message = self.session.show_version(message_id, number)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.replace_message(message)
        self.show_context()
        self.typing.chat_changed()  # the history a draft continues from changed
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

    def _start(self, turn: Turn, shown: bool = True) -> None:
        if shown:
            self.chat_view.start_reply(turn.reply, version=turn.version)
        self.show_busy()
        request = self.latency.begin(turn)  # the panel's switches, recorded on the reply
        if turn.version is not None:  # a Regenerate: past the answer cache whatever the panel's switch says
            request = dataclasses.replace(request, answer_cache=False)
        self.bridge.submit(request)

    def show_busy(self) -> None:
        """Send or Stop, Esc and the message actions as the open chat is: busy while its own reply streams."""
        busy = self.session.active is not None
        self.composer.set_busy(busy)
        self.chat_view.set_busy(busy)
        self.stop_action.setEnabled(busy)
        self.show_queued()
