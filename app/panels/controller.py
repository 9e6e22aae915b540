"""Wires the latency panel into the main window: switches, events, per-reply configuration, compare.

``LatencyController(window)`` builds a :class:`~app.panels.latency.LatencyPanel`
in a dock (``window.add_panel``) and is what the window calls:

* :meth:`begin(turn) <LatencyController.begin>` before a request goes out: it
  records the configuration on the reply (``turn.reply.config``), puts the
  reply in view and returns the request with the switches applied;
* :meth:`on_event` for every bridge event: each reply begun here folds its own
  events into its own trace (several chats may stream at once), the panel draws
  the one in view, and every finished reply joins the history chart;
  ``Loaded``/``LoadProgress`` show the model and a reload's progress;
* :meth:`show_chat(conversation_id) <LatencyController.show_chat>` when a chat
  is opened: the panel shows that chat's newest reply of this session (still
  streaming or done), not the reply another chat began last;
* :meth:`settings_changed` after the Settings dialog changed something;
* :meth:`compare_message(message_id) <LatencyController.compare_message>`: the
  A/B compare dialog for a user message (the last one when ``None``); the chat
  view's "Compare…" action calls this.

Switches that are :class:`~engine.storage.Settings` fields (prefix cache,
speculative source, quantization, answer cache) go through
``window.apply_settings`` (saved; a quantization change reloads the model
through the usual path, whose progress the panel shows).  Streaming and
parallel tools have no Settings field yet and live here for the session.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtCore import QObject, Qt

from app.background import in_background
from app.dialogs.compare import CompareDialog, replay_messages
from app.panels.latency import LatencyPanel
from app.panels.trace import ReplyTrace
from app.state.config import ReplyConfig
from app.state.model_library import in_use
from app.state.session import Turn, model_spec
from engine.api import Done, Error, Loaded, LoadFailed, LoadProgress, Request
from engine.client import model_drafts, model_library, models_elsewhere
from engine.storage import StoreError

NO_MESSAGE = "Send a message first; compare replays one of your messages."


class LatencyController(QObject):
    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.stream = True
        self.parallel_tools = True
        self.trace: ReplyTrace | None = None  # the reply the panel shows
        self.running: dict[str, tuple[ReplyTrace, ReplyConfig]] = {}  # request id -> a reply still streaming
        self.newest: dict[str, tuple[ReplyTrace, ReplyConfig]] = {}  # chat id -> its newest reply this session
        self.reloading: str | None = None
        self.dialog: CompareDialog | None = None
        self.panel = LatencyPanel(self.config())
        self.dock = window.add_panel("Latency", self.panel)
        self.panel.switches.changed.connect(self.apply_switches)
        self.panel.compare_button.clicked.connect(lambda: self.compare_message(None))

    def config(self) -> ReplyConfig:
        return ReplyConfig.current(self.window.settings, stream=self.stream, parallel_tools=self.parallel_tools)

    # -- switches ---------------------------------------------------------------------------
    def apply_switches(self, config: ReplyConfig) -> None:
        self.stream, self.parallel_tools = config.stream, config.parallel_tools
        old = self.window.settings
        new = dataclasses.replace(
            old,
            prefix_cache=config.prefix_cache,
            speculative=config.speculative,
            quant=config.quant,
            answer_cache=config.answer_cache,
            prefill_while_typing=config.prefill_typing,
        )
        if new != old:
            if new.quant != old.quant:
                self.reloading = new.quant
                self.panel.show_reload(0.0, f"Reloading the model with {new.quant}\u2026")
            self.window.apply_settings(new)

    def _offer_draft(self, loaded: Loaded) -> None:
        """With no draft model set, look (on a worker) for a model on disk that could draft for the loaded one,
        so the greyed "Draft model" says where to find it."""
        settings = self.window.settings
        if settings.draft_model.strip() or loaded.device == "remote":
            return
        model, folders = settings.model, list(settings.model_folders)

        def find() -> str:
            if not models_elsewhere(folders):
                return ""  # only the bundled model: nothing to scan (and nothing written to the data folder)
            library = model_library(folders)
            target = next((e for e in library.entries if in_use(e, model)), None)
            drafts = model_drafts(target, library) if target is not None else []
            return str(drafts[0].name) if drafts else ""

        def show(owner: QObject, offer: object) -> None:
            if isinstance(offer, str) and not self.window.settings.draft_model.strip():
                self.panel.switches.set_draft_available(False, offer)

        in_background(self.panel, find, show)

    def settings_changed(self) -> None:
        self.panel.switches.set_draft_available(bool(self.window.settings.draft_model.strip()))
        self.panel.switches.set_config(self.config())

    # -- replies ----------------------------------------------------------------------------
    def begin(self, turn: Turn) -> Request:
        config = self.config()
        turn.reply.config = config
        self.trace = ReplyTrace(turn.request.id)
        self.running[turn.request.id] = self.newest[turn.reply.conversation_id] = (self.trace, config)
        self.panel.start(self.trace, config)
        return config.request(turn.request)

    def show_chat(self, conversation_id: str | None) -> None:
        """The chat ``conversation_id`` is open: show its newest reply of this session, if it has one."""
        shown = self.newest.get(conversation_id) if conversation_id is not None else None
        if shown is not None and shown[0] is not self.trace:
            self.trace = shown[0]
            self.panel.start(*shown)

    def on_event(self, event: object) -> None:
        if isinstance(event, LoadProgress):
            if self.reloading:
                self.panel.show_reload(event.fraction, f"Reloading with {self.reloading}: {event.message}")
        elif isinstance(event, Loaded):
            self.reloading = None
            self.panel.show_reload(None)
            self._offer_draft(event)
            self.panel.numbers.show_model(event)
            self.panel.switches.set_remote(event.info.endpoint)
            self.settings_changed()
        elif isinstance(event, LoadFailed):
            self.reloading = None
            self.panel.show_reload(None)
            self.panel.numbers.show_model(None)
        else:
            entry = self.running.get(str(getattr(event, "request_id", "")))
            if entry is None or not entry[0].apply(event):
                return
            if isinstance(event, Done | Error):
                del self.running[entry[0].request_id]
                self.panel.add_history(*entry)  # every chat's replies go on the history chart
            elif entry[0] is self.trace:
                self.panel.changed()

    # -- compare ----------------------------------------------------------------------------
    def compare_message(self, message_id: int | None = None) -> CompareDialog | None:
        """Open the compare dialog for user message ``message_id`` (None: the last one)."""
        window = self.window
        conversation = window.session.conversation_id
        try:
            messages = window.session.messages()
            if message_id is None:
                users = [m.id for m in messages if m.role == "user"]
                if conversation is None or not users:
                    window.composer.show_hint(NO_MESSAGE)
                    return None
                message_id = users[-1]
            replayed = replay_messages(window.store, conversation, message_id)
        except (StoreError, ValueError) as exc:
            window.show_banner("compare", "error", f"Cannot compare that message: {exc}")
            return None
        if self.dialog is not None:
            self.dialog.close()
        spec = model_spec(window.settings, getattr(window, "_model_override", None))
        base = self.config()
        in_use = window.loaded.info.quant if window.loaded is not None and spec.quant == "auto" else ""
        if in_use:  # start from the mode auto loaded: that row reloads nothing and is not float32
            base = dataclasses.replace(base, quant=in_use)
        documents = window.session.sent_ids()  # each replay reads the chat's documents, as its reply did
        self.dialog = CompareDialog(window.bridge, spec, replayed, base, window, in_use=in_use, documents=documents)
        self.dialog.setWindowModality(Qt.WindowModality.WindowModal)  # no new turn while it replays
        self.dialog.show()
        return self.dialog
