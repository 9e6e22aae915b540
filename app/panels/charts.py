"""The latency panel's plots, drawn with pyqtgraph: waterfall, tokens against time, history.

Each chart is a ``pyqtgraph.PlotWidget`` with one ``update(...)`` method that
replaces its data (cheap: a few items are reset, nothing is re-created), so
the panel can call it from its throttled timer.

* :class:`WaterfallChart` – one horizontal bar per :class:`~engine.api.Span`
  (queue, prompt, cache lookup, prefill, first token, decode, tool:NAME), top
  to bottom in order, on a time axis in seconds since submission.
* :class:`TokensChart` – tokens so far against time for the current reply; a
  token that came from an accepted draft is marked with an orange dot.
* :class:`HistoryChart` – TTFT (top) and tokens/s (bottom) per reply, each
  point's symbol and colour saying which configuration was on (legend).
* :class:`BarsChart` – labelled vertical bars (the compare dialog's TTFT and
  tokens/s per configuration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSizePolicy

from app.panels.trace import TokenPoint
from app.state.config import HistoryPoint
from app.views.style import current
from engine.api import Span

pg.setConfigOptions(antialias=True)

DRAFT = "#f29900"
LINE = "#1a73e8"
SPAN_COLOURS = {
    "queue": "#bdc1c6",
    "prompt": "#a142f4",
    "cache lookup": "#12b5cb",
    "prefill": "#e8710a",
    "first token": "#f9ab00",
    "thinking": "#9334e6",
    "decode": "#1a73e8",
}
TOOL_COLOUR = "#1e8e3e"
PALETTE = ("#1a73e8", "#e8710a", "#1e8e3e", "#d93025", "#a142f4", "#12b5cb", "#f9ab00", "#5f6368")
SYMBOLS = ("o", "s", "t", "d", "star", "p", "h", "+")


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``value``: an axis range that moves in
    steps, so a growing chart rebuilds its axes a few times per reply instead of on every redraw."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= value * (1 - 1e-9))


def _colours(colours: Sequence[str], outline: bool = True) -> dict[str, object]:
    """Bar colours for ``BarGraphItem.setOpts`` (an empty list needs single ones: pyqtgraph 0.14 fails on [])."""
    if not colours:
        return {"brushes": None, "pens": None, "brush": current().chart_bg, "pen": None}
    pens = [pg.mkPen(c) for c in colours] if outline else [pg.mkPen(None) for _ in colours]
    return {"brushes": [pg.mkBrush(c) for c in colours], "pens": pens}


def _colour_plot(plot: pg.PlotItem, colour: str) -> None:
    """A plot's title and its left and bottom axes (line and labels) in ``colour``."""
    plot.titleLabel.setText(plot.titleLabel.text, color=colour, size="9pt")
    for name in ("left", "bottom"):
        plot.getAxis(name).setPen(colour)
        plot.getAxis(name).setTextPen(colour)


def _style(plot: pg.PlotWidget, title: str, height: int, grid: bool = False) -> None:
    plot.setTitle(title, size="9pt")
    plot.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # nothing to do with keys: Tab goes past it
    plot.setMenuEnabled(False)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    plot.setMinimumHeight(height)
    plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    _colour_plot(plot.getPlotItem(), current().chart_axis)
    if grid:  # grid lines are redrawn with the axes: left off the charts that move while a reply streams
        plot.showGrid(x=False, y=True, alpha=0.15)


class WaterfallChart(pg.PlotWidget):
    def __init__(self) -> None:
        super().__init__(background=current().chart_bg)
        _style(self, "Waterfall (s)", 140)
        self.setToolTip("Where the reply's time went, in seconds since you pressed Send")
        self.getPlotItem().invertY(True)
        self.getAxis("left").setWidth(82)  # room for "cache lookup", "first token", "tool:NAME"
        self.bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.6, **_colours([]))
        self.addItem(self.bars)
        self.spans: tuple[Span, ...] = ()
        self._names: list[tuple[int, str]] = []

    def update_spans(self, spans: Sequence[Span]) -> None:
        self.spans = tuple(s for s in spans if s.end_s >= s.start_s)
        colours = [
            TOOL_COLOUR if s.name.startswith("tool:") else SPAN_COLOURS.get(s.name, "#80868b") for s in self.spans
        ]
        # a zero-length bar is still drawn as a thin mark, so every step is visible
        end = max((s.end_s for s in self.spans), default=0.0)
        least = end / 200 if end else 0.0
        self.bars.setOpts(
            x0=[s.start_s for s in self.spans],
            y=list(range(len(self.spans))),
            width=[max(s.seconds, least) for s in self.spans],
            **_colours(colours),
        )
        names = [(i, s.name) for i, s in enumerate(self.spans)]
        if names != self._names:
            self._names = names
            self.getAxis("left").setTicks([names])
        if self.spans:
            self.setXRange(0, nice_ceiling(end), padding=0)
            self.setYRange(-0.5, len(self.spans) - 0.5, padding=0.02)


class TokensChart(pg.PlotWidget):
    def __init__(self) -> None:
        super().__init__(background=current().chart_bg)
        _style(self, "Tokens over time", 130)
        self.setToolTip("Tokens streamed against seconds since send; orange dots: drafted tokens the model accepted")
        self.curve = self.plot([], [], pen=pg.mkPen(LINE, width=2), antialias=False)
        self.curve.setDownsampling(auto=True, method="peak")
        self.curve.setClipToView(True)
        self.drafts = pg.ScatterPlotItem(size=6, brush=pg.mkBrush(DRAFT), pen=pg.mkPen(None))
        self.addItem(self.drafts)
        self.points = 0
        self.drafted = 0
        self.disableAutoRange()
        self._range = (0.0, 0.0)

    def update_points(self, points: Sequence[TokenPoint], new_reply: bool = False) -> None:
        if new_reply:
            self.drafted = -1
        self.points = len(points)
        self.curve.setData([p.t for p in points], [p.count for p in points])
        drafted = [p for p in points if p.draft]
        if len(drafted) != self.drafted:
            self.drafted = len(drafted)
            self.drafts.setData([p.t for p in drafted], [p.count for p in drafted])
        last = points[-1] if points else None
        shown = (nice_ceiling(last.t), nice_ceiling(last.count)) if last else (1.0, 1.0)
        if shown != self._range:
            self._range = shown
            self.setRange(xRange=(0, shown[0]), yRange=(0, shown[1]), padding=0)


class HistoryChart(pg.GraphicsLayoutWidget):
    def __init__(self) -> None:
        super().__init__()
        self.setBackground(current().chart_bg)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setMinimumHeight(200)
        self.ttft = self.addPlot(row=0, col=0, title="TTFT per reply (s)")
        self.speed = self.addPlot(row=1, col=0, title="Tokens/s per reply")
        self.speed.setXLink(self.ttft)
        for plot in (self.ttft, self.speed):
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            _colour_plot(plot, current().chart_axis)
            plot.showGrid(x=False, y=True, alpha=0.15)
        # the legend has a row of its own under the charts, so it never covers a point
        self.legend = pg.LegendItem(colCount=1, labelTextColor=current().chart_axis, labelTextSize="8pt")
        self.addItem(self.legend, row=2, col=0)
        self.series: dict[str, tuple[pg.ScatterPlotItem, pg.ScatterPlotItem]] = {}
        self.count = 0

    def update_history(self, points: Sequence[HistoryPoint]) -> None:
        self.count = len(points)
        by_label: dict[str, list[tuple[int, HistoryPoint]]] = {}
        for i, point in enumerate(points, start=1):
            by_label.setdefault(point.config.short(), []).append((i, point))
        for label, items in by_label.items():
            if label not in self.series:
                n = len(self.series)
                colour, symbol = PALETTE[n % len(PALETTE)], SYMBOLS[n % len(SYMBOLS)]
                style = {"symbol": symbol, "size": 8, "brush": pg.mkBrush(colour), "pen": pg.mkPen(colour)}
                top = pg.ScatterPlotItem(name=label, **style)
                bottom = pg.ScatterPlotItem(**style)
                self.ttft.addItem(top)
                self.speed.addItem(bottom)
                self.legend.addItem(top, label)
                self.series[label] = (top, bottom)
            top, bottom = self.series[label]
            top.setData(
                [i for i, p in items if p.ttft_s is not None], [p.ttft_s for _, p in items if p.ttft_s is not None]
            )
            bottom.setData(
                [i for i, p in items if p.tokens_per_s is not None],
                [p.tokens_per_s for _, p in items if p.tokens_per_s is not None],
            )
        self.ttft.setXRange(0.5, max(len(points), 1) + 0.5, padding=0)
        ticks = [[(n, str(n)) for n in reply_ticks(len(points))]]
        for plot in (self.ttft, self.speed):
            plot.getAxis("bottom").setTicks(ticks)  # replies are counted: 1, 2, 3, never 1.5


def reply_ticks(count: int, most: int = 8) -> list[int]:
    """Whole reply numbers to label on an axis of ``count`` replies: at most ``most``, evenly spaced."""
    step = max(1, math.ceil(count / most))
    return list(range(1, max(count, 1) + 1, step))


class BarsChart(pg.PlotWidget):
    def __init__(self, title: str) -> None:
        super().__init__(background=current().chart_bg)
        _style(self, title, 150, grid=True)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.6, **_colours([]))
        self.addItem(self.bars)

    def update_bars(self, labels: Sequence[str], values: Sequence[float | None]) -> None:
        shown = [(i, v or 0.0) for i, v in enumerate(values)]
        self.bars.setOpts(
            x=[i for i, _ in shown],
            height=[v for _, v in shown],
            **_colours([PALETTE[i % len(PALETTE)] for i, _ in shown], outline=False),
        )
        self.getAxis("bottom").setTicks([[(i, label) for i, label in enumerate(labels)]])
        self.setXRange(-0.6, max(len(labels), 1) - 0.4, padding=0)


def apply_theme(chart: pg.PlotWidget | HistoryChart) -> None:
    """Recolour a chart for the theme in use (``app.views.style.current``): background, axes, titles, legend."""
    theme = current()
    chart.setBackground(theme.chart_bg)
    plots = [chart.ttft, chart.speed] if isinstance(chart, HistoryChart) else [chart.getPlotItem()]
    for plot in plots:
        _colour_plot(plot, theme.chart_axis)
    if isinstance(chart, HistoryChart):
        chart.legend.setLabelTextColor(theme.chart_axis)
