"""The Settings dialog's "Speed" group: prompt cache, speculative decoding, quantization.

``SpeedSection(settings)`` shows the fields of :class:`~engine.storage.Settings`
that trade memory or accuracy for latency, and :meth:`SpeedSection.values`
returns them as a dict for ``dataclasses.replace``.  Choosing "Draft model"
with no draft model path shows an inline hint.

The speculative sources are ``engine.api.SOURCES``.  The quantization list
comes from ``engine.quant`` (``MODES``, the same as ``engine.api.QUANT_MODES``, and
``availability(device)``), asked by :func:`app.quant_probe.quant_choices` in a
child process (it imports torch and probes back-ends: seconds the first time),
started from a worker thread when the section is built, never at app start-up;
until it answers the list holds only the current choice, and ``quant_ready``
turns True when the full list is in.  Modes that cannot run on the chosen
device are greyed out with the reason as their tooltip; if the module cannot
be imported only "none" is offered, its tooltip saying why.  ``set_device``
checks again when the device choice changes.  A usable mode's tooltip says what
it does, in ``engine.quant.descriptions()``'s words (with its caveat), from
the same check (:func:`app.quant_probe.quant_check`).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app import quant_probe
from app.background import in_background
from app.quant_probe import QUANT_UNAVAILABLE
from app.views.controls import form_row
from engine.api import SOURCES
from engine.storage import Settings

SOURCE_TEXT = {  # engine.api.SOURCES, as the list shows them: (label, tooltip)
    "off": ("Off", "Generate one token per step"),
    "auto": ("Auto", "Use every draft source that is available and pays off"),
    "lookup": ("Prompt lookup", "Draft by copying text that already appears in the conversation"),
    "answers": ("Earlier answers", "Draft from earlier answers to similar questions"),
    "draft": ("Draft model", "Draft with a small model that shares the main model's vocabulary"),
}
SPECULATIVE = tuple((source, *SOURCE_TEXT.get(source, (source, ""))) for source in SOURCES)
DRAFT_HINT = "Pick a draft model below: a small model with the same vocabulary as the main one."
QUANT_CHECKING = "Checking which modes this machine can run\u2026"
QUANT_TIP = "Smaller weights for less memory; changing it reloads the model"
DRAFT_QUANT_TIP = (
    "The draft model's quantization: a faster draft is cheaper to run; greedy replies stay the same "
    "(the main model checks every drafted token). Changing it reloads the models."
)
# Each mode's tooltip where it can run (where it cannot, the tooltip is the reason) comes from
# engine.quant.descriptions() through app.quant_probe.quant_check; these are used only for a mode the
# quantization module does not describe (an older engine.quant, or a stand-in).
# What each does to speed on this machine: `brisk bench quant` (docs/PERFORMANCE.md).
AUTO_QUANT = "auto"
QUANT_HELP = {
    AUTO_QUANT: "Measured once on this machine at the first load: the fastest mode whose greedy answers "
    "agree with float32 at least 99 % of the time (About shows what was chosen and why)",
    "none": "Weights as loaded, in the dtype chosen above",
    "fp16-cpu": "Float16 weights, float32 arithmetic (fbgemm, x86 CPUs): half of float32's memory, "
    "nearly the same output (99 % next-token agreement on the bundled model)",
    "q8-cpu": "8-bit weights with a step and minimum per group of 32, 15-bit activations, Brisk's native "
    "integer kernel: about 60 % of fp16-cpu's bytes a step",
    "int8-cpu": "8-bit weights, one scale per output row (torch's CPU kernel), bfloat16 arithmetic",
    "int4-cpu": "4-bit weights in groups of 32 (torch's CPU kernel); the output head stays 8-bit",
    "bnb-int8": "bitsandbytes LLM.int8 (CUDA, or the CPU with bitsandbytes 0.48 or newer)",
    "bnb-nf4": "bitsandbytes 4-bit NormalFloat (CUDA, or the CPU with bitsandbytes 0.48 or newer)",
    "bnb-fp4": "bitsandbytes 4-bit float (CUDA, or the CPU with bitsandbytes 0.48 or newer)",
}
BUDGET_TIP = "Memory kept for reusable prompt caches; least recently used entries are dropped past it."


class SpeedSection(QGroupBox):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__("Speed", parent)
        form = QFormLayout(self)

        self.prefix_cache = QCheckBox("Reuse the prompt cache between turns")
        self.prefix_cache.setChecked(settings.prefix_cache)
        form.addRow(self.prefix_cache)
        self.prefix_cache_mb = QSpinBox()
        self.prefix_cache_mb.setRange(16, 1 << 20)
        self.prefix_cache_mb.setSingleStep(64)
        self.prefix_cache_mb.setValue(settings.prefix_cache_mb)
        self.prefix_cache_mb.setToolTip(BUDGET_TIP)
        self.prefix_cache_mb.setEnabled(settings.prefix_cache)
        self.prefix_cache.toggled.connect(self.prefix_cache_mb.setEnabled)
        form.addRow("Prefix cache budget (MB)", self.prefix_cache_mb)

        self.quant = QComboBox()
        self.quant_ready = False
        self.descriptions: dict[str, str] = dict(QUANT_HELP)  # mode -> what it does, until the check answers
        self._device = settings.device
        self._quant_wanted = settings.quant
        self._draft_quant_wanted = settings.draft_quant
        form.addRow("Quantization", self.quant)

        self.speculative = QComboBox()
        for value, label, tip in SPECULATIVE:
            self.speculative.addItem(label, value)
            self.speculative.setItemData(self.speculative.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        _select(self.speculative, settings.speculative)
        form.addRow("Speculative decoding", self.speculative)
        self.draft_hint = QLabel(DRAFT_HINT)
        self.draft_hint.setObjectName("notice")
        self.draft_hint.setWordWrap(True)
        form.addRow(self.draft_hint)

        self.draft_edit = QLineEdit(settings.draft_model)
        self.draft_edit.setPlaceholderText("None")
        self.draft_edit.setToolTip("A model folder or .gguf file used to draft tokens; changing it reloads the model")
        self.draft_browse = QPushButton("Browse\u2026")
        menu = QMenu(self.draft_browse)
        menu.addAction("Folder\u2026", self._browse_draft_folder)
        menu.addAction("GGUF file\u2026", self._browse_draft_file)
        self.draft_browse.setMenu(menu)
        form_row(form, "Draft model", self.draft_edit, self.draft_browse)
        self.draft_quant = QComboBox()
        self.draft_quant.setToolTip(DRAFT_QUANT_TIP)
        form.addRow("Draft quantization", self.draft_quant)
        self.speculative.currentIndexChanged.connect(self._update_hint)
        self.draft_edit.textChanged.connect(self._update_hint)
        self._update_hint()

        self.set_device(settings.device)  # fills both quantization lists

        self.colour_drafts = QCheckBox("Colour tokens that came from speculative drafting")
        self.colour_drafts.setChecked(settings.colour_draft_tokens)
        form.addRow(self.colour_drafts)

    def values(self) -> dict[str, Any]:
        return {
            "prefix_cache": self.prefix_cache.isChecked(),
            "prefix_cache_mb": self.prefix_cache_mb.value(),
            "speculative": self.speculative.currentData(),
            "draft_model": self.draft_edit.text().strip(),
            "quant": self.quant.currentData(),
            "draft_quant": self.draft_quant.currentData(),
            "colour_draft_tokens": self.colour_drafts.isChecked(),
        }

    def set_device(self, device_name: str) -> None:
        """Check (on a worker thread) which quantization modes ``device_name`` can run."""
        if self.quant.count():
            self._quant_wanted = self.quant.currentData()
            self._draft_quant_wanted = self.draft_quant.currentData()
        self._device = device_name
        self.quant_ready = False
        self._fill_quant([(self._quant_wanted, None)], [(self._draft_quant_wanted, None)])
        self.quant.setToolTip(QUANT_CHECKING)
        self.draft_quant.setToolTip(QUANT_CHECKING)
        in_background(
            self,
            lambda: quant_probe.quant_check(device_name),
            lambda section, found: section._quant_checked(device_name, found),
        )

    def _quant_checked(self, device_name: str, found: object) -> None:
        if device_name != self._device:  # an answer for a device choice already changed again
            return
        if isinstance(found, Exception):
            found = ([("none", f"{QUANT_UNAVAILABLE}: the check failed ({type(found).__name__}: {found}).")], {})
        assert isinstance(found, tuple)
        choices: list[tuple[str, str | None]] = found[0]
        self.descriptions = {**QUANT_HELP, **found[1]}  # what each mode does, as engine.quant says it
        self._quant_wanted = self.quant.currentData()
        self._draft_quant_wanted = self.draft_quant.currentData()
        lists = []
        # the model's own list starts with auto (it measures, and keeps "none" when nothing else pays);
        # a draft model's quantization is chosen by hand
        main = [(AUTO_QUANT, None), *choices]
        for wanted, offered_choices in ((self._quant_wanted, main), (self._draft_quant_wanted, choices)):
            offered = [mode for mode, _ in offered_choices]
            lists.append(
                offered_choices
                if wanted in offered
                else [*offered_choices, (wanted, "Not offered by this installation.")]
            )
        self._fill_quant(*lists)
        self.quant.setToolTip(QUANT_TIP)
        self.draft_quant.setToolTip(DRAFT_QUANT_TIP)
        self.quant_ready = True

    def _fill_quant(self, choices: list[tuple[str, str | None]], draft: list[tuple[str, str | None]]) -> None:
        _fill_modes(self.quant, choices, self._quant_wanted, self.descriptions)
        _fill_modes(self.draft_quant, draft, self._draft_quant_wanted, self.descriptions)

    def _update_hint(self) -> None:
        wants_draft = self.speculative.currentData() == "draft"
        self.draft_hint.setVisible(wants_draft and not self.draft_edit.text().strip())

    def _browse_draft_folder(self) -> None:
        browse_model(self, self.draft_edit, folder=True, title="Choose a draft model folder")

    def _browse_draft_file(self) -> None:
        browse_model(self, self.draft_edit, folder=False, title="Choose a GGUF draft model")


def _select(box: QComboBox, value: str) -> None:
    """Select the item whose data is ``value``, adding it when the list lacks it."""
    index = box.findData(value)
    if index < 0:
        box.addItem(value, value)
        index = box.count() - 1
    box.setCurrentIndex(index)


def browse_model(parent: QWidget, edit: QLineEdit, *, folder: bool, title: str) -> None:
    """Ask for a model folder or a .gguf file and put the choice into ``edit``."""
    if folder:
        path = QFileDialog.getExistingDirectory(parent, title, edit.text())
    else:
        path, _ = QFileDialog.getOpenFileName(parent, title, edit.text(), "GGUF models (*.gguf);;All files (*)")
    if path:
        edit.setText(path)


def _fill_modes(
    box: QComboBox, choices: list[tuple[str, str | None]], wanted: str, descriptions: dict[str, str]
) -> None:
    """Fill a quantization list: usable modes say what they do (``descriptions``), greyed ones why not."""
    box.clear()
    model = box.model()
    assert isinstance(model, QStandardItemModel)
    for row, (mode, reason) in enumerate(choices):
        box.addItem(mode, mode)
        tip = reason or descriptions.get(mode)
        if tip:
            box.setItemData(row, tip, Qt.ItemDataRole.ToolTipRole)
        if reason and mode != "none":  # no quantization always works; its reason is only a note
            item = model.item(row)
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
    _select(box, wanted)
