"""The status bar at 800x600 (issue 50): no word cut mid-way, the full text in a tooltip, done messages go.

The walk saw "SmolLM2-13 · Switched to · Serving at h": labels clipped by a status bar too narrow for them,
and a message about a finished step that stayed for good.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import QAbstractButton, QLabel
from pytestqt.qtbot import QtBot

from app.views import status_area
from engine.api import Loaded

ELLIPSIS = "\u2026"

MODEL = "SmolLM2-135M-Instruct"
SWITCHED = "Switched to q8-cpu weights: 1.8x the speed of float32 on this machine, same greedy answers"
URL = "http://127.0.0.1:8080/v1"


def _shown(label: QLabel) -> str:
    """What ``label`` shows at its width (a plain QLabel shows its text, clipped where it is too narrow)."""
    shown_text = getattr(label, "shown_text", None)
    return shown_text() if callable(shown_text) else label.text()


def _whole_words(label: QLabel) -> bool:
    """The label shows its text, or its first whole words and an ellipsis, and what it shows fits."""
    shown, text = _shown(label), label.text()
    fits = label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()
    if shown == text:
        return fits
    words = shown.removesuffix(ELLIPSIS).rstrip(" \u00b7:,;").split(" ")
    return fits and shown.endswith(ELLIPSIS) and (words == [""] or text.split(" ")[: len(words)] == words)


def test_status_bar_at_800x600_cuts_no_word(harness, qtbot: QtBot) -> None:  # noqa: ANN001
    window = harness.open(size=(800, 600))
    area = window.status_area
    loaded = window.loaded
    assert isinstance(loaded, Loaded)
    window.status_area.loaded(dataclasses.replace(loaded, model_name=MODEL), 2.4)
    area.tuning(SWITCHED, done=True)
    area.serving(URL)
    qtbot.waitUntil(lambda: area.server_label.isVisible())
    bar = window.statusBar()
    labels = [area.model_label, area.device_label, area.message_label, area.server_label]
    for label in labels:
        assert _whole_words(label), (label.text(), _shown(label), label.width())
        assert label.geometry().right() <= area.contentsRect().right()
        if _shown(label) != label.text():
            assert label.tip().startswith(label.text())  # the full text is one hover away
    assert _shown(area.message_label) != SWITCHED  # the long message had to give way, by whole words
    assert _shown(area.model_label) == MODEL  # the model's name stays whole at this width
    for widget in bar.findChildren(QAbstractButton) + bar.findChildren(QLabel):
        if widget.isVisible() and widget not in labels:
            assert widget.width() >= widget.sizeHint().width(), widget.objectName()  # never clipped
    assert area.geometry().right() <= bar.contentsRect().right()


def test_done_messages_expire_and_progress_stays(harness, qtbot: QtBot, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(status_area, "TRANSIENT_MS", 150, raising=False)
    window = harness.open()
    area = window.status_area
    area.tuning(SWITCHED, done=True)
    assert area.message_label.text() == SWITCHED
    qtbot.waitUntil(lambda: area.message_label.text() == "", timeout=2000)
    area.tuning("Measuring float32 against bfloat16", done=False)  # still going: it stays
    assert area.message_label.text().startswith("Measuring") and not area._expiry.isActive()
    area.failed("no such file")
    assert area.message_label.text() == "Loading failed: no such file" and not area._expiry.isActive()
