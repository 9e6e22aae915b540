"""Prefill while typing, on the window's side: the composer's draft goes to the engine as it is written.

:class:`TypingPrefill` listens to the composer's ``draft_changed`` (150 ms after typing pauses, every
300 ms of typing that never pauses, at once after a paste) and hands the bridge the request Send would
make now (``ChatSession.draft_request``), so
a local engine prefills the part of the prompt no further keystroke can change while it is idle
(``engine.runtime.hints``).  Nothing is sent while the switch is off (Settings' "Prefill while typing",
also in the latency panel), before a model is loaded, or while a reply streams (the draft is sent again
when it ends).  The engine's ``DraftPrefill`` events for the open draft become the composer's quiet
"N tokens ready" under the message.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject

from engine.api import DraftPrefill
from engine.storage import StoreError


class TypingPrefill(QObject):
    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.conversation: str | None = None  # the conversation id the last hint was for
        self.sent = 0  # hints handed to the engine (tests read it)
        window.composer.draft_changed.connect(self.draft_changed)

    def draft_changed(self, text: str) -> None:
        window = self.window
        if not window.settings.prefill_while_typing or not window.model_ready or window.session.active is not None:
            return
        try:
            request = window.session.draft_request(text)  # an empty draft drops what was prefilled
        except StoreError:
            return  # the Send says what is wrong with the history file
        self.conversation = request.conversation_id
        if window.bridge.hint(request):
            self.sent += 1
        if not text.strip():
            window.composer.show_prefilled(0, 0)

    def chat_changed(self) -> None:
        """Another chat is open: the composer's draft (kept across the switch) is prefilled for it instead, and
        what was prefilled for the chat before is dropped (an empty draft drops it too)."""
        if self.conversation is not None or self.window.composer.text().strip():
            self.draft_changed(self.window.composer.text())

    def reply_ended(self) -> None:
        """A reply ended: the draft typed meanwhile goes to the engine now."""
        text = self.window.composer.text()
        if text.strip():
            self.draft_changed(text)

    def on_event(self, event: DraftPrefill) -> None:
        if event.conversation_id == self.conversation:  # show_prefilled hides it for an empty composer
            self.window.composer.show_prefilled(event.ready, event.total)
