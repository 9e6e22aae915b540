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

Messages that report something done ("Loaded in 2.1 s", a finished tuning
step) go after ``TRANSIENT_MS``; progress and failures stay while they hold.
Every label is an :class:`ElidedLabel`: on a narrow window it shows whole
words and "\u2026", never half a word, and its tooltip gives the full text.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QSize, Qt, QTimer
from PySide6.QtGui import QHelpEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QToolTip, QWidget

from app.state.model_facts import is_remote, precision_text
from app.views.style import current
from engine.api import Loaded

TICK_MS = 1000
TRANSIENT_MS = 6000  # how long a message about something done stays
SEP = " \u00b7 "
ELLIPSIS = "\u2026"


class ElidedLabel(QLabel):
    """A one-line label that shrinks: when its text does not fit it shows the words that do and "\u2026" (a
    word is never cut), and its tooltip starts with the full text.  ``text()`` is always the full text."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        margins = self.contentsMargins()
        room = self.fontMetrics().horizontalAdvance(ELLIPSIS) + margins.left() + margins.right()
        return QSize(min(room, super().minimumSizeHint().width()), super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """What the label shows at its width: the text, or its first whole words and "\u2026"."""
        text, width, metrics = self.text(), self.contentsRect().width(), self.fontMetrics()
        if metrics.horizontalAdvance(text) <= width:
            return text
        words = text.split(" ")
        while len(words) > 1:
            words.pop()
            shown = " ".join(words).rstrip(" \u00b7:,;") + ELLIPSIS
            if metrics.horizontalAdvance(shown) <= width:
                return shown
        return ELLIPSIS

    def tip(self) -> str:
        """The tooltip: the full text first where it is cut short, then the label's own tooltip."""
        own = self.toolTip()
        if self.shown_text() == self.text():
            return own
        return f"{self.text()}\n{own}" if own and own != self.text() else self.text()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            tip = self.tip()
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().event(event)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        align = self.alignment() | Qt.AlignmentFlag.AlignVCenter
        self.style().drawItemText(
            painter,
            self.contentsRect(),
            int(align),
            self.palette(),
            self.isEnabled(),
            self.shown_text(),
            self.foregroundRole(),
        )


class StatusArea(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 0, 6, 0)
        layout.setSpacing(10)
        self.model_label = ElidedLabel("No model loaded")
        layout.addWidget(self.model_label)
        self.device_label = ElidedLabel()
        layout.addWidget(self.device_label)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(160)
        self.progress.hide()
        layout.addWidget(self.progress)
        self.message_label = ElidedLabel()
        layout.addWidget(self.message_label, 1)
        self.server_label = ElidedLabel()  # "Serving at URL" while the server switch is on
        self.server_label.hide()
        layout.addWidget(self.server_label)
        self._step = ""
        self._step_started = 0.0
        self._ticker = QTimer(self)
        self._ticker.setInterval(TICK_MS)
        self._ticker.timeout.connect(self._show_step)
        self._expiry = QTimer(self)  # clears a message about something done
        self._expiry.setSingleShot(True)
        self._expiry.timeout.connect(self.message_label.clear)

    def _say(self, text: str, colour: str = "", transient: bool = False) -> None:
        """Show ``text`` as the message; a ``transient`` one goes after ``TRANSIENT_MS``."""
        self.message_label.setStyleSheet(f"color: {colour};" if colour else "")
        self.message_label.setText(text)
        if transient:
            self._expiry.start(TRANSIENT_MS)
        else:
            self._expiry.stop()

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
        self._say("")
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
        verb = "Connected" if is_remote(event) else "Loaded"
        self._say(f"{verb} in {event.load_s if usable_s is None else usable_s:.1f} s", transient=True)
        self.message_label.setToolTip("")

    def tuning(self, message: str, done: bool) -> None:
        """Work after the load that speeds later replies (the model already answers): said, no progress bar."""
        self._say(message, "" if done else current().muted, transient=done)
        self.message_label.setToolTip(message)

    def failed(self, message: str) -> None:
        self._stop_loading()
        self.model_label.setText("No model loaded")
        self.device_label.setText("")
        self.device_label.setToolTip("")
        self._say(f"Loading failed: {message}", current().error)
