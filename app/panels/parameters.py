"""The parameters panel: the open chat's system prompt and sampling values, and presets.

:class:`ParametersPanel` shows one chat's values (:meth:`show_chat`: its system
prompt, the values set for it alone and the defaults the others follow) and
emits ``changed(system_prompt, own)`` when the user edits one: ``own`` holds
only the values that differ from the defaults, so a chat nobody tuned follows
Settings.  Labels of values set for this chat are bold (the system prompt's too
when it is not the default one the window passes as ``default_system``), and
the line under the form says how many there are; "Use defaults" puts back the
default system prompt and clears the values: the whole panel as Settings has
it, as a preset sets both.  The system prompt is sent 600 ms after typing
stops, or when the box loses focus.

The reply format (free text, any JSON object, or JSON matching a schema pasted
or read from a file) is one more value of the chat: a schema that is not JSON,
or that the grammar library refuses (``check_format``), is said under the box
in the library's words and not kept.

A thinking model's switch ("Thinking": as the model does, on, off; the chat option ``thinking`` of
``engine.storage.params.CHAT_OPTIONS``, kept only when not "auto") shows only while the loaded model's
template takes one (:meth:`set_thinking_switch`, from ``ModelInfo.thinking_switch``).

Presets (``engine.storage.params``): choosing one in the list emits
``preset_chosen(name)``; "Save as…" asks for a name and emits
``save_requested(name)``; "Delete" emits ``delete_requested(name)`` for a
preset of the user's (built-in ones are greyed).  The list shows the preset
the chat matches, or "Custom".  Nothing here reads or writes files: the
window's :class:`~app.window.parameters.ParametersController` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QFocusEvent, QIntValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.views.controls import guard_wheel
from engine.api import format_kind, reply_format
from engine.storage.params import Preset

CUSTOM = "Custom"
FORMATS = (("Free text", "text"), ("JSON (any object)", "json_object"), ("JSON matching a schema", "json_schema"))
THINKING = (("As the model does", "auto"), ("On", "on"), ("Off", "off"))  # params.CHAT_OPTIONS["thinking"]
FIELD_MIN_WIDTH = 80
SAVE_DELAY_MS = 600
LOOP_STOP = 3  # stop_repeats when "End a reply that repeats itself" is on (Settings' default)
TIPS = {
    "temperature": "0: greedy, the same reply every time (and answers can come from the answer cache); "
    "higher: more varied",
    "top_p": "Sample only from the most likely tokens that together reach this probability (1: all)",
    "top_k": "Sample only from this many most likely tokens (off: all)",
    "repetition_penalty": "Above 1 makes tokens said in the reply's last 64 less likely, so replies loop less (1: off)",
    "max_tokens": "The longest reply, in tokens",
    "seed": "The same seed gives the same sampled reply; empty: a new one each time",
    "stop_repeats": "End the reply when it says the same block three times in a row",
}


class _PromptEdit(QPlainTextEdit):
    left = Signal()

    def focusOutEvent(self, event: QFocusEvent) -> None:  # noqa: N802 (Qt override)
        super().focusOutEvent(event)
        self.left.emit()


def _double(low: float, high: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setKeyboardTracking(False)  # typed digits count when the box is left or Enter is pressed
    return box


class ParametersPanel(QWidget):
    changed = Signal(str, dict)  # (system prompt, the values set for this chat alone)
    preset_chosen = Signal(str)
    save_requested = Signal(str)
    delete_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("parametersPanel")
        self.defaults: dict[str, Any] = {}
        self.own: dict[str, Any] = {}
        # what is wrong with a reply format (the window's controller gives the engine's check, which knows
        # the grammar library's rules); by default only JSON is checked
        self.check_format: Callable[[str], list[str]] = lambda _format: []
        self._presets: list[Preset] = []
        self._system = ""
        self._default_system: str | None = None  # Settings' system prompt (None: not given, Use defaults keeps it)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the body fits the width
        body = QWidget()
        column = QVBoxLayout(body)
        column.setContentsMargins(10, 8, 10, 8)
        scroll.setWidget(body)
        outer.addWidget(scroll)

        self.heading = QLabel("This chat")
        self.heading.setObjectName("sectionTitle")
        column.addWidget(self.heading)
        presets_row = QHBoxLayout()
        self.preset_box = QComboBox()
        self.preset_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset_box.setMinimumContentsLength(8)  # long preset names are elided, not widening the panel
        self.preset_box.setToolTip("Apply a saved system prompt and values to this chat")
        self.preset_box.setAccessibleName("Preset")
        self.preset_box.activated.connect(self._preset_activated)
        presets_row.addWidget(self.preset_box, 1)
        column.addWidget(QLabel("Preset"))
        column.addLayout(presets_row)
        buttons = QHBoxLayout()
        self.save_button = QPushButton("Save as\u2026")
        self.save_button.setToolTip("Keep this chat's system prompt and values as a preset")
        self.save_button.clicked.connect(self._ask_name)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Delete the chosen preset (built-in presets stay)")
        self.delete_button.clicked.connect(lambda: self.delete_requested.emit(self.preset_box.currentText()))
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        column.addLayout(buttons)

        self.system_label = QLabel("System prompt")
        column.addWidget(self.system_label)
        self.system_edit = _PromptEdit()
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText("How the assistant should behave in this chat")
        self.system_edit.setMaximumHeight(110)
        self.system_edit.setTabChangesFocus(True)
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(SAVE_DELAY_MS)
        self._save_timer.timeout.connect(self._system_done)
        self.system_edit.textChanged.connect(self._save_timer.start)
        self.system_edit.left.connect(self._system_done)
        column.addWidget(self.system_edit)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.fields: dict[str, QWidget] = {}
        self.labels: dict[str, QLabel] = {}
        temperature = _double(0.0, 2.0, 0.05)
        top_p = _double(0.01, 1.0, 0.05)
        top_k = QSpinBox()
        top_k.setRange(0, 1000)
        top_k.setSpecialValueText("off")
        top_k.setKeyboardTracking(False)
        penalty = _double(0.5, 2.0, 0.05)
        max_tokens = QSpinBox()
        max_tokens.setRange(1, 131072)
        max_tokens.setSingleStep(64)
        max_tokens.setKeyboardTracking(False)
        seed = QLineEdit()
        seed.setValidator(QIntValidator(0, 2**31 - 1, seed))
        seed.setPlaceholderText("random")
        loops = QCheckBox("End a reply that repeats itself")
        for name, text, widget in (
            ("temperature", "Temperature", temperature),
            ("top_p", "Top-p", top_p),
            ("top_k", "Top-k", top_k),
            ("repetition_penalty", "Repetition penalty", penalty),
            ("max_tokens", "Max tokens", max_tokens),
            ("seed", "Seed", seed),
        ):
            label = QLabel(text)
            label.setBuddy(widget)
            widget.setMinimumWidth(FIELD_MIN_WIDTH)  # the form fits a narrow panel: fields shrink, labels stay whole
            widget.setToolTip(TIPS[name])
            widget.setAccessibleName(text)
            form.addRow(label, widget)
            self.fields[name], self.labels[name] = widget, label
        loops.setToolTip(TIPS["stop_repeats"])
        self.fields["stop_repeats"] = loops
        form.addRow(loops)
        column.addLayout(form)
        for box in (temperature, top_p, penalty):
            box.valueChanged.connect(self._edited)
        for spin in (top_k, max_tokens):
            spin.valueChanged.connect(self._edited)
        seed.editingFinished.connect(self._edited)
        loops.toggled.connect(self._edited)

        self._build_format(column)
        self._build_thinking(column)

        self.summary = QLabel()
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        column.addWidget(self.summary)
        self.reset_button = QPushButton("Use defaults")
        self.reset_button.setToolTip(
            "Back to the defaults in Settings: the default system prompt, and no values of this chat's own"
        )
        self.reset_button.clicked.connect(self.reset)
        reset_row = QHBoxLayout()
        reset_row.addWidget(self.reset_button)
        reset_row.addStretch(1)
        column.addLayout(reset_row)
        column.addStretch(1)
        guard_wheel(self)  # the wheel scrolls the panel; a value changes only once its box has focus

    def _build_format(self, column: QVBoxLayout) -> None:
        """The reply format: free text, any JSON object, or JSON matching a schema pasted or read from a file."""
        self.format_label = QLabel("Reply format")
        column.addWidget(self.format_label)
        self.format_box = QComboBox()
        for text, kind in FORMATS:
            self.format_box.addItem(text, kind)
        self.format_box.setAccessibleName("Reply format")
        self.format_box.setToolTip(
            "Free text, or JSON by construction: every token the format does not allow is ruled out, "
            "and what it allows alone is written without a model step"
        )
        self.format_label.setBuddy(self.format_box)
        self.format_box.activated.connect(self._format_edited)
        column.addWidget(self.format_box)
        self.schema_edit = _PromptEdit()
        self.schema_edit.setAccessibleName("JSON schema")
        self.schema_edit.setPlaceholderText('Paste a JSON schema, e.g. {"type": "object", "properties": {...}}')
        self.schema_edit.setMaximumHeight(120)
        self.schema_edit.setTabChangesFocus(True)
        self.schema_edit.left.connect(self._format_edited)
        column.addWidget(self.schema_edit)
        self.schema_file = QPushButton("Schema from file\u2026")
        self.schema_file.setToolTip("Read a JSON schema from a .json file")
        self.schema_file.clicked.connect(self._schema_from_file)
        file_row = QHBoxLayout()
        file_row.addWidget(self.schema_file)
        file_row.addStretch(1)
        column.addLayout(file_row)
        self.format_problem = QLabel()
        self.format_problem.setObjectName("replyError")
        self.format_problem.setWordWrap(True)
        self.format_problem.hide()
        column.addWidget(self.format_problem)
        self._format = ""  # the format in use (a valid one: what was typed and refused is not kept)

    def _build_thinking(self, column: QVBoxLayout) -> None:
        """A thinking model's switch (the template's enable_thinking), hidden until a model has one."""
        self.thinking_label = QLabel("Thinking")
        self.thinking_box = QComboBox()
        for text, value in THINKING:
            self.thinking_box.addItem(text, value)
        self.thinking_box.setAccessibleName("Thinking")
        self.thinking_box.setToolTip(
            "Whether a thinking model thinks before it answers (its template's switch); the thinking shows "
            "collapsed over the reply, and later turns leave it out"
        )
        self.thinking_label.setBuddy(self.thinking_box)
        self.thinking_box.activated.connect(self._edited)
        column.addWidget(self.thinking_label)
        column.addWidget(self.thinking_box)
        self.set_thinking_switch(False)

    def set_thinking_switch(self, available: bool) -> None:
        """Show the thinking switch only while the loaded model's template takes one."""
        self.thinking_label.setVisible(available)
        self.thinking_box.setVisible(available)

    def _show_format(self, value: str) -> None:
        self._format = value
        kind = format_kind(value) or "text"
        with QSignalBlocker(self.format_box):
            self.format_box.setCurrentIndex(max(0, self.format_box.findData(kind)))
        if kind == "json_schema":
            with QSignalBlocker(self.schema_edit):
                self.schema_edit.setPlainText(json.dumps(json.loads(value).get("schema"), indent=2))
        self._format_shown(None)

    def _format_shown(self, problem: str | None) -> None:
        schema = self.format_box.currentData() == "json_schema"
        self.schema_edit.setVisible(schema)
        self.schema_file.setVisible(schema)
        self.format_problem.setText(problem or "")
        self.format_problem.setVisible(bool(problem))

    def _format_edited(self, *_args: object) -> None:
        kind = self.format_box.currentData()
        value, problem = "", None
        if kind == "json_object":
            value = reply_format("json_object")
        elif kind == "json_schema":
            text = self.schema_edit.toPlainText().strip()
            if not text:
                self._format_shown(None)  # nothing to check yet: the format in use stays until a schema is given
                return
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as exc:
                schema, problem = None, f"Not JSON: {exc}"
            if problem is None and not isinstance(schema, dict):
                problem = 'A schema is a JSON object, such as {"type": "object", ...}.'
            if problem is None:
                value = reply_format("json_schema", schema)
                found = self.check_format(value)
                problem = found[0] if found else None
        self._format_shown(problem)
        if problem is None and value != self._format:
            self._format = value
            self._edited()

    def _schema_from_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "JSON schema", "", "JSON schema (*.json);;All files (*)")
        if not path:
            return
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self._format_shown(f"Cannot read {path}: {exc}")
            return
        self.schema_edit.setPlainText(text)
        self._format_edited()

    # -- showing -----------------------------------------------------------------------
    def show_chat(
        self,
        system_prompt: str,
        own: dict[str, Any],
        defaults: dict[str, Any],
        presets: list[Preset],
        new: bool,
        default_system: str | None = None,
    ) -> None:
        """Show a chat's values without emitting ``changed``; ``new``: the chat is not yet created;
        ``default_system``: Settings' system prompt, which "Use defaults" puts back (None: it keeps the chat's)."""
        self._save_timer.stop()
        self._default_system = default_system
        self.defaults, self.own, self._presets, self._system = dict(defaults), dict(own), list(presets), system_prompt
        self.heading.setText("Next new chat" if new else "This chat")
        values = defaults | own
        with QSignalBlocker(self.system_edit):
            if self.system_edit.toPlainText() != system_prompt:
                self.system_edit.setPlainText(system_prompt)
        self._show_format(str(values.get("format") or ""))
        with QSignalBlocker(self.thinking_box):
            self.thinking_box.setCurrentIndex(max(0, self.thinking_box.findData(own.get("thinking", "auto"))))
        for name, widget in self.fields.items():
            with QSignalBlocker(widget):
                value = values.get(name)
                if isinstance(widget, QDoubleSpinBox):
                    widget.setValue(float(value or 0.0))
                elif isinstance(widget, QSpinBox):
                    widget.setValue(int(value or 0))
                elif isinstance(widget, QLineEdit):
                    widget.setText("" if value is None else str(value))
                elif isinstance(widget, QCheckBox):
                    widget.setChecked(bool(value))
        self._show_state()

    def _show_state(self) -> None:
        for name, label in self.labels.items():
            font = label.font()
            font.setBold(name in self.own)
            label.setFont(font)
        shown = (("stop_repeats", self.fields["stop_repeats"]), ("format", self.format_label))
        for name, widget in (*shown, ("thinking", self.thinking_label)):
            font = widget.font()
            font.setBold(name in self.own)
            widget.setFont(font)
        own_system = self._own_system()
        font = self.system_label.font()
        font.setBold(own_system)
        self.system_label.setFont(font)
        count = len(self.own)
        values = f"{count} value{'s' if count != 1 else ''}"
        if own_system:
            also = f" and {values}" if count else ""
            summary = f"This chat has its own system prompt{also} (bold); the rest follow Settings."
        elif count:
            summary = f"{values} set for this chat (bold); the rest follow Settings."
        else:
            summary = "Follows the defaults in Settings."
        self.summary.setText(summary)
        self.reset_button.setEnabled(bool(count) or own_system)
        match = self._matching_preset()
        with QSignalBlocker(self.preset_box):
            self.preset_box.clear()
            names = [p.name for p in self._presets]
            self.preset_box.addItems(names if match else [CUSTOM, *names])
            self.preset_box.setCurrentText(match.name if match else CUSTOM)
        self.delete_button.setEnabled(match is not None and not match.builtin)

    def _own_system(self) -> bool:
        return self._default_system is not None and self._system != self._default_system

    def _matching_preset(self) -> Preset | None:
        values = self.defaults | self.own
        for preset in self._presets:
            if preset.system_prompt == self._system and all(values.get(k) == v for k, v in preset.params.items()):
                return preset
        return None

    @property
    def system_prompt(self) -> str:
        """The system prompt shown (as last sent with ``changed``)."""
        return self._system

    # -- editing -----------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        """Every sampling value the form shows."""
        out: dict[str, Any] = {}
        for name, widget in self.fields.items():
            if isinstance(widget, QDoubleSpinBox):
                out[name] = round(widget.value(), widget.decimals())
            elif isinstance(widget, QSpinBox):
                out[name] = widget.value()
            elif isinstance(widget, QLineEdit):
                out[name] = int(widget.text()) if widget.text().strip() else None
            elif isinstance(widget, QCheckBox):
                out[name] = LOOP_STOP if widget.isChecked() else 0
        if out.get("stop_repeats") and self.defaults.get("stop_repeats"):
            out["stop_repeats"] = self.defaults["stop_repeats"]  # on keeps the defaults' count
        out["format"] = self._format
        if self.thinking_box.currentData() != "auto":  # a chat option, kept only when it is not the default
            out["thinking"] = self.thinking_box.currentData()
        return out

    def _edited(self, *_args: object) -> None:
        own = {name: value for name, value in self.values().items() if value != self.defaults.get(name)}
        if own != self.own:
            self.own = own
            self._show_state()
            self.changed.emit(self._system, dict(own))

    def _system_done(self) -> None:
        self._save_timer.stop()
        text = self.system_edit.toPlainText()
        if text != self._system:
            self._system = text
            self._show_state()
            self.changed.emit(text, dict(self.own))

    def reset(self) -> None:
        """Back to Settings: the default system prompt (when the window gave one) and none of the chat's own values."""
        system = self._system if self._default_system is None else self._default_system
        new = self.heading.text() != "This chat"
        self.show_chat(system, {}, self.defaults, self._presets, new, self._default_system)
        self.changed.emit(system, {})

    def _preset_activated(self, index: int) -> None:
        name = self.preset_box.itemText(index)
        if name != CUSTOM:
            self.preset_chosen.emit(name)

    def _ask_name(self) -> None:
        current = self.preset_box.currentText()
        suggested = "" if current == CUSTOM or any(p.builtin and p.name == current for p in self._presets) else current
        name, ok = QInputDialog.getText(self, "Save preset", "Name of the preset:", text=suggested)
        if ok and name.strip():
            self.save_requested.emit(name.strip())
