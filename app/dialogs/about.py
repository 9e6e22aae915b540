"""The "About this machine" window: what this computer offers, and the loaded model.

``AboutDialog(loaded, parent=None, report=None)`` shows which Brisk this is
(version and commit, :mod:`app.version`) and two two-column tables.  "This
machine" lists the facts of ``report()`` (default: the bridge's
:func:`~app.bridge.machine_report`, ``engine.doctor``: Python, torch, CPU,
CUDA, GPU, memory...); that call imports torch, so it runs on a worker
thread (:func:`~app.background.in_background`) and the table says
"Checking\u2026" until the answer is in (then ``report_ready`` is True).
"Loaded model" lists the last :class:`~engine.api.Loaded` event with a human
label and format for each fact (:mod:`app.state.model_facts`).  Nothing is
estimated; facts that say nothing are not listed.
"""

from __future__ import annotations

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

from app import bridge
from app.background import in_background
from app.state.model_facts import machine_facts, model_facts
from app.version import describe
from engine.api import Loaded

Report = Callable[[], Mapping[str, Any]]

NO_MODEL = "No model is loaded yet."


def default_report() -> Mapping[str, Any]:
    return bridge.machine_report()


class AboutDialog(QDialog):
    def __init__(self, loaded: Loaded | None, parent: QWidget | None = None, *, report: Report | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About this machine")
        self.setMinimumSize(460, 420)
        layout = QVBoxLayout(self)
        self.version_label = QLabel(describe())
        self.version_label.setObjectName("aboutVersion")
        self.version_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.version_label)
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
        facts: Mapping[str, str] = model_facts(loaded)
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
            _fill(self.machine_table, machine_facts(result))
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


def _fill(table: QTableWidget, facts: Mapping[str, str]) -> None:
    """Rows of (label, text), both already as a person reads them."""
    table.setRowCount(0)
    for name, text in facts.items():
        row = table.rowCount()
        table.insertRow(row)
        label = QTableWidgetItem(name)
        label.setForeground(Qt.GlobalColor.darkGray)
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
