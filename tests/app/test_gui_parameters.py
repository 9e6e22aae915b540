"""The parameters panel (issue 24): each chat's own system prompt and sampling values, and presets.

Real windows on a real history file; the fake engine records the requests, so each test checks what a
reply is actually asked with."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDoubleSpinBox, QScrollArea, QSpinBox

from app.panels.parameters import CUSTOM
from app.window import MainWindow
from app.window.layout import CHAT_SHARE, PARAMETERS_SHORTCUT
from engine.storage import Settings, Store
from engine.storage.params import PresetFile
from tests.support.gui_harness import chat, fake

SHOTS = Path(os.environ.get("BRISK_SCREENSHOTS", "")) if os.environ.get("BRISK_SCREENSHOTS") else None


def set_value(qtbot, window: MainWindow, name: str, value: float) -> None:  # noqa: ANN001
    """Type a value into one of the panel's number boxes and press Enter, as a user does."""
    box = window.parameters.panel.fields[name]
    assert isinstance(box, QSpinBox | QDoubleSpinBox)
    box.selectAll()
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), str(value))
    qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)


def test_a_chat_keeps_its_own_values_and_a_new_chat_follows_the_defaults(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    panel = window.parameters.panel
    assert panel.heading.text() == "Next new chat" and panel.own == {}
    set_value(qtbot, window, "temperature", 0.7)
    set_value(qtbot, window, "max_tokens", 64)
    assert panel.own == {"temperature": 0.7, "max_tokens": 64}
    assert panel.labels["temperature"].font().bold() and not panel.labels["top_p"].font().bold()
    assert "2 values set for this chat" in panel.summary.text()
    tuned = chat(qtbot, window, "Hello")
    sampling = fake(window).requests[-1].sampling
    assert (sampling.temperature, sampling.max_tokens, sampling.top_p) == (0.7, 64, Settings().top_p)
    assert window.store.get_conversation(tuned).params == {"temperature": 0.7, "max_tokens": 64}
    assert panel.heading.text() == "This chat"

    window.new_chat()  # the next chat starts from the defaults again
    assert panel.own == {} and panel.fields["temperature"].value() == Settings().temperature  # type: ignore[attr-defined]
    chat(qtbot, window, "Another")
    assert fake(window).requests[-1].sampling == Settings().sampling()

    window.open_conversation(tuned)  # back to the tuned chat: its values, and its next reply uses them
    assert panel.own == {"temperature": 0.7, "max_tokens": 64}
    chat(qtbot, window, "Again")
    assert fake(window).requests[-1].sampling.temperature == 0.7
    panel.reset_button.click()
    assert window.store.get_conversation(tuned).params == {} and not panel.reset_button.isEnabled()
    assert "Follows the defaults" in panel.summary.text()


def test_untouched_chats_follow_settings_and_tuned_values_stay(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open()
    set_value(qtbot, window, "top_k", 40)
    tuned = chat(qtbot, window, "Tuned")
    window.new_chat()
    plain = chat(qtbot, window, "Plain")
    window.apply_settings(Settings(top_k=10, max_tokens=100))  # new defaults
    assert window.parameters.panel.fields["top_k"].value() == 10  # type: ignore[attr-defined]
    chat(qtbot, window, "Plain again")
    assert (fake(window).requests[-1].sampling.top_k, fake(window).requests[-1].sampling.max_tokens) == (10, 100)
    window.open_conversation(tuned)
    chat(qtbot, window, "Tuned again")
    assert (fake(window).requests[-1].sampling.top_k, fake(window).requests[-1].sampling.max_tokens) == (40, 100)
    assert plain != tuned


def test_the_system_prompt_is_the_chats_own(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open()
    first = chat(qtbot, window, "Hi")
    panel = window.parameters.panel
    assert panel.system_edit.toPlainText() == Settings().system_prompt
    panel.system_edit.setPlainText("Answer like a pirate.")
    qtbot.waitUntil(lambda: window.store.get_conversation(first).system_prompt == "Answer like a pirate.", timeout=3000)
    chat(qtbot, window, "Where is the treasure?")
    assert fake(window).requests[-1].messages[0] == {"role": "system", "content": "Answer like a pirate."}
    window.new_chat()
    assert panel.system_edit.toPlainText() == Settings().system_prompt  # other chats keep theirs
    chat(qtbot, window, "Hello")
    assert fake(window).requests[-1].messages[0]["content"] == Settings().system_prompt


def test_use_defaults_puts_back_the_default_system_prompt_too(harness, qtbot) -> None:  # noqa: ANN001
    """The button sets the whole panel as Settings has it: a preset's system prompt goes with its values."""
    window = harness.open()
    panel = window.parameters.panel
    assert not panel.reset_button.isEnabled()
    panel.preset_box.setCurrentText("Creative writing")
    panel.preset_box.activated.emit(panel.preset_box.currentIndex())
    tuned = chat(qtbot, window, "A story, please")
    assert window.store.get_conversation(tuned).system_prompt.startswith("You are an imaginative writer")
    panel.reset_button.click()
    kept = window.store.get_conversation(tuned)
    assert (kept.system_prompt, kept.params) == (Settings().system_prompt, {})
    assert panel.system_edit.toPlainText() == Settings().system_prompt and not panel.reset_button.isEnabled()
    assert not panel.system_label.font().bold()
    assert panel.preset_box.currentText() == "Brisk default" and "Follows the defaults" in panel.summary.text()
    chat(qtbot, window, "Another, please")
    assert fake(window).requests[-1].messages[0]["content"] == Settings().system_prompt

    panel.system_edit.setPlainText("Answer like a pirate.")  # a prompt of its own alone: the button is there too
    panel.system_edit.left.emit()
    assert panel.reset_button.isEnabled() and panel.summary.text().startswith("This chat has its own system prompt")
    assert panel.system_label.font().bold()
    panel.reset_button.click()
    assert window.store.get_conversation(tuned).system_prompt == Settings().system_prompt


def test_presets_apply_save_and_delete(harness, qtbot, brisk_data_dir: Path) -> None:  # noqa: ANN001
    window = harness.open()
    panel = window.parameters.panel
    names = [panel.preset_box.itemText(i) for i in range(panel.preset_box.count())]
    assert names[0] == "Brisk default" and "Creative writing" in names  # the defaults match the default preset
    assert not panel.delete_button.isEnabled()  # built-in
    panel.preset_box.setCurrentText("Creative writing")
    panel.preset_box.activated.emit(panel.preset_box.currentIndex())
    assert panel.own["temperature"] == 0.8 and panel.preset_box.currentText() == "Creative writing"
    assert "applies from the next message" in window.composer.hint.text()
    chat(qtbot, window, "A story, please")
    request = fake(window).requests[-1]
    assert request.sampling.temperature == 0.8 and request.sampling.max_tokens == 1024
    assert request.messages[0]["content"].startswith("You are an imaginative writer")

    set_value(qtbot, window, "temperature", 1.1)  # no longer the preset's values
    assert panel.preset_box.currentText() == CUSTOM
    panel.save_requested.emit("Wild stories")
    assert panel.preset_box.currentText() == "Wild stories" and panel.delete_button.isEnabled()
    other = harness.open(store=Store(brisk_data_dir / "brisk.db"))  # a second window sees it
    assert "Wild stories" in [p.name for p in other.parameters.presets.presets()]
    assert PresetFile().find("wild stories") is not None
    panel.save_requested.emit("Creative writing")  # a built-in name: refused, said
    banner = window.banner("parameters")
    assert banner is not None and "built-in" in banner.text()
    panel.delete_requested.emit("Wild stories")
    assert PresetFile().find("Wild stories") is None
    assert panel.preset_box.currentText() == CUSTOM


def test_a_chat_can_ask_for_json_replies_and_a_broken_schema_is_said_not_kept(harness, qtbot) -> None:  # noqa: ANN001
    import json

    from engine.api import format_kind, reply_format

    window = harness.open(size=(1100, 740))
    panel = window.parameters.panel
    assert panel.format_box.currentText() == "Free text" and not panel.schema_edit.isVisible()
    panel.format_box.setCurrentIndex(panel.format_box.findData("json_schema"))
    panel.format_box.activated.emit(panel.format_box.currentIndex())
    assert panel.schema_edit.isVisible() and panel.schema_file.isVisible()
    panel.schema_edit.setPlainText('{"type": "object", "properties": {"city": {"type": "strin')  # cut short
    panel.schema_edit.left.emit()
    assert panel.format_problem.isVisible() and "Not JSON" in panel.format_problem.text()
    assert "format" not in panel.own  # nothing unusable is kept
    panel.schema_edit.setPlainText('{"type": "object", "properties": {"city": {"type": "strin"}}}')
    panel.schema_edit.left.emit()  # JSON, but the grammar library refuses it: its words are shown
    assert panel.format_problem.isVisible() and "strin" in panel.format_problem.text()
    assert "format" not in panel.own
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    panel.schema_edit.setPlainText(json.dumps(schema))
    panel.schema_edit.left.emit()
    assert not panel.format_problem.isVisible()
    assert panel.own["format"] == reply_format("json_schema", schema) and panel.format_label.font().bold()
    conversation = chat(qtbot, window, "A city, please")
    assert fake(window).requests[-1].sampling.format == reply_format("json_schema", schema)
    assert window.store.get_conversation(conversation).params["format"] == reply_format("json_schema", schema)

    window.new_chat()  # a new chat writes free text again; the JSON chat keeps its schema
    assert panel.format_box.currentText() == "Free text" and "format" not in panel.own
    chat(qtbot, window, "Just talk")
    assert fake(window).requests[-1].sampling.format == ""
    window.open_conversation(conversation)
    assert format_kind(panel.own["format"]) == "json_schema" and json.loads(panel.schema_edit.toPlainText()) == schema
    panel.format_box.setCurrentIndex(panel.format_box.findData("json_object"))
    panel.format_box.activated.emit(panel.format_box.currentIndex())
    assert not panel.schema_edit.isVisible() and panel.own["format"] == reply_format("json_object")


def test_the_view_menu_brings_the_parameters_tab_forward_and_the_chat_keeps_its_share(harness, qtbot) -> None:  # noqa: ANN001
    window = harness.open(size=(1100, 740))
    window.reset_layout()
    qtbot.waitUntil(lambda: window.latency.dock.isVisible())
    assert window.tabifiedDockWidgets(window.latency.dock) == [window.parameters.dock]
    qtbot.waitUntil(lambda: not window.parameters_action.isChecked())  # behind the latency tab
    assert window.parameters_action.shortcut().toString() == PARAMETERS_SHORTCUT
    window.parameters_action.trigger()
    qtbot.waitUntil(window.parameters_action.isChecked)
    assert not window.panel_action.isChecked()  # its tab went behind
    assert window.splitter.widget(1).width() / window.width() >= CHAT_SHARE - 0.01
    panel = window.parameters.panel
    assert panel.width() >= 240
    scroll = panel.findChild(QScrollArea)
    assert scroll is not None
    qtbot.waitUntil(lambda: scroll.widget().width() <= scroll.viewport().width())  # no sideways scrolling
    for name, label in panel.labels.items():  # every row readable: the label whole, the field inside the panel
        assert label.width() >= label.sizeHint().width(), name
        field = panel.fields[name]
        assert field.mapTo(scroll.widget(), field.rect().topRight()).x() < scroll.viewport().width(), name
    if SHOTS is not None:
        chat(qtbot, window, "Hello")
        qtbot.wait(50)
        window.grab().save(str(SHOTS / "parameters.png"))
    window.parameters_action.trigger()  # in view: hides it, and the latency tab is in view again
    qtbot.waitUntil(lambda: window.parameters.dock.isHidden() and window.panel_action.isChecked())


def test_a_dark_theme_from_settings_colours_the_whole_window_and_light_comes_back(harness, qtbot) -> None:  # noqa: ANN001
    import dataclasses

    from PySide6.QtWidgets import QApplication

    from app.views import markdown_render, style

    assert style.theme_for("system", True) is style.DARK and style.theme_for("system", False) is style.LIGHT
    assert style.theme_for("light", True) is style.LIGHT and style.theme_for("dark", False) is style.DARK
    window = harness.open(size=(1100, 740))
    chat(qtbot, window, "Hello")
    try:
        window.apply_settings(dataclasses.replace(window.settings, theme="dark"))
        assert style.current() is style.DARK
        assert style.DARK.window in window.styleSheet()
        assert QApplication.palette().color(QApplication.palette().ColorRole.Window).name() == style.DARK.side
        assert style.DARK.code_bg == markdown_render.CODE_BG
        assert style.DARK.code_bg in markdown_render.render_reply("```python\nx = 1\n```")  # a dark code block
        panel = window.latency.panel
        assert panel.history_chart.backgroundBrush().color().name() == style.DARK.chart_bg
        window.latency.panel.flush()
        qtbot.wait(50)
        image = window.chat_view.viewport().grab().toImage()
        bubble = window.chat_view.visualRect(window.chat_view.index_of(window.chat_view.chat_model.rows[-1].message_id))
        pixel = image.pixelColor(bubble.left() + 12, bubble.top() + bubble.height() // 2).name()
        assert style.luminance(pixel) < 0.1, pixel  # the reply's bubble is painted dark
        if SHOTS is not None:
            window.grab().save(str(SHOTS / "dark.png"))
    finally:
        window.apply_settings(dataclasses.replace(window.settings, theme="light"))
    assert style.current() is style.LIGHT and style.LIGHT.code_bg == markdown_render.CODE_BG
    assert style.LIGHT.window in window.styleSheet()
