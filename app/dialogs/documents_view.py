"""The Documents view (Tools > Documents…): every document in the index, kept like data.

:class:`DocumentsDialog` is a table, one row per document the index holds
(:func:`document_rows` turns the library's ``DocumentInfo`` records into what
a row shows): name, the chats it is attached to, the file's size, its text
(characters and tokens), the index state, the KV kept on disk for it, when a
reply last used it, and its path.  The window reads the index on a worker and
hands the rows over with :meth:`show_rows`; the buttons act on the selected
document through the window: Remove (``remove_requested``: its index rows and
KV files go; chats that hold it then say so on their chips), Re-index
(``reindex_requested``: read the file again) and Open file (the system's
application).  Nothing here touches the index itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.dialogs.passage import open_file
from app.state.attachments import APPROX, estimated_tokens
from app.state.model_facts import size_text

COLUMNS = ("Name", "Chats", "Size", "Text", "Index", "KV on disk", "Last used", "Path")
STATES = {"indexed": "indexed", "indexing": "indexing\u2026", "failed": "words only"}
STATE_TIPS = {
    "indexed": "Searched by meaning and by its words",
    "words only": "Searched by its words; the meaning search (the embedding model) was not available",
    "indexing\u2026": "Its words are searchable; the meaning search is being built",
}
COLUMN_MAX_PX = 180  # a long name or chat title is cut (the tooltip has it whole); the path takes the rest


def document_rows(
    infos: Iterable[Any], kv: Mapping[str, int], chats: Mapping[str, Sequence[str]], tokens: Mapping[str, int]
) -> list[dict[str, Any]]:
    """One row per document: ``infos`` are the index's records, ``kv`` bytes on disk by id, ``chats`` the
    titles of the chats holding each id, ``tokens`` the counts the chats know."""
    rows = []
    for info in infos:
        doc_id = str(getattr(info, "id", ""))
        rows.append(
            {
                "id": doc_id,
                "name": str(getattr(info, "name", "") or doc_id[:12]),
                "path": str(getattr(info, "path", "") or ""),
                "size_bytes": int(getattr(info, "size_bytes", 0) or 0),
                "chars": int(getattr(info, "chars", 0) or 0),
                "tokens": tokens.get(doc_id),
                "state": str(getattr(info, "state", "") or ""),
                "embedded": bool(getattr(info, "embedded", False)),
                "chunks": int(getattr(info, "chunks", 0) or 0),
                "notes": tuple(getattr(info, "notes", ()) or ()),
                "kv_bytes": int(kv.get(doc_id, 0)),
                "last_used": float(getattr(info, "last_used", 0.0) or 0.0),
                "chats": list(chats.get(doc_id, ())),
            }
        )
    return rows


def text_cell(row: Mapping[str, Any]) -> str:
    tokens = row.get("tokens")
    count = f"{tokens:,} tokens" if isinstance(tokens, int) else f"{APPROX}{estimated_tokens(row['chars']):,} tokens"
    return f"{row['chars']:,} chars \u00b7 {count}"


def state_cell(row: Mapping[str, Any]) -> str:
    state = STATES.get(row["state"], row["state"] or "\u2014")
    if row["state"] == "indexed" and not row["embedded"]:
        state = STATES["failed"]
    return f"{state} ({row['chunks']:,} parts)" if row["chunks"] > 1 else state


def when_cell(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp > 0 else "never"


def chats_cell(titles: Sequence[str]) -> str:
    if not titles:
        return "none"
    return titles[0] if len(titles) == 1 else f"{titles[0]} + {len(titles) - 1} more"


class DocumentsDialog(QDialog):
    remove_requested = Signal(str)  # a document's id
    reindex_requested = Signal(str)
    refresh_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Documents")
        self.resize(1120, 440)
        self.rows: list[dict[str, Any]] = []
        layout = QVBoxLayout(self)
        intro = QLabel(
            "Every document attached to a chat is indexed once and kept: its text, its searchable parts and the "
            "model's KV of it on disk, reused by every chat that attaches the same file."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        layout.addWidget(self.table, 1)
        self.status = QLabel("Reading the index\u2026")
        self.status.setObjectName("hint")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        row = QHBoxLayout()
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the document from the index with its KV on disk (the file stays)")
        self.remove_button.clicked.connect(lambda: self._act(self.remove_requested))
        self.reindex_button = QPushButton("Re-index")
        self.reindex_button.setToolTip("Read the file again (it changed on disk); chats holding it use the new text")
        self.reindex_button.clicked.connect(lambda: self._act(self.reindex_requested))
        self.open_button = QPushButton("Open file")
        self.open_button.setToolTip("Open the original file with its application")
        self.open_button.clicked.connect(self._open_selected)
        for button in (self.remove_button, self.reindex_button, self.open_button):
            row.addWidget(button)
        row.addStretch(1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row.addWidget(buttons)
        layout.addLayout(row)
        self._selection_changed()

    def show_rows(self, rows: Sequence[Mapping[str, Any]], status: str = "") -> None:
        """Fill the table (the selected document stays selected when it is still there)."""
        selected = self.selected()
        keep = selected["id"] if selected else None
        self.rows = [dict(r) for r in rows]
        self.table.setRowCount(len(self.rows))
        for n, doc in enumerate(self.rows):
            cells = (
                doc["name"],
                chats_cell(doc["chats"]),
                size_text(doc["size_bytes"]),
                text_cell(doc),
                state_cell(doc),
                size_text(doc["kv_bytes"]) if doc["kv_bytes"] else "none yet",
                when_cell(doc["last_used"]),
                doc["path"],
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 1 and doc["chats"]:
                    item.setToolTip("\n".join(doc["chats"]))
                elif column == 4:
                    item.setToolTip("\n".join([STATE_TIPS.get(text.split(" (")[0], ""), *doc["notes"]]).strip())
                elif column == 1 and not doc["chats"]:
                    item.setToolTip("Attached to no chat now; attach it again to use it")
                elif column in (0, 7):
                    item.setToolTip(doc["path"])
                if column in (2, 5):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(n, column, item)
            if doc["id"] == keep:
                self.table.selectRow(n)
        self.table.resizeColumnsToContents()
        for column in range(len(COLUMNS) - 1):
            self.table.setColumnWidth(column, min(COLUMN_MAX_PX, self.table.columnWidth(column)))
        total = sum(r["kv_bytes"] for r in self.rows)
        count = f"{len(self.rows):,} document" + ("" if len(self.rows) == 1 else "s")
        kv = f"{size_text(total)} of KV on disk" if total else "no KV on disk yet (made at their first question)"
        self.status.setText(status or (f"{count}, {kv}." if self.rows else "No documents attached yet."))
        self._selection_changed()

    def show_status(self, text: str) -> None:
        self.status.setText(text)

    def selected(self) -> dict[str, Any] | None:
        rows = self.table.selectionModel().selectedRows()
        return self.rows[rows[0].row()] if rows and rows[0].row() < len(self.rows) else None

    def select(self, doc_id: str) -> bool:
        for n, row in enumerate(self.rows):
            if row["id"] == doc_id:
                self.table.selectRow(n)
                return True
        return False

    def _selection_changed(self) -> None:
        doc = self.selected()
        for button in (self.remove_button, self.reindex_button):
            button.setEnabled(doc is not None)
        self.open_button.setEnabled(doc is not None and bool(doc["path"]))

    def _act(self, signal: Any) -> None:
        doc = self.selected()
        if doc is not None:
            signal.emit(doc["id"])

    def _open_selected(self) -> None:
        doc = self.selected()
        if doc is not None and not open_file(doc["path"]):
            self.status.setText(f"{doc['name']} is no longer at {doc['path']}.")
