"""A cited passage: what a reply's source points at, read from the document index.

:class:`PassageDialog` opens at once on a source (``Metrics.sources``: its
document's name, path, chunk and character span) saying where the passage
lies, and shows the text when the window's worker has read it
(:meth:`show_text`, given the document's whole converted text: the passage is
shown highlighted among up to ``CONTEXT_CHARS`` of the text around it, a whole
document shown whole; ``passage`` holds the cited text alone) or why it cannot
(:meth:`show_missing`: the document left the index).  "Open file" opens the
original file with the system's application; it is greyed when the file is
no longer where it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.state.attachments import passage_of, position_text
from app.views.style import current
from engine.documents.render import source_label

CONTEXT_CHARS = 1500  # of the document's text shown before and after a passage


def open_file(path: str) -> bool:
    """Open ``path`` with the system's application for it; False when it is not there."""
    return bool(path) and Path(path).exists() and QDesktopServices.openUrl(QUrl.fromLocalFile(path))


class PassageDialog(QDialog):
    def __init__(self, source: Mapping[str, Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source = dict(source)
        self.passage = ""  # the cited text, once read
        self.setWindowTitle(f"Source: {source_label(source)}")
        self.resize(620, 460)
        layout = QVBoxLayout(self)
        self.heading = QLabel(f"<b>{_escape(source_label(source))}</b>")
        self.heading.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.heading)
        self.where = QLabel(f"{position_text(source).capitalize()}. Reading the document\u2026")
        self.where.setObjectName("hint")
        self.where.setWordWrap(True)
        layout.addWidget(self.where)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Passage")
        layout.addWidget(self.text, 1)
        self.path = str(source.get("path") or "")
        self.path_label = QLabel(self.path or "The path of the original file was not kept.")
        self.path_label.setObjectName("hint")
        self.path_label.setWordWrap(True)
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.path_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.open_button = QPushButton("Open file")
        there = bool(self.path) and Path(self.path).exists()
        self.open_button.setEnabled(there)
        self.open_button.setToolTip(
            "Open the original file with its application" if there else "The file is no longer at this path."
        )
        self.open_button.clicked.connect(lambda: open_file(self.path))
        buttons.addButton(self.open_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def show_text(self, whole: str) -> None:
        """The document's converted text arrived: show the cited part, highlighted among the text around it."""
        self.passage = passage_of(whole, self.source)
        if self.passage == whole:
            self.text.setPlainText(whole)
            self.where.setText(f"{position_text(self.source, len(whole)).capitalize()} of the text Brisk read.")
            return
        start = whole.find(self.passage, max(0, int(self.source.get("start") or 0)))
        begin, end = max(0, start - CONTEXT_CHARS), min(len(whole), start + len(self.passage) + CONTEXT_CHARS)
        before = ("\u2026" if begin else "") + whole[begin:start]
        after = whole[start + len(self.passage) : end] + ("\u2026" if end < len(whole) else "")
        self.text.setPlainText(before + self.passage + after)
        mark = QTextEdit.ExtraSelection()
        mark.cursor = QTextCursor(self.text.document())
        mark.cursor.setPosition(len(before))
        mark.cursor.setPosition(len(before) + len(self.passage), QTextCursor.MoveMode.KeepAnchor)
        highlight = QTextCharFormat()
        highlight.setBackground(QColor(current().banner_info_border))
        highlight.setForeground(QColor(current().text))
        mark.format = highlight
        self.text.setExtraSelections([mark])
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(len(before))
        self.text.setTextCursor(cursor)
        self.text.centerCursor()
        where = position_text(self.source, len(whole)).capitalize()
        self.where.setText(f"{where} of the text Brisk read, highlighted among the text around it.")

    def show_missing(self, why: str) -> None:
        self.text.setPlainText("")
        self.text.setPlaceholderText(why)
        self.where.setText(why)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
