"""Wires the parameters panel into the main window: the open chat's values, and presets.

``ParametersController(window, presets)`` puts a
:class:`~app.panels.parameters.ParametersPanel` in a dock beside the latency
panel (the two share the right side as tabs) and keeps it on the open chat:
the window calls :meth:`show_chat` when a chat is opened or created and after
Settings change (the defaults a chat follows).  Edits go to the chat through
``ChatSession.set_chat_params`` (the history file, or the next new chat
before it exists) and apply from the next message; a preset sets the chat's
system prompt and the values that differ from the defaults.  A store or file
error is a banner and the panel shows what is kept.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject

from app.panels.parameters import ParametersPanel
from engine import client
from engine.storage import StoreError, params
from engine.storage.params import PresetFile

TITLE = "Parameters"


class ParametersController(QObject):
    def __init__(self, window: Any, presets: PresetFile | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.presets = presets or PresetFile()
        self.panel = ParametersPanel()
        self.panel.check_format = client.format_problems  # the grammar library's rules, before any reply
        self.dock = window.add_panel(TITLE, self.panel)
        self.panel.changed.connect(self._changed)
        self.panel.preset_chosen.connect(self.apply_preset)
        self.panel.save_requested.connect(self.save_preset)
        self.panel.delete_requested.connect(self.delete_preset)

    def show_chat(self) -> None:
        """Show the open chat's values (or the next new chat's)."""
        session = self.window.session
        try:
            system, own = session.chat_params()
        except StoreError as exc:
            self.window.show_banner("store-error", "error", str(exc))
            return
        defaults = params.defaults(self.window.settings)
        new, default_system = session.conversation_id is None, self.window.settings.system_prompt
        self.panel.show_chat(system, own, defaults, self.presets.presets(), new, default_system)

    def _changed(self, system_prompt: str, own: dict[str, Any]) -> None:
        try:
            self.window.session.set_chat_params(own, system_prompt)
        except (StoreError, ValueError) as exc:
            self.window.show_banner("parameters", "error", f"The chat's parameters were not saved: {exc}")
            self.show_chat()  # what is kept
            return
        self.window.hide_banner("parameters")

    def apply_preset(self, name: str) -> None:
        preset = self.presets.find(name)
        if preset is None:
            return
        defaults = params.defaults(self.window.settings)
        own = {k: v for k, v in preset.params.items() if v != defaults.get(k)}
        self._changed(preset.system_prompt, own)
        self.show_chat()
        self.window.composer.show_hint(f"Preset \u201c{preset.name}\u201d applies from the next message.")

    def save_preset(self, name: str) -> None:
        system, own = self.panel.system_prompt, self.panel.defaults | self.panel.own
        try:
            kept = self.presets.save(params.Preset(name, system, own))
        except (ValueError, OSError) as exc:
            self.window.show_banner("parameters", "error", f"The preset was not saved: {exc}")
            return
        self.window.hide_banner("parameters")
        self.show_chat()
        self.window.composer.show_hint(f"Saved the preset \u201c{kept.name}\u201d.")

    def delete_preset(self, name: str) -> None:
        try:
            self.presets.delete(name)
        except (ValueError, OSError) as exc:
            self.window.show_banner("parameters", "error", f"The preset was not deleted: {exc}")
            return
        self.show_chat()
        self.window.composer.show_hint(f"Deleted the preset \u201c{name}\u201d.")
