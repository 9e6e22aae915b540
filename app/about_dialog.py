"""The "About this machine" window: what this computer offers, and the loaded model.

``AboutDialog(loaded, report=None)`` shows two two-column tables.  "This
machine" lists the facts of ``engine.doctor.report()`` (Python, torch, CPU,
CUDA, GPU, memory...); that call imports torch, so it runs on a worker thread
(:func:`~app.background.in_background`) and the table says "Checking\u2026"
until the answer is in (then ``report_ready`` is True).  "Loaded model" lists
the last :class:`~engine.api.Loaded` event: name, device, precision, load
time and every entry of its ``info`` (parameters, weight size, warm prefixes,
draft model, quantization...).  ``report`` replaces the doctor (tests pass a stub).
Nothing is estimated; missing facts are simply not listed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.background import in_background
from engine.api import Loaded

Report = Callable[[], Mapping[str, Any]]

LABELS = {
    "python": "Python",
    "torch": "PyTorch",
    "transformers": "Transformers",
    "cpu": "CPU",
    "cpu_threads": "CPU threads",
    "cuda": "CUDA available",
    "gpu": "GPU",
    "gpu_memory_gb": "GPU memory",
    "bf16_supported": "bfloat16 on GPU",
    "memory_gb": "Memory",
    "model": "Model",
    "device": "Device",
    "dtype": "Precision",
    "load_s": "Load time",
    "parameters": "Parameters",
    "weight_bytes": "Weights in memory",
    "warm_prefixes": "Warm prompt caches from disk",
    "draft_model": "Draft model",
    "draft_quant": "Draft quantization",
    "draft_error": "Draft model problem",
    "quant": "Quantization",
}
NO_MODEL = "No model is loaded yet."


def default_report() -> Mapping[str, Any]:
    from engine.doctor import report  # imports torch

    return report()


def show_value(key: str, value: Any) -> str:
    """A fact as a person reads it: units, yes/no, thousands separators."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "\u2014"
    if key.endswith("_gb") and isinstance(value, (int, float)):
        return f"{value:g} GB"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return _bytes(value)
    if key.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:.2f} s"
    if key == "parameters" and isinstance(value, (int, float)):
        return f"{value / 1e9:.2f} B" if value >= 1e9 else f"{value / 1e6:.1f} M"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {show_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(show_value("", v) for v in value)
    return str(value)


def _bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} bytes"
    for unit in ("KB", "MB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.2f} GB"


def model_facts(loaded: Loaded | None) -> dict[str, Any]:
    if loaded is None:
        return {}
    facts: dict[str, Any] = {
        "model": loaded.model_name,
        "device": loaded.device,
        "dtype": loaded.dtype,
        "load_s": loaded.load_s,
    }
    facts.update(dataclasses.asdict(loaded.info))
    return facts


class AboutDialog(QDialog):
    def __init__(self, loaded: Loaded | None, parent: QWidget | None = None, *, report: Report | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About this machine")
        self.setMinimumSize(460, 420)
        layout = QVBoxLayout(self)
        layout.addWidget(_heading("This machine"))
        self.machine_table = _table()
        _fill(self.machine_table, {"": "Checking\u2026"})
        layout.addWidget(self.machine_table, 1)
        layout.addWidget(_heading("Loaded model"))
        self.model_table = _table()
        layout.addWidget(self.model_table, 1)
        self.set_loaded(loaded)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

        self.report_ready = False
        get_report = report or default_report
        in_background(self, lambda: dict(get_report()), AboutDialog._show_report)

    def set_loaded(self, loaded: Loaded | None) -> None:
        facts = model_facts(loaded)
        _fill(self.model_table, facts or {"": NO_MODEL})

    def machine_facts(self) -> dict[str, str]:
        """The machine table as shown (label to text); tests read it."""
        return _rows(self.machine_table)

    def model_rows(self) -> dict[str, str]:
        return _rows(self.model_table)

    def _show_report(self, result: object) -> None:
        if isinstance(result, Exception):
            text = f"Could not check this machine: {type(result).__name__}: {result}"
            _fill(self.machine_table, {"": text})
        elif isinstance(result, Mapping):
            _fill(self.machine_table, result)
        self.report_ready = True


def _heading(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("role")
    return label


def _table() -> QTableWidget:
    table = QTableWidget(0, 2)
    table.horizontalHeader().hide()
    table.verticalHeader().hide()
    table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setShowGrid(False)
    table.setWordWrap(True)
    return table


def _fill(table: QTableWidget, facts: Mapping[str, Any]) -> None:
    table.setRowCount(0)
    for key, value in facts.items():
        row = table.rowCount()
        table.insertRow(row)
        label = QTableWidgetItem(LABELS.get(key, key.replace("_", " ").capitalize()))
        label.setForeground(Qt.GlobalColor.darkGray)
        text = show_value(key, value)
        shown = QTableWidgetItem(text)
        shown.setToolTip(text)
        table.setItem(row, 0, label)
        table.setItem(row, 1, shown)
    table.resizeRowsToContents()


def _rows(table: QTableWidget) -> dict[str, str]:
    rows: dict[str, str] = {}
    for row in range(table.rowCount()):
        label, value = table.item(row, 0), table.item(row, 1)
        rows[label.text() if label else ""] = value.text() if value else ""
    return rows
