"""The window's layout (issue 24): the chat keeps its share, the panel can always be found again, and the
layout is remembered across starts (a damaged layout file costs only the layout); no engine warning is dropped."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.panels.latency import summary_text
from app.views.style import luminance
from app.window import MainWindow
from app.window.layout import CHAT_SHARE, LAYOUT_FILE, PANEL_SHORTCUT, LayoutFile, default_widths
from engine.api import Warning
from tests.support.gui_harness import chat


def chat_share(window: MainWindow) -> float:
    return window.splitter.widget(1).width() / window.width()


def settle(qtbot, window: MainWindow) -> None:  # noqa: ANN001
    qtbot.waitUntil(lambda: window.splitter.widget(1).width() > 0)
    qtbot.wait(50)  # the dock layout settles after the window is shown


@pytest.mark.parametrize("size", [(1100, 740), (1400, 860)])
def test_the_chat_keeps_its_share_and_the_panel_fits_without_scrolling_sideways(harness, qtbot, size) -> None:  # noqa: ANN001
    window = harness.open(size=size)
    window.reset_layout()
    settle(qtbot, window)
    assert window.latency.dock.isVisible()
    assert chat_share(window) >= CHAT_SHARE - 0.01, chat_share(window)
    panel = window.latency.panel
    assert panel.widget().width() <= panel.viewport().width(), "the panel's body fits its width"
    assert panel.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff


def test_at_800_px_the_panel_starts_closed_and_the_view_menu_opens_it(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(size=(800, 500))
    window.reset_layout()
    settle(qtbot, window)
    assert default_widths(800)[1] is None
    assert not window.latency.dock.isVisible() and chat_share(window) >= CHAT_SHARE
    view = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    assert window.panel_action in view.actions() and window.panel_action.text() == "Latency panel"
    assert window.panel_action.shortcut().toString() == PANEL_SHORTCUT
    window.panel_action.trigger()
    qtbot.waitUntil(window.latency.dock.isVisible)


def test_a_closed_panel_comes_back_from_the_menu_and_the_shortcut(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    dock = window.latency.dock
    dock.close()
    qtbot.waitUntil(lambda: not dock.isVisible())
    assert not window.panel_action.isChecked()
    window.panel_action.trigger()
    qtbot.waitUntil(dock.isVisible)
    dock.setFloating(True)
    window.reset_layout_action.trigger()
    assert not dock.isFloating() and window.dockWidgetArea(dock) == Qt.DockWidgetArea.RightDockWidgetArea


def test_a_closed_panel_leaves_a_one_line_summary_that_opens_it(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    settle(qtbot, window)
    summary = window.latency_summary
    assert window.panel_action.isChecked() and not summary.isVisible()  # the panel says it all
    window.latency.dock.close()
    qtbot.waitUntil(summary.isVisible)
    assert summary.text() == "Latency: no reply yet"
    assert summary.x() < window.tools_button.x(), "left of the Tools button, at the foot of the window"
    chat(qtbot, window, "Hello")
    window.latency.panel.flush()
    assert summary.text().startswith("Latency: TTFT 0.21 s") and "tok/s" in summary.text(), summary.text()
    assert summary.text() == summary_text(window.latency.trace)
    qtbot.mouseClick(summary, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.panel_action.isChecked() and not summary.isVisible())
    assert window.latency.dock.isVisible()


def test_the_layout_is_remembered_and_a_damaged_file_costs_only_the_layout(harness, qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / LAYOUT_FILE
    first = harness.open(size=(1100, 740), layout_file=LayoutFile(path))
    first.latency.dock.close()
    first.resize(1234, 700)
    harness.close(first)
    assert path.is_file(), "closing the window keeps its layout"
    second = harness.open(size=(900, 640), layout_file=LayoutFile(path))
    settle(qtbot, second)
    assert not second.latency.dock.isVisible(), "the closed panel stays closed"
    harness.close(second)

    path.write_text('{"version": 1, "geometry": "not base64 !", "state": 7}')
    third = harness.open(size=(1100, 740), layout_file=LayoutFile(path))
    settle(qtbot, third)
    assert third.latency.dock.isVisible() and chat_share(third) >= CHAT_SHARE - 0.01, "the defaults"
    assert (tmp_path / f"{LAYOUT_FILE}.bad").read_text().startswith('{"version": 1, "geometry": "not'), "kept aside"
    harness.close(third)
    assert LayoutFile(path).load() is not None, "and the next close writes a good one"


@pytest.mark.parametrize(
    ("kind", "message", "shown"),
    [
        ("cache", "The answer cache is off (database is locked); every reply comes from the model.", "Cache: "),
        ("engine", "rewarm failed (OSError: disk full); the engine goes on.", "Engine: "),
        ("surprise", "Something new happened.", "Surprise: "),
    ],
)
def test_every_warning_kind_is_shown_once_not_dropped(harness, qtbot, kind: str, message: str, shown: str) -> None:  # noqa: ANN001
    window = harness.open()
    window.bridge.event.emit(Warning(kind, message))
    window.bridge.event.emit(Warning(kind, message))  # the same kind again: one banner, not two
    banners = [b for key, b in window._banners.items() if key == f"warning-{kind}"]
    assert len(banners) == 1 and banners[0].text() == shown + message and not banners[0].isHidden()


def test_the_history_chart_counts_whole_replies_and_its_legend_covers_no_point(qtbot) -> None:  # noqa: ANN001
    from app.panels.charts import HistoryChart, reply_ticks
    from app.state.config import HistoryPoint, ReplyConfig

    assert reply_ticks(1) == [1] and reply_ticks(3) == [1, 2, 3] and reply_ticks(20) == [1, 4, 7, 10, 13, 16, 19]
    chart = HistoryChart()
    qtbot.addWidget(chart)
    configs = [
        ReplyConfig(),
        ReplyConfig(stream=False),
        ReplyConfig(speculative="lookup"),
        ReplyConfig(prefix_cache=False),
        ReplyConfig(quant="fp16-cpu"),
        ReplyConfig(quant="q8-cpu", speculative="lookup"),
    ]
    chart.update_history([HistoryPoint(0.1 * (i + 1), 50.0 + i, c) for i, c in enumerate(configs)])
    chart.resize(300, 260)
    chart.show()
    qtbot.waitExposed(chart)
    assert len(chart.legend.items) == len({c.short() for c in configs}) == 6, "every configuration in the legend"
    legend = chart.legend.sceneBoundingRect()
    for plot in (chart.ttft, chart.speed):
        assert not legend.intersects(plot.vb.sceneBoundingRect()), "the legend sits outside the data"
        ticks = plot.getAxis("bottom")._tickLevels  # the labels drawn: whole reply numbers only
        assert ticks is not None and [v for v, _ in ticks[0]] == [1, 2, 3, 4, 5, 6]


def test_draft_model_is_greyed_with_the_reason_until_one_is_set(harness) -> None:  # noqa: ANN001
    import dataclasses

    window = harness.open()
    combo = window.latency.panel.switches.speculative
    draft = combo.model().item(combo.findData("draft"))
    assert not draft.isEnabled() and "No draft model is set" in draft.toolTip()
    window.apply_settings(dataclasses.replace(window.settings, draft_model="/models/tiny-draft"))
    assert draft.isEnabled() and "Set a draft model" not in draft.toolTip()


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_colours_are_readable_in_both_themes(theme: str) -> None:
    from app.views.style import DARK, LIGHT, stylesheet

    t = LIGHT if theme == "light" else DARK
    backgrounds = (t.window, t.side, t.hover)
    for name in ("text", "muted", "error", "warning", "badge", "tools_fg", "link"):  # WCAG AA for text: 4.5:1
        for background in backgrounds:
            ratio = contrast(getattr(t, name), background)
            assert ratio >= 4.5, (theme, name, background, round(ratio, 2))
    for name in ("text", "muted", "link"):  # on a code block and in a user's bubble too
        for background in (t.code_bg, t.user_bubble):
            assert contrast(getattr(t, name), background) >= 4.5, (theme, name, background)
    assert contrast(t.stop_fg, t.stop_bg) >= 4.5 and contrast("#ffffff", t.accent) >= 4.5  # Send, Stop
    assert contrast(t.draft, t.window) >= 3.0  # drafted tokens: a tint on text, told apart, still readable
    assert contrast(t.forced, t.window) >= 4.5  # tokens the reply's format forced: likewise, and readable as text
    sheet = stylesheet(t)
    assert ":focus" in sheet and "QPushButton:focus" in sheet and "{" in sheet and "t." not in sheet


def test_text_colours_are_readable_and_the_keyboard_focus_is_seen(harness) -> None:  # noqa: ANN001
    window = harness.open()
    panel = window.latency.panel
    charts = [panel.waterfall, panel.tokens, panel.history_chart]
    assert all(chart.focusPolicy() == Qt.FocusPolicy.NoFocus for chart in charts), "Tab goes past the charts"


def test_the_composers_placeholder_fits_its_one_line(qtbot) -> None:  # noqa: ANN001
    """The walk at 800x600 with the panel open: the placeholder wrapped and its second line showed cut in half."""
    from app.views.composer import PLACEHOLDER, Composer

    composer = Composer()
    qtbot.addWidget(composer)
    editor = composer.editor
    for width, full in ((380, False), (900, True)):
        composer.resize(width, 120)
        composer.show()
        qtbot.waitUntil(lambda w=width: composer.width() == w)
        room = editor.viewport().width() - 2 * editor.document().documentMargin()
        assert editor.fontMetrics().horizontalAdvance(editor.placeholderText()) <= room, width
        assert (editor.placeholderText() == PLACEHOLDER) is full, "the keys are named where they fit"
