"""The attached documents above the composer: one chip each, and the indexing progress with its Cancel.

:class:`DocumentChips` shows a chat's documents (``engine.storage.chat_documents``
entries) as chips that wrap onto more lines as needed (:class:`FlowLayout`):
"report.pdf · 3,012 tokens", the path and counts in the tooltip, a × that
emits ``detach_requested(doc_id)``.  A document no longer in the index reads
"removed from the index" and is greyed; one too long to go whole into the
prompt says "searched" (each question gets its matching passages).  Past ``SHOWN`` chips the rest fold
into a "+N more" button that shows them all (a folder of notes is hundreds of
documents).  :meth:`show_progress` / :meth:`hide_progress` drive the line
shown while files are read ("Reading report.pdf (12 of 40)…", a bar, Cancel:
``cancel_requested``).  The widget hides itself when it has nothing to show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLayoutItem,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
    QWidgetItem,
)

from app.state.attachments import chip_text, chip_tip

SHOWN = 8  # chips shown before the rest fold into "+N more"
NAME_CHARS = 40  # a longer name is cut in the middle on its chip (the tooltip has the path)


class FlowLayout(QLayout):
    """Items left to right, wrapping onto the next line when the width runs out."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._gap = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 (Qt override)
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt override)
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt override)
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 (Qt override)
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt override)
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt override)
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt override)
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return self.minimumSize()

    def minimumSize(self) -> QSize:  # noqa: N802 (Qt override)
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        return size

    def _place(self, rect: QRect, move: bool) -> int:
        x, y, line = rect.x(), rect.y(), 0
        for item in self._items:
            if item.isEmpty():
                continue
            hint = item.sizeHint()
            if x > rect.x() and x + hint.width() > rect.right() + 1:
                x, y, line = rect.x(), y + line + self._gap, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + self._gap
            line = max(line, hint.height())
        return y + line - rect.y()


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """``name`` cut in the middle to ``limit`` characters (the extension stays readable)."""
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[: keep - keep // 3] + "\u2026" + name[-(keep // 3) :]


class Chip(QFrame):
    """One attached document: its name and token count, and a × that detaches it."""

    def __init__(
        self, doc: Mapping[str, Any], gone: bool, searched: bool, on_detach: Any, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.doc_id = str(doc["id"])
        self.setObjectName("docChipGone" if gone else "docChip")
        self.setToolTip(chip_tip(doc, gone, searched))
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 2, 2, 2)
        row.setSpacing(2)
        shown = dict(doc)
        shown["name"] = short_name(str(doc.get("name", "")))
        self.label = QLabel(chip_text(shown, gone, searched))
        self.label.setObjectName("docChipText")
        row.addWidget(self.label)
        self.close_button = QToolButton()
        self.close_button.setObjectName("docChipClose")
        self.close_button.setText("\u00d7")
        self.close_button.setToolTip("Detach from this chat (the document stays in the Documents view)")
        self.close_button.setAccessibleName(f"Detach {doc.get('name', '')}")
        self.close_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.close_button.clicked.connect(lambda: on_detach(self.doc_id))
        row.addWidget(self.close_button)

    def text(self) -> str:
        return self.label.text()


class DocumentChips(QWidget):
    detach_requested = Signal(str)  # a document's id
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentChips")
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 2)
        column.setSpacing(4)
        self.progress_row = QWidget()
        progress = QHBoxLayout(self.progress_row)
        progress.setContentsMargins(0, 0, 0, 0)
        progress.setSpacing(8)
        self.progress_label = QLabel()
        self.progress_label.setObjectName("hint")
        self.progress_label.setMinimumWidth(1)  # a long file name is cut, never widens the window
        progress.addWidget(self.progress_label, 1)
        self.progress_bar = QProgressBar()
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setFixedWidth(120)
        progress.addWidget(self.progress_bar)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop reading files; those read so far stay attached")
        self.cancel_button.clicked.connect(self.cancel_requested)
        progress.addWidget(self.cancel_button)
        self.progress_row.hide()
        column.addWidget(self.progress_row)
        self.flow_host = QWidget()
        self.flow = FlowLayout(self.flow_host)
        column.addWidget(self.flow_host)
        self.more_button = QToolButton()
        self.more_button.setObjectName("docChipMore")
        self.more_button.clicked.connect(self._toggle_more)
        self.chips: list[Chip] = []
        self.expanded = False
        self._docs: list[dict[str, Any]] = []
        self._gone: set[str] = set()
        self._searched: set[str] = set()
        self.setVisible(False)

    # -- the chips ----------------------------------------------------------------------------------
    def set_documents(
        self, docs: Sequence[Mapping[str, Any]], gone: Iterable[str] = (), searched: Iterable[str] = ()
    ) -> None:
        """Show these documents (``gone``: ids no longer in the index; ``searched``: too long to go whole)."""
        new = [dict(d) for d in docs]
        if new != self._docs or set(gone) != self._gone or set(searched) != self._searched:
            if len(new) <= SHOWN:
                self.expanded = False
            self._docs, self._gone, self._searched = new, set(gone), set(searched)
            self._rebuild()

    def _rebuild(self) -> None:
        for chip in self.chips:
            self.flow.removeWidget(chip)
            chip.deleteLater()
        self.chips = []
        self.flow.removeWidget(self.more_button)
        shown = self._docs if self.expanded else self._docs[:SHOWN]
        for doc in shown:
            doc_id = doc["id"]
            chip = Chip(doc, doc_id in self._gone, doc_id in self._searched, self.detach_requested.emit, self.flow_host)
            self.flow.addWidget(chip)
            self.chips.append(chip)
        hidden = len(self._docs) - len(shown)
        if hidden or self.expanded:
            self.more_button.setText("Show fewer" if self.expanded else f"+{hidden:,} more")
            self.more_button.setToolTip("Show every attached document" if hidden else "Fold the list again")
            self.flow.addItem(QWidgetItem(self.more_button))
            self.more_button.setParent(self.flow_host)
            self.more_button.show()
        else:
            self.more_button.hide()
        self.flow_host.setVisible(bool(self._docs))
        self._show_if_needed()
        self.flow.invalidate()
        self.updateGeometry()

    def _toggle_more(self) -> None:
        self.expanded = not self.expanded
        self._rebuild()

    def texts(self) -> list[str]:
        """What the chips say, in order (tests read it)."""
        return [chip.text() for chip in self.chips]

    def chip(self, doc_id: str) -> Chip | None:
        return next((c for c in self.chips if c.doc_id == doc_id), None)

    # -- indexing progress ------------------------------------------------------------------------------
    def show_progress(self, text: str, done: int = 0, total: int = 0) -> None:
        self.progress_label.setText(text)
        self.progress_label.setToolTip(text)
        if total > 1:
            self.progress_bar.setRange(0, total)
            self.progress_bar.setValue(min(done, total))
        else:
            self.progress_bar.setRange(0, 0)  # busy: one file, its pages unknown
        self.cancel_button.setEnabled(True)
        self.progress_row.show()
        self._show_if_needed()

    def hide_progress(self) -> None:
        self.progress_row.hide()
        self._show_if_needed()

    @property
    def indexing(self) -> bool:
        return not self.progress_row.isHidden()

    def _show_if_needed(self) -> None:
        self.setVisible(bool(self._docs) or not self.progress_row.isHidden())
