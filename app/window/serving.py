"""The window's Server switch: the engine served to other programs while the window runs (``engine.server``).

:class:`ServerSwitch` owns the Server dialog (Tools > Server…), starts and
stops the server through the bridge (``EngineBridge.serve``), keeps the
choice in ``Settings.serve``/``serve_port`` (so the next start serves again,
said in the status bar), tells the server which model is loaded, and adds each
finished server request to the latency panel's history under the client's
name (``ServedReply``).  The server takes the window's sampling values and
speculation for what a request leaves out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.dialogs.server import ServerDialog
from app.state.config import ReplyConfig
from engine.api import Loaded, LoadFailed, ServedReply


class ServerSwitch:
    def __init__(self, window: Any) -> None:  # the MainWindow (not imported: it imports this module)
        self.window = window
        self.url = ""
        self.error = ""
        self.dialog: ServerDialog | None = None

    def start_saved(self) -> None:
        """At start-up: serve again when the user left it on."""
        if self.window.settings.serve:
            self.set(True, self.window.settings.serve_port, save=False)
            if self.error:
                self.window.show_banner("server", "warning", f"The server did not start again: {self.error}")

    def open(self) -> ServerDialog:
        if self.dialog is None:
            self.dialog = ServerDialog(self.window.settings.serve_port, self._snapshot, self._model, self.window)
            self.dialog.toggled.connect(self.set)
        self.dialog.show_state(self.url, self.error)
        self.dialog.show()
        self.dialog.raise_()
        return self.dialog

    def set(self, on: bool, port: int, save: bool = True) -> None:
        bridge, settings = self.window.bridge, self.window.settings
        self.error = ""
        if on:
            try:
                self.url = bridge.serve(port, settings.sampling(), settings.speculative)
            except Exception as exc:  # ServeError: the port is taken or cannot be used; said in the dialog
                self.url, self.error = "", str(exc)
            self._tell_model()
        else:
            bridge.stop_serving()
            self.url = ""
        if save and (bool(self.url), port) != (settings.serve, settings.serve_port):
            self.window.apply_settings(dataclasses.replace(settings, serve=bool(self.url), serve_port=port))
        if self.dialog is not None:
            self.dialog.show_state(self.url, self.error)
        self.window.status_area.serving(self.url)

    def settings_changed(self) -> None:
        server = self.window.bridge.server
        if server is not None:
            server.configure(self.window.settings.sampling(), self.window.settings.speculative)

    def loading(self) -> None:
        server = self.window.bridge.server
        if server is not None:
            server.set_model(None)

    def on_event(self, event: object) -> None:
        if isinstance(event, Loaded | LoadFailed):
            self._tell_model()
        elif isinstance(event, ServedReply) and event.metrics is not None and event.status == "done":
            config = dataclasses.replace(ReplyConfig.current(self.window.settings), client=event.client)
            panel = self.window.latency.panel
            panel.history.add(event.metrics, config)
            panel.changed()

    def _tell_model(self) -> None:
        server, loaded = self.window.bridge.server, self.window.loaded
        if server is None:
            return
        if loaded is None:
            server.set_model(None, loading="no model is loaded in the window")
        else:
            server.set_model(loaded.model_name, loaded.info.context_length)

    def _model(self) -> str:
        server = self.window.bridge.server
        return str(server.service.model or "") if server is not None else ""

    def _snapshot(self) -> object:
        server = self.window.bridge.server
        return server.snapshot() if server is not None else None
