"""The Models view (Tools > Models…, Ctrl+Shift+M): the models already on disk, and downloads.

:class:`ModelsDialog` lists what ``engine.client.model_library`` finds (LM
Studio, Ollama, GPT4All, Jan, the Hugging Face cache, the user's folders),
scanned on a worker so the window never waits: name, where it was found,
architecture, parameters, format and quantization, size, the memory it needs
against what is free, and which of Brisk's paths runs it.  A model that
cannot load says why before anything loads (greyed, the reason under the
table).  **Load** hands the model to the window (``load_requested``: Settings
``model``, remembered), **Use as draft** makes the selected model the draft
model (offered only where it shares the loaded model's vocabulary and is
smaller), **Add folder…** adds a folder to scan (its arrow lists them, to remove one).  The download row fetches a
repo from the Hugging Face hub (``engine.client.pull_model``) with a progress
bar, speed and time left, and Cancel; a cancelled or cut download resumes
next time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.background import in_background
from app.state.model_facts import size_text
from app.state.model_library import COLUMNS, SOURCE_NAMES, SOURCES, ModelRow, model_rows, progress_text
from engine.client import model_drafts, model_library, pull_model
from engine.library.scan import system_folder_problem

NAME_MAX_PX = 300
DRAFT_TIP = "Draft tokens with this smaller model of the same vocabulary (speculative decoding)"
NO_DRAFT_TIP = "Only a smaller model with the loaded model's vocabulary can draft for it"
POLL_MS = 100


class ModelsDialog(QDialog):
    load_requested = Signal(str)  # the Settings.model value of the chosen model ("" = bundled)
    draft_requested = Signal(str)  # the path of a model to draft with
    folders_changed = Signal(list)  # the folders the library scans

    def __init__(
        self,
        model_setting: str,
        folders: list[str],
        parent: QWidget | None = None,
        scan: Callable[[list[str]], Any] = model_library,
        drafts: Callable[[Any, Any], list[Any]] = model_drafts,
        pull: Callable[..., Any] = pull_model,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("modelsDialog")
        self.resize(1120, 580)
        self.model_setting, self.folders = model_setting, list(folders)
        self._scan, self._drafts, self._pull = scan, drafts, pull
        self.library: Any = None
        self.rows: list[ModelRow] = []
        self._cancel: threading.Event | None = None
        self._progress: Any = None  # the latest PullProgress, set by the download's thread

        layout = QVBoxLayout(self)
        self.summary = QLabel("Looking for models\u2026")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by name, source, architecture or quantization")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(lambda _text: self._fill())
        layout.addWidget(self.filter_edit)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._selected)
        self.table.itemDoubleClicked.connect(lambda _item: self.load_selected())
        layout.addWidget(self.table, 1)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.details)

        actions = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Chat with this model from now on (remembered)")
        self.load_button.clicked.connect(self.load_selected)
        self.draft_button = QPushButton("Use as draft")
        self.draft_button.clicked.connect(self.draft_selected)
        self.add_button = QToolButton()
        self.add_button.setText("Add folder\u2026")
        self.add_button.setToolTip("Also look for models in a folder of yours; the arrow lists them to remove one")
        self.add_button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        self.folders_menu = QMenu(self.add_button)
        self.folders_menu.aboutToShow.connect(self._list_folders)
        self.add_button.setMenu(self.folders_menu)
        self.add_button.clicked.connect(self.add_folder)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        for button in (self.load_button, self.draft_button, self.add_button, self.refresh_button):
            actions.addWidget(button)
        actions.addStretch(1)
        layout.addLayout(actions)

        download = QHBoxLayout()
        download.addWidget(QLabel("Download from Hugging Face:"))
        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("repo, e.g. bartowski/SmolLM2-135M-Instruct-GGUF")
        self.repo_edit.returnPressed.connect(self.start_download)
        self.quant_edit = QLineEdit()
        self.quant_edit.setPlaceholderText("quantization or file (optional)")
        self.quant_edit.setToolTip("Q4_K_M picks that GGUF file from a repo holding several; or a file's name")
        self.quant_edit.setMaximumWidth(240)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_download)
        download.addWidget(self.repo_edit, 2)
        download.addWidget(self.quant_edit, 1)
        download.addWidget(self.download_button)
        download.addWidget(self.cancel_button)
        layout.addLayout(download)
        progress_row = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.progress_label = QLabel("")
        progress_row.addWidget(self.progress, 1)
        progress_row.addWidget(self.progress_label, 1)
        layout.addLayout(progress_row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._show_progress)
        self._update_buttons()
        self.refresh()

    # -- the list ---------------------------------------------------------------------------
    def refresh(self) -> None:
        self.refresh_button.setEnabled(False)
        self.summary.setText("Looking for models\u2026")
        folders = list(self.folders)
        in_background(self, lambda: self._scan(folders), ModelsDialog._scanned)

    def _scanned(self, result: Any) -> None:
        self.refresh_button.setEnabled(True)
        if isinstance(result, Exception):
            self.summary.setText(f"The models on disk could not be listed: {result}")
            return
        self.library = result
        self._fill()

    def _fill(self) -> None:
        if self.library is None:
            return
        entries = self.library.entries
        self.rows = model_rows(entries, self.model_setting, self.filter_edit.text())
        found = {e.source for e in entries} - {"bundled"}
        where = ", ".join(SOURCE_NAMES.get(s, s) for s in SOURCES if s in found) or "no other app's folder"
        free = self.library.free_memory_bytes
        self.summary.setText(
            f"{len(entries)} models on this computer (from {where}), listed in "
            f"{self.library.seconds * 1000:.0f} ms; {size_text(free)} of memory free. "
            "Nothing is copied: Brisk loads each from where it is."
        )
        self.table.setRowCount(len(self.rows))
        bold = QFont(self.table.font())
        bold.setBold(True)
        for r, row in enumerate(self.rows):
            for c, text in enumerate(row.cells):
                shown = f"{text} (in use)" if c == 0 and row.in_use else text
                item = QTableWidgetItem(shown)
                item.setToolTip(row.tooltip)
                if row.in_use:
                    item.setFont(bold)
                if not row.loadable:
                    item.setForeground(self.palette().placeholderText())
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        if self.table.columnWidth(0) > NAME_MAX_PX:
            self.table.setColumnWidth(0, NAME_MAX_PX)
        current = next((i for i, row in enumerate(self.rows) if row.in_use), 0 if self.rows else -1)
        if current >= 0:
            self.table.selectRow(current)
        self._selected()

    def selected_row(self) -> ModelRow | None:
        index = self.table.currentRow()
        return self.rows[index] if 0 <= index < len(self.rows) else None

    def _loaded_entry(self) -> Any:
        return next((row.entry for row in self.rows if row.in_use), None)

    def _selected(self) -> None:
        row = self.selected_row()
        self._update_buttons()
        if row is None:
            self.details.setText("")
            return
        entry = row.entry
        lines = [f"<b>{_escape(entry.name)}</b> \u2014 {_escape(entry.path)}"]
        if entry.problem:
            lines.append(f"Cannot load: {_escape(entry.problem)}")
        elif entry.support:
            lines.append(_escape(entry.support))
        if self.library is not None and not entry.problem:
            drafts = self._drafts(entry, self.library)
            if drafts:
                lines.append(f"Can draft for it (same vocabulary, smaller): {_escape(drafts[0].name)}")
        self.details.setText("<br>".join(lines))

    def _update_buttons(self) -> None:
        row = self.selected_row()
        self.load_button.setEnabled(row is not None and row.loadable and not row.in_use)
        loaded = self._loaded_entry()
        can_draft = False
        if row is not None and loaded is not None and self.library is not None and row.loadable:
            can_draft = any(d is row.entry for d in self._drafts(loaded, self.library))
        self.draft_button.setEnabled(can_draft)
        self.draft_button.setToolTip(DRAFT_TIP if can_draft else NO_DRAFT_TIP)

    def load_selected(self) -> None:
        row = self.selected_row()
        if row is None or not row.loadable or row.in_use:
            return
        self.model_setting = row.path
        self.load_requested.emit(row.path)
        self._fill()

    def draft_selected(self) -> None:
        row = self.selected_row()
        if row is not None and self.draft_button.isEnabled():
            self.draft_requested.emit(str(row.entry.path))
            self.details.setText(f"{_escape(row.entry.name)} drafts for the loaded model from the next reply.")

    def add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            self.add_folder_path(folder)

    def _list_folders(self) -> None:
        """The folders of the user's the library scans, each a "Remove" entry (or a line saying there is none)."""
        self.folders_menu.clear()
        if not self.folders:
            self.folders_menu.addAction("No folders of yours yet").setEnabled(False)
        for folder in self.folders:
            self.folders_menu.addAction(f"Remove {folder}").triggered.connect(
                lambda _checked=False, f=folder: self.remove_folder_path(f)
            )

    def remove_folder_path(self, folder: str) -> None:
        if folder in self.folders:
            self.folders.remove(folder)
            self.folders_changed.emit(list(self.folders))
        self.refresh()

    def add_folder_path(self, folder: str) -> None:
        if problem := system_folder_problem(folder):  # /, /proc, /sys, /dev: never walked for models
            self.details.setText(_escape(problem))
            return
        if folder not in self.folders:
            self.folders.append(folder)
            self.folders_changed.emit(list(self.folders))
        self.refresh()

    # -- downloads --------------------------------------------------------------------------
    def start_download(self) -> None:
        repo = self.repo_edit.text().strip()
        if not repo or self._cancel is not None:
            return
        which = self.quant_edit.text().strip()
        file = which if which.lower().endswith(".gguf") else None
        quant = None if file else (which or None)
        self._cancel = threading.Event()
        cancel = self._cancel
        self._progress = None
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setVisible(True)
        self.progress.setValue(0)
        self.progress_label.setText(f"Asking the hub about {repo}\u2026")

        def progress(p: Any) -> None:
            self._progress = p  # read by the GUI thread's timer

        in_background(self, lambda: self._pull(repo, file, quant, progress, cancel), ModelsDialog._downloaded)
        self._timer.start()

    def cancel_download(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.progress_label.setText("Stopping\u2026 (what was fetched is kept; Download again resumes)")

    def _show_progress(self) -> None:
        p = self._progress
        if p is None:
            return
        total = max(int(p.total_bytes), 1)
        self.progress.setValue(int(1000 * min(p.done_bytes / total, 1.0)))
        self.progress_label.setText(progress_text(p.done_bytes, p.total_bytes, p.speed_bps, p.eta_s))

    def _downloaded(self, result: Any) -> None:
        self._timer.stop()
        self._show_progress()
        self._cancel = None
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if isinstance(result, Exception):
            self.progress.setVisible(self.progress.value() > 0)  # a partial download stays shown (it resumes)
            self.progress_label.setText(str(result))
            return
        self.progress.setValue(1000)
        self.progress_label.setText(f"Downloaded {result.repo} ({size_text(result.bytes)}).")
        self.refresh()


def _escape(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
