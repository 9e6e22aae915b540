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
import json
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QDoubleSpinBox, QLineEdit
from pytestqt.qtbot import QtBot

from app import quant_probe
from app.dialogs.settings import SettingsDialog
from app.dialogs.speed import QUANT_HELP
from app.launch import show_settings_problems
from app.state import model_facts
from app.state.config import config_tooltip
from app.state.model_facts import LABELS, dtype_probe_text
from app.views import status_area
from app.views.markdown_render import render_reply
from app.views.status_area import StatusArea
from app.views.style import STYLESHEET
from engine.api import Loaded, ModelInfo
from engine.storage import Settings
from tests.support.gui_harness import Harness, chat, click_action, fake, last_bubble

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
    editor.setPlainText("ok")  # short enough for one line however narrow the pane
    assert editor.height() == empty  # and it shrinks back
    assert editor.viewport().height() >= editor.fontMetrics().lineSpacing()
    words = "word " * 200  # one paragraph, no newline: wrapped lines count too
    editor.setPlainText(words)
    assert editor.height() == eight


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
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)  # more than a screenful
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())  # and it shows the end

    def last_box() -> QRect:
        box = view.row_layout(last_bubble(window).message_id)
        assert box is not None
        return box.bubble

    viewport = view.viewport().rect()
    qtbot.waitUntil(lambda: last_box().bottom() <= viewport.bottom())  # the last message is all in view...
    blank = viewport.bottom() - last_box().bottom()
    assert blank <= 40, f"{blank} px of blank page under the last message"  # ...with no blank page under it
    assert last_box().top() < viewport.bottom()


# -- loose ends of the window (issue 18's GUI pass) --------------------------------------------------


def test_compare_and_the_reply_tooltip_are_wired_to_the_latency_panel(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open(settings=Settings(quant="none"))
    conversation_id = chat(qtbot, window, "Hi")
    view = window.chat_view
    user, reply = view.bubbles()
    assert window.latency.dialog is None
    click_action(qtbot, window, user.message_id, "compare")  # offered because the panel is there
    dialog = window.latency.dialog
    assert dialog is not None and dialog.isVisible() and "Hi" in dialog.messages[-1]["content"]
    dialog.close()

    ran_with = config_tooltip(window.latency.config())
    assert ran_with.startswith("Ran with\n") and reply.tooltip == ran_with  # the live reply's configuration
    assert user.tooltip == ""
    window.latency.apply_switches(dataclasses.replace(window.latency.config(), prefix_cache=False))
    window.open_conversation(conversation_id)  # reopened: read from the stored metrics, as it ran
    reopened = view.bubbles()[-1]
    assert reopened.tooltip == ran_with and "Prefix cache: on" in reopened.tooltip


def test_settings_that_could_not_be_used_are_said_once_in_a_banner(
    qtbot: QtBot, harness: Harness, brisk_data_dir: Path
) -> None:
    (brisk_data_dir / "settings.json").write_text(json.dumps({"max_tokens": "16", "quant": "int3"}))
    settings, problems = Settings.load_with_problems()
    window = harness.open(settings=settings)
    assert window.banner("settings-problems") is None
    show_settings_problems(window, problems)
    banner = window.banner("settings-problems")
    assert banner is not None and banner.kind == "warning"
    assert "max_tokens must be a whole number" in banner.text() and "using 512" in banner.text()
    assert "quant must be one of" in banner.text()
    show_settings_problems(window, [])  # nothing wrong: no banner
    other = harness.open()
    show_settings_problems(other, [])
    assert other.banner("settings-problems") is None


def test_about_says_why_each_probe_chose_what_it_did() -> None:
    reason = "bfloat16 is not clearly faster at decode (decode 52.30 ms against float32's 49.12 ms; needs 15 % faster)"
    probe = {**PROBE, "reason": reason, "saved": True}
    mode = {
        "mode": "fp16-cpu",
        "dtype": "float32",
        "chosen": "fp16-cpu",
        "reason": "fp16-cpu is the fastest mode that keeps the answers",
        "modes": {"float32": {"step_ms": 49.1, "agreement": 1.0}, "fp16-cpu": {"step_ms": 22.04, "agreement": 0.994}},
        "saved": False,
    }
    rows = model_facts.model_facts(Loaded("SmolLM2", "cpu", "float32", 1.5, ModelInfo(dtype_probe=probe)))
    assert rows["CPU precision check"].endswith(f" Why: B{reason[1:]}.")
    assert "Not saved" not in rows["CPU precision check"]
    facts = model_facts.model_facts(
        Loaded("SmolLM2", "cpu", "float32", 1.5, ModelInfo(quant="fp16-cpu", mode_probe=mode))
    )
    text = facts[LABELS["mode_probe"]]
    assert text.startswith("Chose fp16-cpu: a decode step took float32 49.1 ms, 100.0 % agreement; fp16-cpu 22.0 ms")
    assert "Why: Fp16-cpu is the fastest mode that keeps the answers." in text
    assert text.endswith("Not saved: it is measured again at the next start.")


def test_a_remote_model_is_described_by_its_server() -> None:
    loaded = Loaded(
        "meta-llama/Llama-3.3-70B-Instruct", "remote", "", 0.2, ModelInfo(endpoint="http://gpu-box:8000/v1")
    )
    rows = model_facts.model_facts(loaded)
    assert rows == {
        "Model": "meta-llama/Llama-3.3-70B-Instruct",
        "Device": "remote",
        "Load time": "0.20 s",
        "Server": "http://gpu-box:8000/v1",
    }  # no "0 bytes" of weights or "none" quantization: a server does not say
    area = StatusArea()
    area.loaded(loaded)
    assert area.device_label.text() == "remote \u00b7 gpu-box:8000"
    assert "http://gpu-box:8000/v1" in area.device_label.toolTip() and "measured here" in area.device_label.toolTip()
    assert area.message_label.text() == "Connected in 0.2 s"
    area.deleteLater()


FAKE_QUANT = """
MODES = ("none", "int8-cpu", "bnb-nf4")


def availability(device):
    return {"none": None, "int8-cpu": None, "bnb-nf4": "needs a CUDA GPU"}


def descriptions():
    return {"none": "As loaded", "int8-cpu": "8-bit weights, measured: slower than float32 on this CPU"}
"""


def test_quantization_tooltips_are_the_engines_descriptions(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "described_quant.py").write_text(FAKE_QUANT, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(quant_probe, "QUANT_MODULE", "described_quant")
    monkeypatch.setattr(quant_probe, "_cache", {})
    dialog = SettingsDialog(Settings(device="cpu", quant="none"))
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.speed.quant_ready, timeout=60_000)
    box = dialog.speed.quant
    tips = {box.itemData(row): box.itemData(row, Qt.ItemDataRole.ToolTipRole) for row in range(box.count())}
    assert tips == {
        "auto": QUANT_HELP["auto"],  # the app's own entry: it measures at the first load
        "none": "As loaded",
        "int8-cpu": "8-bit weights, measured: slower than float32 on this CPU",  # engine.quant's words, not ours
        "bnb-nf4": "needs a CUDA GPU",  # greyed: why not
    }
    assert quant_probe.quant_descriptions("cpu")["int8-cpu"].startswith("8-bit weights")


def test_a_first_start_is_usable_while_the_modes_are_measured_and_says_so(qtbot: QtBot, harness: Harness) -> None:
    """The engine loads float32, then measures the weight modes between replies and switches (Tuning events)."""
    from engine.api import Loaded, ModelInfo, Tuning
    from tests.support.gui_harness import chat, fake

    window = harness.open()
    engine = fake(window)
    engine.load_steps = [(0.1, "Converting GGUF model (first start only)"), (0.8, "Loading weights")]
    bar_values: list[int] = []
    window.status_area.progress.valueChanged.connect(bar_values.append)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()  # the same engine loads again, this time with a first start's steps
    assert fake(window) is engine and bar_values and bar_values == sorted(bar_values), "progress never goes back"
    said = window.status_area.message_label.text()
    assert said.startswith("Loaded in ") and window.model_ready and window.composer.ready

    def engine_says(event: object) -> None:
        with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: e is event):
            engine.on_event(event)

    engine_says(Tuning("Chatting on float32 while the faster weight modes are measured in the background"))
    label = window.status_area.message_label
    assert label.text().startswith("Chatting on float32") and not window.status_area.progress.isVisible()
    chat(qtbot, window, "Hello")  # usable meanwhile
    assert window.composer.ready
    engine_says(Tuning("Measuring the weight modes in the background: q8-cpu loaded (3 of 4 modes)"))
    assert "q8-cpu loaded" in label.text()
    switched = Loaded("fake-model", "cpu", "float32", 0.01, ModelInfo(quant="q8-cpu"))
    engine_says(switched)
    engine_says(Tuning("Switched to q8-cpu (decode steps 5.0x as fast as float32), measured in the background", True))
    assert label.text().startswith("Switched to q8-cpu") and window.model_ready and window.composer.ready
    assert "q8-cpu" in window.status_area.device_label.text()
