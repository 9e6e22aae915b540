"""The status bar's content: which model, on what device and precision, and how loading goes.

:class:`StatusArea` shows the model name, the device and the weights'
precision (the quantization mode when there is one, else the dtype:
:func:`~app.state.model_facts.precision_text`) once ``Loaded`` arrives.
While ``LoadProgress`` events come in it shows a progress bar with the
loader's message right beside it, and the seconds since that step began
(ticking once a second, so a long step such as the first start's conversion
visibly goes on).  After ``LoadFailed`` it shows a red message.  A model on a
remote server (``Loaded.device == "remote"``) reads ``model · remote · host:port``,
the tooltip giving the server's URL and what is measured where.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.state.model_facts import is_remote, precision_text
from app.views.style import current
from engine.api import Loaded

TICK_MS = 1000
SEP = " \u00b7 "


class StatusArea(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 0, 6, 0)
        layout.setSpacing(10)
        self.model_label = QLabel("No model loaded")
        layout.addWidget(self.model_label)
        self.device_label = QLabel()
        layout.addWidget(self.device_label)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(160)
        self.progress.hide()
        layout.addWidget(self.progress)
        self.message_label = QLabel()
        layout.addWidget(self.message_label, 1)
        self.server_label = QLabel()  # "Serving at URL" while the server switch is on
        self.server_label.hide()
        layout.addWidget(self.server_label)
        self._step = ""
        self._step_started = 0.0
        self._ticker = QTimer(self)
        self._ticker.setInterval(TICK_MS)
        self._ticker.timeout.connect(self._show_step)

    def serving(self, url: str) -> None:
        """The server listens at ``url`` ("" when it is off)."""
        self.server_label.setText(f"Serving at {url}" if url else "")
        self.server_label.setToolTip("Other programs use the model here through the OpenAI API (Tools > Server)")
        self.server_label.setVisible(bool(url))

    def loading(self, fraction: float, message: str) -> None:
        percent = int(round(max(0.0, min(1.0, fraction)) * 100))
        self.progress.setValue(percent)
        self.progress.setToolTip(f"{percent} %")
        self.progress.show()
        if message != self._step:
            self._step = message
            self._step_started = time.monotonic()
        self.message_label.setStyleSheet("")
        self._show_step()
        self._ticker.start()

    def _show_step(self) -> None:
        waited = int(time.monotonic() - self._step_started)
        self.message_label.setText(f"{self._step}{SEP}{waited} s" if waited >= 1 else self._step)

    def _stop_loading(self) -> None:
        self._ticker.stop()
        self._step = ""
        self.progress.hide()

    def loaded(self, event: Loaded, usable_s: float | None = None) -> None:
        """Say the model is in; ``usable_s`` (the window's own clock from the load's start to now, engine start
        included) is said as the load time where given, else the engine's ``load_s``."""
        self._stop_loading()
        self.model_label.setText(event.model_name)
        precision, tip = precision_text(event)
        self.device_label.setText(f"{event.device}{SEP}{precision}")
        self.device_label.setToolTip(tip)
        self.message_label.setStyleSheet("")
        verb = "Connected" if is_remote(event) else "Loaded"
        self.message_label.setText(f"{verb} in {event.load_s if usable_s is None else usable_s:.1f} s")
        self.message_label.setToolTip("")

    def tuning(self, message: str, done: bool) -> None:
        """Work after the load that speeds later replies (the model already answers): said, no progress bar."""
        self.message_label.setStyleSheet("" if done else f"color: {current().muted};")
        self.message_label.setText(message)
        self.message_label.setToolTip(message)

    def failed(self, message: str) -> None:
        self._stop_loading()
        self.model_label.setText("No model loaded")
        self.device_label.setText("")
        self.device_label.setToolTip("")
        self.message_label.setStyleSheet(f"color: {current().error};")
        self.message_label.setText(f"Loading failed: {message}")
