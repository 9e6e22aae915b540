"""The window's Server switch: the engine served to other programs while the window runs (``engine.server``).

:class:`ServerSwitch` owns the Server dialog (Tools > Server…), starts and
stops the server through the bridge (``EngineBridge.serve``), keeps the
choice in ``Settings.serve``/``serve_port`` (so the next start serves again),
tells the server which model is loaded, and adds each finished server request
to the latency panel's history under the client's name (``ServedReply``).  The
server takes the window's sampling values and speculation for what a request
leaves out.

At start-up (:meth:`ServerSwitch.start_saved`) a server left on starts with
the window and the status bar says so ("Serving at URL", its tooltip saying
why it is on and where to turn it off).  When the port is taken by another
Brisk that already serves there (a second window, ``brisk serve``), this
window does not start one and says "Another Brisk serves at URL" for a few
seconds instead of a failure.  Asking to serve on the port already served keeps that server
running (its clients' requests go on) rather than restarting it.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from typing import Any

from PySide6.QtCore import QTimer

from app.dialogs.server import ServerDialog
from app.state.config import ReplyConfig
from app.views.status_area import TRANSIENT_MS
from engine.api import Loaded, LoadFailed, ServedReply

LEFT_ON_TIP = (
    "The server was on when Brisk last closed, so it started with the window. Other programs use the model "
    "here through the OpenAI API; Tools > Server turns it off."
)
PROBE_S = 1.0  # how long start-up waits for another Brisk's /health on a taken port


def brisk_serving(port: int, timeout: float = PROBE_S) -> str:
    """The base URL when a Brisk server answers ``/health`` on 127.0.0.1:``port`` (its shape: "ok" with the
    count served, or "loading" with a message), else ""."""
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(f"{base}/health", timeout=timeout) as response:
            body = json.loads(response.read(65536))
    except urllib.error.HTTPError as exc:  # 503 while its model loads
        try:
            body = json.loads(exc.read(65536))
        except (OSError, ValueError):
            return ""
    except (OSError, ValueError):  # nothing there, not HTTP, not JSON, too slow
        return ""
    if not isinstance(body, dict):
        return ""
    ours = (body.get("status") == "ok" and "served" in body) or (body.get("status") == "loading" and "message" in body)
    return f"{base}/v1" if ours else ""


class ServerSwitch:
    def __init__(self, window: Any) -> None:  # the MainWindow (not imported: it imports this module)
        self.window = window
        self.url = ""
        self.error = ""
        self.dialog: ServerDialog | None = None

    def start_saved(self) -> None:
        """At start-up: serve again when the user left it on, and say so; when another Brisk already serves on
        that port, say that instead of starting (it would fail: the port is taken)."""
        settings = self.window.settings
        if not settings.serve:
            return
        self.set(True, settings.serve_port, save=False)
        label = self.window.status_area.server_label
        if self.url:  # said in words for a while (a tooltip alone goes unseen), then the usual line stays
            label.setText(f"Serving again at {self.url}")  # short: the load's progress shares the line
            label.setToolTip(LEFT_ON_TIP)
            QTimer.singleShot(TRANSIENT_MS, label, self._left_on_said)
            return
        other = brisk_serving(settings.serve_port)
        if other:
            self.error = f"Another Brisk already serves at {other}; this window does not start a second server."
            label.setText(f"Another Brisk serves at {other}")
            label.setToolTip("That Brisk (another window, or brisk serve) answers there; Tools > Server here is off.")
            label.show()
            QTimer.singleShot(TRANSIENT_MS, label, lambda: None if self.url else self.window.status_area.serving(""))
            if self.dialog is not None:
                self.dialog.show_state("", self.error)
        else:
            self.window.show_banner("server", "warning", f"The server did not start again: {self.error}")

    def _left_on_said(self) -> None:
        if self.url and self.window.status_area.server_label.text().startswith("Serving again"):
            self.window.status_area.serving(self.url)
            self.window.status_area.server_label.setToolTip(LEFT_ON_TIP)

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
        server = bridge.server
        if on and server is not None and server.running and port and server.url == self._url_at(port):
            server.configure(settings.sampling(), settings.speculative)  # already serving there: keep it running
            self.url = server.url
        elif on:
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

    @staticmethod
    def _url_at(port: int) -> str:
        return f"http://127.0.0.1:{port}/v1"

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
