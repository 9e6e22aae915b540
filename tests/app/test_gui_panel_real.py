"""The latency panel on a real reply (the tiny model; the bundled one with BRISK_PANEL_MODEL=bundled), and the
README's screenshot (regenerate it with the bundled model: BRISK_PANEL_MODEL=bundled pytest this file).

A window on the real engine answers two messages with prompt lookup on; the
panel is grabbed mid-way through the second reply (docs/screenshot-panel.png)
and checked at the end against the reply's own Metrics: every span of the
waterfall, the prompt reuse, the per-source draft figures.  Figures are
compared with the engine's, never with fixed numbers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.panels.numbers import DASH
from app.window.main_window import MainWindow
from engine.api import Done, Loaded, LoadFailed, Token
from engine.client import local_backend
from engine.storage import Settings, Store

# Screenshots go to the README's docs/ only when asked (BRISK_SHOTS=docs); a plain test run leaves the tree alone.
DOCS = Path(os.environ.get("BRISK_SHOTS") or tempfile.mkdtemp(prefix="brisk-shots-"))
FIRST = "Name three planets of the solar system and say one fact about each."
SECOND = "Now write those three facts again as a numbered list, then add one more fact about Mars."


def ask(qtbot: QtBot, window: MainWindow, text: str) -> Done:
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=180_000) as got:
        window.composer.editor.setPlainText(text)
        window.composer.send_requested.emit(text)
    qtbot.waitUntil(lambda: window.session.active is None)
    return got.args[0]


def test_panel_on_a_real_reply(qtbot: QtBot, tmp_path: Path, tiny_dir: Path) -> None:
    bundled = os.environ.get("BRISK_PANEL_MODEL") == "bundled"
    model = "" if bundled else str(tiny_dir)
    settings = Settings(  # no loop stop: the tiny model loops at once, and the panel is looked at mid-reply
        model=model,
        speculative="lookup",
        max_tokens=160,
        system_prompt="You are a helpful assistant.",
        dtype="float32",
        stop_repeats=0,
    )
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(Store(tmp_path / "brisk.db"), bridge, settings, settings_path=tmp_path / "settings.json")
    qtbot.addWidget(window)
    window.resize(1440, 900)
    window.show()
    window.resizeDocks([window.latency.dock], [430], Qt.Orientation.Horizontal)
    panel = window.latency.panel
    shot: list[bool] = []

    def grab_mid_reply(event: object) -> None:
        trace = panel.trace
        if isinstance(event, Token) and not shot and trace is not None and trace.tokens >= 60:
            shot.append(True)
            panel.flush()
            window.chat_view.reply_updated(window.session.active) if window.session.active else None
            DOCS.mkdir(exist_ok=True)
            window.grab().save(str(DOCS / ("screenshot-panel.png" if bundled else "screenshot-panel-tiny.png")))

    try:
        with qtbot.waitSignal(
            bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=300_000
        ):
            window.load_model()
        assert window.model_ready, window.status_area.message_label.text()
        assert panel.numbers.text("model") != DASH
        ask(qtbot, window, FIRST)
        bridge.event.connect(grab_mid_reply)
        done = ask(qtbot, window, SECOND)
        panel.flush()
        m = done.metrics
        numbers = panel.numbers
        assert numbers.text("ttft") == f"{m.ttft_s:.3f} s"
        assert numbers.text("prompt") == (
            f"{m.computed_tokens or m.prompt_tokens - m.cached_tokens} computed \u00b7 {m.cached_tokens} reused of "
            f"{m.prompt_tokens}"
        )
        assert m.cached_tokens > 0  # the first turn's KV was reused
        assert [s.name for s in panel.waterfall.spans] == [s.name for s in m.spans]
        assert {"prefill", "decode"} <= {s.name for s in m.spans}
        assert panel.tokens.points == len([e for e in panel.trace.points])  # one point per Token event
        assert panel.trace.tokens == m.completion_tokens
        if m.drafted:
            assert "lookup" in numbers.text("drafts")
        assert panel.history_chart.count == 2
        assert shot, "the reply ended before 60 tokens; no screenshot"
    finally:
        window.close()
        bridge.shutdown()
        window.store.close()
