"""GUI: the smaller defects of issue 13, each as the user saw it.

The rename editor clipped the title; spin-box arrows were empty boxes; the
status bar said "float32" for an fp16-cpu model; About showed raw key names,
a raw dict and raw byte counts; the load step's detail never reached the
window; the composer grew on the first key and never shrank; rendered
Markdown could open or load local files; the chat pane had blank space under
the last message.
"""

from __future__ import annotations

import dataclasses

import pytest
from gui_harness import Harness, chat, fake, last_bubble
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QDoubleSpinBox, QLineEdit
from pytestqt.qtbot import QtBot

from app.state import model_facts
from app.state.model_facts import LABELS, dtype_probe_text
from app.views import status_area
from app.views.markdown_render import render_reply
from app.views.status_area import StatusArea
from app.views.style import STYLESHEET
from engine.api import Loaded, ModelInfo

PROBE = {
    "dtype": "float32",
    "float32_step_ms": 49.12,
    "bfloat16_step_ms": 52.3,
    "float32_prefill32_ms": 80.0,
    "bfloat16_prefill32_ms": 95.5,
    "bfloat16_agreement": 0.9875,
    "torch": "2.5.0",
}


def test_the_rename_editor_is_tall_enough_for_the_title(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Something long about Lisbon")
    window.sidebar.rename(conversation_id)
    editor = window.sidebar.list_view.findChild(QLineEdit)
    assert editor is not None
    qtbot.waitUntil(editor.isVisible)
    assert editor.height() >= editor.sizeHint().height()
    assert editor.contentsRect().height() >= editor.fontMetrics().height()


def _dark_pixels(image: QImage, x0: int, x1: int, y0: int, y1: int) -> int:
    return sum(1 for x in range(x0, x1) for y in range(y0, y1) if QColor(image.pixel(x, y)).lightness() < 170)


def test_spin_boxes_draw_their_arrows(qtbot: QtBot) -> None:
    box = QDoubleSpinBox()
    qtbot.addWidget(box)
    box.setRange(0, 10)
    box.setValue(5)
    box.setStyleSheet(STYLESHEET)
    box.resize(140, 34)
    box.show()
    qtbot.waitExposed(box)
    image = box.grab().toImage()
    w, h = image.width(), image.height()
    assert _dark_pixels(image, w - 16, w - 6, h // 4 - 4, h // 4 + 4) >= 3  # the up arrow
    assert _dark_pixels(image, w - 16, w - 6, 3 * h // 4 - 4, 3 * h // 4 + 4) >= 3  # the down arrow


def test_the_status_bar_names_the_quantization_mode(qtbot: QtBot) -> None:
    area = StatusArea()
    qtbot.addWidget(area)
    area.loaded(Loaded("SmolLM2", "cpu", "float32", 1.0, ModelInfo(quant="fp16-cpu")))
    assert "fp16-cpu" in area.device_label.text() and "float32" not in area.device_label.text()
    assert "float32" in area.device_label.toolTip()
    area.loaded(Loaded("SmolLM2", "cpu", "bfloat16", 1.0, ModelInfo()))
    assert area.device_label.text() == "cpu \u00b7 bfloat16"


def test_about_labels_and_formats_every_model_fact() -> None:
    assert {f.name for f in dataclasses.fields(ModelInfo)} <= LABELS.keys()
    info = ModelInfo(
        parameters=134_515_008,
        weight_bytes=270_000_000,
        quant="fp16-cpu",
        packed_linears=211,
        quant_cached=True,
        quant_load_s=0.42,
        dtype_probe=PROBE,
        kv_reserved_bytes=64 << 20,
        warm_prefixes=2,
    )
    rows = model_facts.model_facts(Loaded("SmolLM2", "cpu", "float32", 1.5, info))
    assert rows["Memory reserved for the KV cache"] == "64.0 MB"
    assert rows["Weights in memory"] == "257.5 MB"
    assert rows["Parameters"] == "134.5 M"
    assert rows["Quantized copy from the cache"] == "yes"
    assert rows["CPU precision check"] == dtype_probe_text(PROBE)
    assert rows["CPU precision check"].startswith("Chose float32: a decode step took 49.1 ms in float32")
    assert "98.8 %" in rows["CPU precision check"] and "{" not in rows["CPU precision check"]
    assert all("_" not in label and label[0].isupper() for label in rows)
    assert "Draft quantization" not in rows  # no draft model: nothing to say
    assert model_facts.size_text(3 * 2**30) == "3.00 GB"


def test_the_load_step_is_shown_beside_the_bar_with_its_time(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(status_area.time, "monotonic", lambda: now[0])
    area = StatusArea()
    qtbot.addWidget(area)
    area.resize(900, 30)
    area.show()
    area.loading(0.1, "Converting GGUF model (first start only)")
    assert area.message_label.text() == "Converting GGUF model (first start only)"
    assert area.message_label.geometry().left() > area.progress.geometry().right()  # beside the bar
    now[0] += 12.4
    area._ticker.timeout.emit()
    assert area.message_label.text() == "Converting GGUF model (first start only) \u00b7 12 s"
    area.loading(0.9, "Measuring float32 against bfloat16")  # a new step starts its own clock
    assert area.message_label.text() == "Measuring float32 against bfloat16"
    area.loaded(Loaded("m", "cpu", "float32", 14.0))
    assert not area._ticker.isActive() and area.message_label.text() == "Loaded in 14.0 s"


def test_the_composer_fits_its_text_from_one_to_eight_lines(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    editor = window.composer.editor
    empty = editor.height()
    qtbot.keyClicks(editor, "a")
    assert editor.height() == empty  # the first key does not grow it
    editor.setPlainText("one\ntwo\nthree")
    three = editor.height()
    assert three > empty
    editor.setPlainText("\n".join(["line"] * 8))
    eight = editor.height()
    assert eight > three
    editor.setPlainText("\n".join(["line"] * 30))
    assert editor.height() == eight  # capped; the rest scrolls
    editor.setPlainText("short again")
    assert editor.height() == empty  # and it shrinks back
    assert editor.viewport().height() >= editor.fontMetrics().lineSpacing()


def test_markdown_never_opens_or_loads_local_files(qtbot: QtBot, harness: Harness) -> None:
    html = render_reply(
        "[passwords](file:///etc/passwd) ![secret](/home/me/secret.png) ![web](https://example.com/a.png) "
        "[docs](https://example.com/docs) <file:///etc/hosts> [rel](../../etc/passwd)"
    )
    assert "file:" not in html.replace("file:///etc/hosts", "")  # an autolink's text may stay, as text
    assert 'href="file' not in html and "<img" not in html
    assert 'href="../' not in html and "/home/me/secret.png" not in html
    assert '<a href="https://example.com/docs">docs</a>' in html
    assert '<a href="https://example.com/a.png">[web]</a>' in html
    assert "passwords" in html and "[secret]" in html

    window = harness.open()
    fake(window).tokens = ["See [this](file:///etc/passwd)."]
    chat(qtbot, window, "Links?")
    content = last_bubble(window).content
    assert not content.openExternalLinks()  # links go through the web-only handler
    assert "file:" not in content.text()


def test_no_blank_space_under_the_last_message(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = ["Answer paragraph. " * 40]
    for n in range(3):
        chat(qtbot, window, f"Question {n}")
    view = window.chat_view
    page = view.widget()
    qtbot.waitUntil(lambda: page.height() > view.viewport().height())
    last = last_bubble(window)
    blank = page.height() - last.geometry().bottom()
    assert blank <= 40, f"{blank} px of blank page under the last message"
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    assert last.mapTo(view.viewport(), last.rect().bottomLeft()).y() <= view.viewport().height()
