"""The latency panel's switches: one click each, applied from the next request.

:class:`SwitchesView` shows a :class:`~app.state.config.ReplyConfig` as check
boxes (streaming, prefix cache, answer cache, parallel tools, prefill while typing) and two lists
(speculative source from ``engine.api.SOURCES``, quantization mode from
``engine.api.QUANT_CHOICES``).  Every change emits ``changed(ReplyConfig)``;
:meth:`set_config` shows a config without emitting.  Which quantization modes
this machine can run is asked of :mod:`app.quant_probe` (a child process) the
first time the list is opened, never at start-up; modes that cannot run are
then greyed out with the reason as their tooltip.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QCheckBox, QComboBox, QGridLayout, QLabel, QWidget

from app import quant_probe
from app.background import in_background
from app.dialogs.speed import SOURCE_TEXT
from app.state.config import ReplyConfig
from engine.api import QUANT_CHOICES, SOURCES

TIPS = {
    "stream": "Off: the reply appears at once when it is complete, so you feel the difference",
    "prefix_cache": "Reuse the KV of prompt text computed before (history, system prompt)",
    "answer_cache": "Answer a question asked before from the cache",
    "parallel_tools": "Run independent tool calls at the same time",
    "prefill_typing": "Prefill the message while you type it, so the reply starts sooner after Send",
    "speculative": "Where drafted tokens come from; greedy output stays the same",
    "quant": "Quantization of the weights; a change reloads the model",
}


class QuantCombo(QComboBox):
    """The quantization list; asks which modes can run the first time it opens."""

    def __init__(self, device: str = "auto") -> None:
        super().__init__()
        self.device = device
        self.asked = False
        self.addItems(list(QUANT_CHOICES))

    def showPopup(self) -> None:  # noqa: N802 (Qt override)
        if not self.asked:
            self.asked = True
            device = self.device
            in_background(self, lambda: quant_probe.quant_choices(device), QuantCombo._got_choices)
        super().showPopup()

    def _got_choices(self, choices: object) -> None:
        if not isinstance(choices, list):
            return
        self.mark_unavailable({mode: why for mode, why in choices if why})

    def mark_unavailable(self, reasons: dict[str, str]) -> None:
        model = self.model()
        assert isinstance(model, QStandardItemModel)
        for row in range(self.count()):
            item = model.item(row)
            why = reasons.get(self.itemText(row))
            item.setEnabled(why is None or self.itemText(row) == self.currentText())
            item.setToolTip(why or "")


class SwitchesView(QWidget):
    changed = Signal(object)  # ReplyConfig

    def __init__(self, config: ReplyConfig | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._config = config or ReplyConfig()
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        self.checks: dict[str, QCheckBox] = {}
        texts = {
            "stream": "Streaming",
            "prefix_cache": "Prefix cache",
            "answer_cache": "Answer cache",
            "parallel_tools": "Parallel tools",
            "prefill_typing": "Prefill while typing",
        }
        for n, (key, text) in enumerate(texts.items()):
            box = QCheckBox(text)
            box.setObjectName(f"switch_{key}")
            box.setToolTip(TIPS[key])
            box.toggled.connect(self._emit)
            grid.addWidget(box, n, 0, 1, 2)  # one column: the panel may be narrow
            self.checks[key] = box
        self.speculative = QComboBox()
        self.speculative.setObjectName("switch_speculative")
        for source in SOURCES:
            label, tip = SOURCE_TEXT.get(source, (source, ""))
            self.speculative.addItem(label, source)
            self.speculative.setItemData(self.speculative.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        self.speculative.setToolTip(TIPS["speculative"])
        self.quant = QuantCombo()
        self.quant.setObjectName("switch_quant")
        self.quant.setToolTip(TIPS["quant"])
        rows = len(texts)
        for n, (text, combo) in enumerate((("Speculative", self.speculative), ("Quantization", self.quant))):
            label = QLabel(text)
            label.setBuddy(combo)
            grid.addWidget(label, rows + 2 * n, 0, 1, 2)  # the name above its choice: the panel may be narrow
            grid.addWidget(combo, rows + 2 * n + 1, 0, 1, 2)
        for combo in (self.speculative, self.quant):  # shrink with the panel; the list shows whole names
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(6)
        self.speculative.currentIndexChanged.connect(self._emit)
        self.quant.currentIndexChanged.connect(self._emit)
        self.set_config(self._config)

    @property
    def config(self) -> ReplyConfig:
        return self._config

    def set_remote(self, endpoint: str) -> None:
        """Grey the switches that only the local model honours while a server (``endpoint``) answers ("" = local)."""
        local_only = [self.checks["prefix_cache"], self.checks["prefill_typing"], self.speculative, self.quant]
        keys = ("prefix_cache", "prefill_typing", "speculative", "quant")
        for widget, key in zip(local_only, keys, strict=True):
            widget.setEnabled(not endpoint)
            widget.setToolTip(f"The server at {endpoint} decides this itself." if endpoint else TIPS[key])

    def set_draft_available(self, available: bool, offer: str = "") -> None:
        """Grey "Draft model" out, with the reason, while Settings names no draft model (every reply would fail);
        ``offer``: a model on disk the library found that could draft for the loaded one."""
        index = self.speculative.findData("draft")
        item = self.speculative.model().item(index) if index >= 0 else None  # type: ignore[attr-defined]
        if item is None:
            return
        item.setEnabled(available)
        tip = SOURCE_TEXT.get("draft", ("draft", ""))[1]
        if available:
            item.setToolTip(tip)
        elif offer:
            item.setToolTip(f"{tip} No draft model is set: Tools > Models offers {offer} (same vocabulary, smaller).")
        else:
            item.setToolTip(f"{tip} No draft model is set, and no model on disk shares this one's vocabulary.".strip())

    def set_config(self, config: ReplyConfig) -> None:
        """Show ``config`` without emitting ``changed``."""
        widgets = [*self.checks.values(), self.speculative, self.quant]
        for widget in widgets:
            widget.blockSignals(True)
        try:
            for key, box in self.checks.items():
                box.setChecked(bool(getattr(config, key)))
            self.speculative.setCurrentIndex(max(0, self.speculative.findData(config.speculative)))
            if self.quant.findText(config.quant) < 0:
                self.quant.addItem(config.quant)
            self.quant.setCurrentText(config.quant)
        finally:
            for widget in widgets:
                widget.blockSignals(False)
        self._config = config

    def _emit(self) -> None:
        values = {key: box.isChecked() for key, box in self.checks.items()}
        config = dataclasses.replace(
            self._config,
            speculative=str(self.speculative.currentData() or self._config.speculative),
            quant=self.quant.currentText() or self._config.quant,
            **values,
        )
        if config != self._config:
            self._config = config
            self.changed.emit(config)
