"""The latency panel: live numbers, waterfall, charts and switches for the reply in view.

:class:`LatencyPanel` is a plain widget (the window puts it in a dock).  Its
state is a :class:`~app.panels.trace.ReplyTrace` (the reply in view) and a
:class:`~app.state.config.History` (one point per finished reply); the
controller (:mod:`app.panels.controller`) feeds them and calls
:meth:`LatencyPanel.changed`.  Nothing is drawn on an event: a ``QTimer`` at
``REDRAW_MS`` (20 Hz) redraws only what moved since the last tick
(``ReplyTrace.version``, the history's length) and stops itself when nothing
did, so a fast stream costs at most twenty repaints a second.

Children tests and the controller use: ``switches`` (:class:`SwitchesView`),
``numbers`` (:class:`NumbersView`), ``waterfall``, ``tokens``, ``history_chart``,
``status`` (a line saying what the panel shows), ``reload_bar`` (shown while a
quantization switch reloads the model) and ``compare_button``.  ``summary``
is the panel in one line (:func:`summary_text`), sent with ``summary_changed``:
the window shows it in the status bar while the panel is closed.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGroupBox,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.panels.charts import HistoryChart, TokensChart, WaterfallChart
from app.panels.numbers import NumbersView
from app.panels.switches import SwitchesView
from app.panels.trace import ReplyTrace
from app.state.config import History, ReplyConfig
from app.views.controls import guard_wheel

REDRAW_MS = 50
WIDTH = 240  # its least width: the charts and switches still fit (app.window.layout.PANEL_MIN)
STATUS = {
    "streaming": "Streaming\u2026",
    "done": "Last reply",
    "cancelled": "Last reply (stopped)",
    "error": "Last reply (failed)",
}
NOT_STREAMING = "Writing the reply (shown when done)"


def summary_text(trace: ReplyTrace | None, stream: bool = True) -> str:
    """The panel in one line, for the status bar while the panel is closed: what the last reply measured."""
    if trace is None:
        return "Latency: no reply yet"
    numbers = trace.numbers()
    parts: list[str] = []
    if trace.status == "streaming":
        parts.append("Streaming\u2026" if stream else NOT_STREAMING)
        if trace.tokens:
            parts.append(f"{trace.tokens} tokens")
    cached = numbers.get("answer_cache")
    if cached:
        parts.append(f"{cached} answer-cache hit")
    ttft = numbers.get("ttft_s")
    if isinstance(ttft, int | float):
        parts.append(f"TTFT {ttft:.2f} s")
    speed = numbers.get("tokens_per_s")
    if isinstance(speed, int | float) and not cached:
        parts.append(f"{speed:.0f} tok/s")
    speedup = numbers.get("speedup")
    if isinstance(speedup, int | float) and trace.status != "streaming":
        parts.append(f"{speedup:.1f}\u00d7 plain")
    if trace.status in ("cancelled", "error"):
        parts.append("stopped" if trace.status == "cancelled" else "failed")
    return "Latency: " + " \u00b7 ".join(parts) if parts else "Latency: waiting for the first token"


def _group(title: str, widget: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 6, 8, 8)
    layout.addWidget(widget)
    return box


class LatencyPanel(QScrollArea):
    summary_changed = Signal(str)  # the panel in one line (summary_text), when it changes

    def __init__(self, config: ReplyConfig | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("latencyPanel")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setMinimumWidth(WIDTH)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the body fits the width
        self.trace: ReplyTrace | None = None
        self.config: ReplyConfig | None = None
        self.history = History()
        self.redraws = 0
        self.summary = summary_text(None)
        self._drawn: tuple[int, int, int] = (-1, -1, -1)
        self._trace_serial = 0
        self._tokens_drawn = -1

        body = QWidget()
        body.setObjectName("latencyBody")
        column = QVBoxLayout(body)
        column.setContentsMargins(10, 8, 10, 10)
        column.setSpacing(8)
        self.switches = SwitchesView(config)
        column.addWidget(_group("Switches (next message)", self.switches))
        self.reload_label = QLabel()
        self.reload_label.setWordWrap(True)
        self.reload_bar = QProgressBar()
        self.reload_bar.setRange(0, 100)
        self.reload_bar.setFixedHeight(8)
        self.reload_bar.setTextVisible(False)
        for widget in (self.reload_label, self.reload_bar):
            widget.hide()
            column.addWidget(widget)
        self.status = QLabel("No reply yet")
        self.status.setObjectName("panelStatus")
        self.status.setStyleSheet("font-weight: 600;")
        self.status.setWordWrap(True)
        column.addWidget(self.status)
        self.numbers = NumbersView()
        column.addWidget(self.numbers)
        self.waterfall = WaterfallChart()
        self.tokens = TokensChart()
        self.history_chart = HistoryChart()
        for chart, height in ((self.waterfall, 170), (self.tokens, 150), (self.history_chart, 380)):
            chart.setFixedHeight(height)
            column.addWidget(chart)
        self.compare_button = QPushButton("Compare configurations\u2026")
        self.compare_button.setToolTip(
            "Replay your last message under several configurations and compare them side by side"
        )
        column.addWidget(self.compare_button)
        column.addStretch(1)
        self.setWidget(body)
        guard_wheel(body)  # the wheel scrolls the panel; a switch changes only once it has focus

        self.timer = QTimer(self)
        self.timer.setInterval(REDRAW_MS)
        self.timer.timeout.connect(self._tick)

    # -- what the controller calls ----------------------------------------------------------
    def start(self, trace: ReplyTrace, config: ReplyConfig) -> None:
        """A new reply is in view."""
        self.trace, self.config = trace, config
        self._trace_serial += 1
        self.changed()

    def add_history(self, trace: ReplyTrace, config: ReplyConfig) -> None:
        self.history.add(trace.metrics, config)
        self.changed()

    def show_reload(self, fraction: float | None, text: str = "") -> None:
        """A reload is under way (``fraction`` 0..1), or over (None)."""
        busy = fraction is not None
        self.reload_label.setVisible(busy)
        self.reload_bar.setVisible(busy)
        if busy:
            self.reload_label.setText(text)
            self.reload_bar.setValue(int(100 * max(0.0, min(1.0, fraction or 0.0))))

    def changed(self) -> None:
        """Something moved: redraw at the next tick (at most every ``REDRAW_MS``)."""
        if not self.timer.isActive():
            self.timer.start()

    # -- drawing -----------------------------------------------------------------------------
    def _tick(self) -> None:
        trace = self.trace
        state = (self._trace_serial, trace.version if trace else -1, len(self.history.points))
        if state == self._drawn:
            self.timer.stop()
            return
        self._drawn = state
        self.redraw()

    def redraw(self) -> None:
        """Redraw everything now (the timer calls this; tests and screenshots may too)."""
        self.redraws += 1
        trace = self.trace
        if trace is not None:
            words = STATUS.get(trace.status, trace.status)
            if trace.status == "streaming" and self.config is not None and not self.config.stream:
                words = NOT_STREAMING  # the reply is being written, and shown whole when it is done
            config = self.config.short() if self.config else ""
            self.status.setText(f"{words} \u00b7 {config}" if config else words)
            self.numbers.show_numbers(trace.numbers())
            spans = trace.spans()
            if spans != self.waterfall.spans:
                self.waterfall.update_spans(spans)
            if (self._tokens_drawn, self.tokens.points) != (self._trace_serial, len(trace.points)):
                new_reply = self._tokens_drawn != self._trace_serial
                self._tokens_drawn = self._trace_serial
                self.tokens.update_points(trace.points, new_reply)
        summary = summary_text(trace, self.config.stream if self.config else True)
        if summary != self.summary:
            self.summary = summary
            self.summary_changed.emit(summary)
        if self.history_chart.count != len(self.history.points):
            self.history_chart.update_history(self.history.points)
        self._drawn = (self._trace_serial, trace.version if trace else -1, len(self.history.points))

    def flush(self) -> None:
        """Draw what is pending now (tests, screenshots)."""
        self.timer.stop()
        self.redraw()
