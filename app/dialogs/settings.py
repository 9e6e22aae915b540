"""The Settings dialog: model, device, dtype, system prompt, sampling, caches.

``SettingsDialog(settings)`` edits a copy; after ``exec()`` returns accepted,
:meth:`result_settings` gives the new :class:`~engine.storage.Settings`
(fields the dialog does not show are carried over unchanged).  Saving and
reloading are the caller's job; :func:`needs_reload` says whether a change
means the model must be loaded again.  The "Engine" group (the local model or
a saved server) is :class:`~app.dialogs.engines.EngineSection`.  The "Speed" group is
:class:`~app.dialogs.speed.SpeedSection`; "About this machine\u2026" opens
:class:`~app.dialogs.about.AboutDialog` with ``loaded`` (the last ``Loaded``
event, if any) and ``report`` (the machine facts; default: the bridge's).
The device and precision lists are ``engine.api``'s ``DEVICES`` and ``DTYPES``.  The model field takes a folder, a
``.gguf`` file or a hub id; empty means the bundled model.  A blank seed means
random.

``overflow`` (the open chat's policy when it outgrows the model's context,
``ChatSession.overflow()``) adds a "This chat" group: drop the middle turns,
or stop and say so; :meth:`result_overflow` gives the choice.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtGui import QIntValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.dialogs.about import AboutDialog, Report
from app.dialogs.engines import EngineSection
from app.dialogs.speed import SpeedSection, browse_model
from app.views.controls import form_row, guard_wheel, scrolling_page
from engine.api import DEVICES, DTYPES, Loaded
from engine.client import model_note
from engine.storage import Settings

# the chat options' overflow policies (engine.storage.params.CHAT_OPTIONS["overflow"]) as the dialog says them
OVERFLOW_TEXT = {
    "drop-middle": "Drop the middle turns (keep the system prompt, documents and newest turns)",
    "stop": "Stop and say so",
}
THEME_TEXT = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
RELOAD_FIELDS = ("model", "device", "dtype", "quant", "draft_model", "draft_quant")


def needs_reload(old: Settings, new: Settings) -> bool:
    fields = [f for f in RELOAD_FIELDS if f != "draft_quant" or old.draft_model or new.draft_model]
    return any(getattr(old, name) != getattr(new, name) for name in fields)


def _combo(values: tuple[str, ...], current: str) -> QComboBox:
    box = QComboBox()
    box.addItems(list(values))
    if current not in values:
        box.addItem(current)
    box.setCurrentText(current)
    return box


def _spin(low: float, high: float, step: float, value: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setValue(value)
    return box


class SettingsDialog(QDialog):
    def __init__(
        self,
        settings: Settings,
        parent: QWidget | None = None,
        *,
        loaded: Loaded | None = None,
        report: Report | None = None,
        overflow: str | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(560)
        self._original = settings
        self._loaded = loaded
        self._report = report
        self.about: AboutDialog | None = None
        outer, page, layout = scrolling_page(self)  # the form is taller than small laptop screens

        self.engines = EngineSection(settings)  # the local model or a saved server (keys in the keyring)
        layout.addWidget(self.engines)

        model_box = QGroupBox("Model")
        model_form = QFormLayout(model_box)
        self.model_edit = QLineEdit(settings.model)
        self.model_edit.setPlaceholderText("Bundled model")
        self.model_edit.setToolTip("A model folder, a .gguf file or a Hugging Face id; empty for the bundled model")
        folder = QPushButton("Folder\u2026")
        folder.clicked.connect(self._browse_folder)
        gguf = QPushButton("GGUF file\u2026")
        gguf.clicked.connect(self._browse_file)
        form_row(model_form, "Model", self.model_edit, folder, gguf)
        self.model_note = QLabel(model_note(settings.model))
        self.model_note.setObjectName("modelNote")
        self.model_note.setWordWrap(True)
        self.model_note.setToolTip("Read from the model's files: what it is, what it needs, which path runs it")
        self.model_edit.editingFinished.connect(lambda: self.model_note.setText(model_note(self.model_edit.text())))
        model_form.addRow("", self.model_note)
        self.device_combo = _combo(DEVICES, settings.device)
        model_form.addRow("Device", self.device_combo)
        self.dtype_combo = _combo(DTYPES, settings.dtype)
        model_form.addRow("Precision", self.dtype_combo)
        layout.addWidget(model_box)

        chat_box = QGroupBox("Chat defaults")
        chat_box.setToolTip(
            "What a chat uses unless its own values are set in the Parameters panel (View > Parameters panel)"
        )
        chat_form = QFormLayout(chat_box)
        self.system_edit = QPlainTextEdit(settings.system_prompt)
        self.system_edit.setFixedHeight(70)
        self.system_edit.setToolTip("Used by new chats and by the chat that is open now")
        chat_form.addRow("System prompt", self.system_edit)
        self.temperature = _spin(0.0, 2.0, 0.05, settings.temperature)
        self.temperature.setToolTip("0 means greedy: always the most likely token")
        chat_form.addRow("Temperature", self.temperature)
        self.top_p = _spin(0.0, 1.0, 0.05, settings.top_p)
        chat_form.addRow("Top-p", self.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 100_000)
        self.top_k.setValue(settings.top_k)
        self.top_k.setSpecialValueText("off")
        chat_form.addRow("Top-k", self.top_k)
        self.repetition_penalty = _spin(0.5, 2.0, 0.05, settings.repetition_penalty)
        chat_form.addRow("Repetition penalty", self.repetition_penalty)
        self.seed_edit = QLineEdit("" if settings.seed is None else str(settings.seed))
        self.seed_edit.setPlaceholderText("random")
        self.seed_edit.setValidator(QIntValidator(0, 2**31 - 1, self))
        chat_form.addRow("Seed", self.seed_edit)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 1_000_000)
        self.max_tokens.setValue(settings.max_tokens)
        chat_form.addRow("Max tokens", self.max_tokens)
        self.stop_loops = QCheckBox("Stop a reply that repeats itself")
        self.stop_loops.setChecked(settings.stop_repeats > 0)
        self.stop_loops.setToolTip(
            "Ends a reply once it says the same passage three times in a row, instead of looping to Max tokens"
        )
        chat_form.addRow("", self.stop_loops)
        layout.addWidget(chat_box)

        self.overflow_combo: QComboBox | None = None
        if overflow is not None:
            this_chat = QGroupBox("This chat")
            this_form = QFormLayout(this_chat)
            self.overflow_combo = QComboBox()
            for value, text in OVERFLOW_TEXT.items():
                self.overflow_combo.addItem(text, value)
            self.overflow_combo.setCurrentIndex(max(0, self.overflow_combo.findData(overflow)))
            self.overflow_combo.setToolTip(
                "When the conversation no longer fits the model's context: leave out the turns in the middle "
                "(each reply says which), or refuse to send and say how far over it is"
            )
            this_form.addRow("When the chat outgrows the context", self.overflow_combo)
            layout.addWidget(this_chat)

        self.speed = SpeedSection(settings)
        self.device_combo.currentTextChanged.connect(self.speed.set_device)
        self.prefix_cache = self.speed.prefix_cache
        self.colour_drafts = self.speed.colour_drafts
        layout.addWidget(self.speed)

        look = QGroupBox("Appearance")
        look_form = QFormLayout(look)
        self.theme_combo = QComboBox()
        for value, text in THEME_TEXT.items():
            self.theme_combo.addItem(text, value)
        self.theme_combo.setCurrentIndex(max(0, self.theme_combo.findData(settings.theme)))
        self.theme_combo.setToolTip("Follow the system: dark when your desktop uses a dark colour scheme")
        look_form.addRow("Theme", self.theme_combo)
        layout.addWidget(look)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.about_button = buttons.addButton("About this machine\u2026", QDialogButtonBox.ButtonRole.HelpRole)
        self.about_button.setToolTip("What this computer offers (devices, memory, libraries) and the loaded model")
        self.about_button.clicked.connect(self.show_about)
        outer.addWidget(buttons)
        # tall enough for the whole form where the screen allows; the scroll area covers the rest
        wanted = page.sizeHint().height() + buttons.sizeHint().height() + 48
        screen = self.screen()
        room = int(screen.availableGeometry().height() * 0.9) if screen is not None else wanted
        self.resize(max(self.minimumWidth(), page.sizeHint().width() + 48), min(wanted, room))
        guard_wheel(self)  # the wheel scrolls the form; a value changes only once its box has focus

    def result_settings(self) -> Settings:
        seed_text = self.seed_edit.text().strip()
        return replace(
            self._original,
            model=self.model_edit.text().strip(),
            device=self.device_combo.currentText(),
            dtype=self.dtype_combo.currentText(),
            system_prompt=self.system_edit.toPlainText(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            repetition_penalty=self.repetition_penalty.value(),
            seed=int(seed_text) if seed_text else None,
            max_tokens=self.max_tokens.value(),
            stop_repeats=(self._original.stop_repeats or 3) if self.stop_loops.isChecked() else 0,
            theme=str(self.theme_combo.currentData()),
            **self.speed.values(),
            **self.engines.values(),
        )

    def result_overflow(self) -> str | None:
        """The open chat's overflow policy as chosen (None: the dialog did not show it)."""
        return None if self.overflow_combo is None else str(self.overflow_combo.currentData())

    def accept(self) -> None:
        """Save only servers that check out (their keys go to the keyring here, never to the settings file)."""
        if self.engines.commit():
            super().accept()

    def show_about(self) -> AboutDialog:
        """Open (or raise) the "About this machine" window."""
        if self.about is None:
            self.about = AboutDialog(self._loaded, parent=self, report=self._report)
        self.about.show()
        self.about.raise_()
        return self.about

    def _browse_folder(self) -> None:
        browse_model(self, self.model_edit, folder=True, title="Choose a model folder")
        self.model_note.setText(model_note(self.model_edit.text()))

    def _browse_file(self) -> None:
        browse_model(self, self.model_edit, folder=False, title="Choose a GGUF model file")
        self.model_note.setText(model_note(self.model_edit.text()))
