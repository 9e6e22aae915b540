"""Paints one message of the chat list: the bubble, its header and actions, notices, content, stats.

:class:`MessageDelegate` is the only thing that knows how a message looks.  It
lays a row out in :meth:`MessageDelegate.layout` (the same geometry serves
painting, hit-testing and the text browser opened over a message), measures
it in :meth:`MessageDelegate.sizeHint` and paints it in :meth:`paint`.

Measuring is lazy, so a long conversation opens fast: a row that has never
been painted gets an *estimate* from its plain text (line count at the
current width); painting a row lays its HTML out in a ``QTextDocument`` for
the exact height, and when that differs from the row's laid-out height the
delegate emits ``sizeHintChanged`` and the view lays out again (Qt merges
these into one pass).  Exact heights are kept per message (a few bytes each);
laid-out documents are kept for the most recently painted rows only
(``DOC_CACHE`` of them), so memory does not grow with the conversation.

A reply from the answer cache shows its badge (accent colour) over the
content, and its actions are Copy and "Regenerate fresh" (a plain Regenerate
would be answered from the cache again).  A reply's tool calls are a section
over its content: a header line (``▸ 2 tool calls · 0.40 s``) and one line per
call; clicking the header opens or closes the results.

Clicks on an action emit ``action_triggered(name, message_id)`` (``copy``,
``regenerate``, ``fresh``, ``edit``, ``compare``, and ``tools`` for the tool
section's header); a click on a web link opens it (only
``http(s)``, see :func:`~app.views.markdown_render.safe_url`).  The editor is
a read-only ``QTextBrowser`` over the content, opened on demand (double-click
or "Select text"), so any message's text can be selected and copied.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QPointF,
    QRect,
    QSize,
    Qt,
    QTimer,
    QUrl,
    Signal,
)
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QDesktopServices,
    QFont,
    QFontMetrics,
    QMouseEvent,
    QPainter,
    QPalette,
    QPen,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTextBrowser,
    QWidget,
)

from app.views.chat_model import ITEM_ROLE, ChatItem, ChatModel
from app.views.markdown_render import safe_url
from app.views.style import ERROR, MUTED, WARNING

ROLE_NAMES = {"user": "You", "assistant": "Brisk"}
COLUMN_MAX_PX = 860
MARGIN_PX = 16  # around the column
ROW_GAP_PX = 12  # between two bubbles
PAD_X, PAD_Y, PART_GAP = 14, 10, 6
DOC_CACHE = 64
USER_BG, ASSISTANT_BG, BORDER = QColor("#eef4ff"), QColor("#ffffff"), QColor("#eceef1")
HOVER_BG, HOVER_FG, DISABLED_FG = QColor("#f3f4f6"), QColor("#111827"), QColor("#c7cbd1")
TEXT_FG = QColor("#111827")

ACTION_TEXT = {
    "copy": "Copy",
    "regenerate": "Regenerate",
    "fresh": "Regenerate fresh",
    "edit": "Edit",
    "compare": "Compare\u2026",
}
ACTION_TIPS = {
    "copy": "Copy this message to the clipboard",
    "regenerate": "Ask again for this reply with the same history",
    "fresh": "This reply came from the answer cache: generate a new one with the model (it replaces the cached one)",
    "tools": "Show or hide the tool results",
    "edit": "Edit this message; the replies after it are replaced",
    "compare": "Run this message again under other settings and compare",
}
BUSY_BLOCKED = ("regenerate", "fresh", "edit", "compare")  # not while a reply streams
BADGE_FG, TOOLS_FG = QColor("#1d6fd8"), QColor("#4b5563")

_Index = QModelIndex | QPersistentModelIndex


@dataclass
class RowLayout:
    """Where each part of one row goes, in the view's viewport coordinates."""

    bubble: QRect
    role: QRect
    actions: list[tuple[str, QRect]] = field(default_factory=list)
    notice: QRect | None = None
    badge: QRect | None = None
    tools_header: QRect | None = None
    tools: QRect | None = None
    content: QRect = field(default_factory=QRect)
    error: QRect | None = None
    stats: QRect | None = None

    def action_at(self, x: int, y: int) -> str | None:
        if self.tools_header is not None and self.tools_header.contains(x, y):
            return "tools"
        return next((name for name, rect in self.actions if rect.contains(x, y)), None)


class MessageDelegate(QStyledItemDelegate):
    action_triggered = Signal(str, int)  # (action, message id)

    def __init__(self, view: QAbstractItemView, model: ChatModel) -> None:
        super().__init__(view)
        self._view = view
        self._model = model
        self.colour_drafts = True
        self.busy = False
        self.compare_available = False
        self.hover: tuple[int, str] | None = None  # (message id, action) under the mouse
        self._layout_width: int | None = None
        self.editor: QTextBrowser | None = None  # the text browser open over a message, if any
        self._content_width = (-1, 0)
        self._stale: list[QPersistentModelIndex] = []
        self._stale_timer = QTimer(self)
        self._stale_timer.setSingleShot(True)
        self._stale_timer.setInterval(0)
        self._stale_timer.timeout.connect(self._emit_stale)
        self._docs: OrderedDict[tuple[int, int, int, bool], QTextDocument] = OrderedDict()
        self._set_font(view.font())

    def _set_font(self, font: QFont) -> None:
        self.font = QFont(font)
        self.bold = QFont(font)
        self.bold.setWeight(QFont.Weight.DemiBold)
        self.small = QFont(font)
        self.small.setPixelSize(11)
        self.fm, self.small_fm = QFontMetrics(self.font), QFontMetrics(self.small)
        self.bold_fm = QFontMetrics(self.bold)
        self.button_h = self.fm.height() + 8
        self._estimate_metrics = (
            (max(1, self.small_fm.averageCharWidth()), self.small_fm.lineSpacing()),
            (max(1, self.fm.averageCharWidth()), self.fm.lineSpacing()),
        )

    def forget(self) -> None:
        """Drop the laid-out documents (measurements stay on the items, keyed by what they depend on)."""
        self._docs.clear()

    # -- geometry ------------------------------------------------------------------------------
    def column(self, width: int) -> tuple[int, int]:
        """The bubble column's left edge and width for a viewport ``width`` px wide."""
        side = max(MARGIN_PX, (width - COLUMN_MAX_PX) // 2)
        return side, max(80, width - 2 * side)

    def content_width(self, width: int) -> int:
        if self._content_width[0] != width:
            self._content_width = (width, self.column(width)[1] - 2 * PAD_X)
        return self._content_width[1]

    def actions(self, item: ChatItem) -> list[str]:
        if item.role == "user":
            return ["copy", "edit", "compare"] if self.compare_available else ["copy", "edit"]
        return ["copy", "fresh"] if item.cached else ["copy", "regenerate"]

    def _wrapped(self, fm: QFontMetrics, text: str, width: int, exact: bool) -> int:
        if not text:
            return 0
        if not exact:  # lines at the average character width: cheap, corrected when painted
            return (1 + len(text) * fm.averageCharWidth() // max(1, width)) * fm.lineSpacing()
        return fm.boundingRect(QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, text).height()

    def layout(self, item: ChatItem, top: int, width: int, first: bool, exact: bool = True) -> RowLayout:
        """The row of ``item`` whose top edge is at ``top`` in a column laid out for ``width`` px."""
        left, bubble_w = self.column(width)
        inner_x, inner_w = left + PAD_X, bubble_w - 2 * PAD_X
        y = top + (MARGIN_PX if first else ROW_GAP_PX)
        bubble_top = y
        y += PAD_Y
        role = QRect(inner_x, y, inner_w // 2, self.button_h)
        box = RowLayout(bubble=QRect(), role=role)
        if exact:  # the estimate only needs heights
            right = inner_x + inner_w + 6  # the buttons' own padding lines their text up with the content
            for name in reversed(self.actions(item)):
                w = self.fm.horizontalAdvance(ACTION_TEXT[name]) + 12
                if right - w < left + 2:
                    break  # narrower than the buttons: the rest stay in the context menu
                right -= w
                box.actions.insert(0, (name, QRect(right, y, w, self.button_h)))
                right -= 2
            box.role.setRight(min(box.role.right(), right - 4))  # a narrow bubble elides the name, not an action
        y += self.button_h
        if item.notice:
            h = self._wrapped(self.small_fm, item.notice, inner_w, exact)
            box.notice = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.badge:
            h = self._wrapped(self.small_fm, item.badge, inner_w, exact)
            box.badge = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.tool_calls:
            header = item.tools_header
            w = min(inner_w, self.small_fm.horizontalAdvance(header) + 8) if exact else inner_w
            h = self.small_fm.height() + 4
            box.tools_header = QRect(inner_x, y + PART_GAP, w, h)
            y += PART_GAP + h
            h = self._wrapped(self.small_fm, item.tools_text, inner_w - 12, exact)
            box.tools = QRect(inner_x + 12, y, inner_w - 12, h)
            y += h
        h = self.content_height(item, inner_w, exact)
        box.content = QRect(inner_x, y + PART_GAP, inner_w, h)
        y += PART_GAP + h
        if item.error:
            h = self._wrapped(self.fm, item.error, inner_w, exact)
            box.error = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.stats:
            h = self._wrapped(self.small_fm, item.stats, inner_w, exact)
            box.stats = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        y += PAD_Y
        box.bubble = QRect(left, bubble_top, bubble_w, y - bubble_top)
        return box

    def row_height(self, item: ChatItem, width: int, first: bool, last: bool, exact: bool) -> int:
        if exact:
            box = self.layout(item, 0, width, first, exact)
            return box.bubble.bottom() + 1 + (MARGIN_PX if last else 0)
        # the same sums as ``layout`` with estimated wrapping, in plain arithmetic: this runs for every row
        inner = self.content_width(width)
        small, normal = self._estimate_metrics
        height = (MARGIN_PX if first else ROW_GAP_PX) + 2 * PAD_Y + self.button_h + (MARGIN_PX if last else 0)
        for text, (avg, line) in ((item.notice, small), (item.error, normal), (item.badge, small)):
            if text:
                height += PART_GAP + (1 + len(text) * avg // inner) * line
        if item.tool_calls:
            text = item.tools_text
            height += PART_GAP + self.small_fm.height() + 4
            height += (1 + text.count("\n") + len(text) * small[0] // max(1, inner - 12)) * small[1]
        if item.has_stats:  # one line, most often; formatting it waits until the row is painted
            height += PART_GAP + (1 + len(item.stats_text) * small[0] // inner) * small[1]
        return height + PART_GAP + self.content_height(item, inner, exact=False)

    def content_height(self, item: ChatItem, width: int, exact: bool) -> int:
        colour = self.colour_drafts
        known = item.content_size
        if known is not None and known[:3] == (item.revision, width, colour) and (known[4] or not exact):
            return known[3]
        if exact:
            height = math.ceil(self.document(item, width).size().height())
            item.row_size = None  # sizeHint must now answer the exact row
        else:
            height = self._estimate(item.text, width)
        item.content_size = (item.revision, width, colour, height, exact)
        return height

    def is_measured(self, item: ChatItem, width: int) -> bool:
        known = item.content_size
        return known is not None and known[:3] == (item.revision, width, self.colour_drafts) and known[4]

    def _estimate(self, text: str, width: int) -> int:
        """About how tall the rendered text is: wrapped lines at the average character width."""
        avg, line = self._estimate_metrics[1]
        return (1 + text.count("\n") + len(text) * avg // width) * line

    def document(self, item: ChatItem, width: int) -> QTextDocument:
        key = (item.message_id, item.revision, width, self.colour_drafts)
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self.font)
        doc.setHtml(item.html(self.colour_drafts))
        doc.setTextWidth(width)
        self._docs[key] = doc
        while len(self._docs) > DOC_CACHE:
            self._docs.popitem(last=False)
        return doc

    def layout_width(self) -> int:
        """The width rows are laid out for: the view less a scroll bar, shown or not, so that the bar
        appearing (a long chat) does not change every row's height and force a second layout."""
        if self._layout_width is None:
            view = self._view
            extent = view.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, view)
            self._layout_width = max(120, view.width() - 2 * view.frameWidth() - extent)
        return self._layout_width

    def view_resized(self) -> None:
        self._layout_width = None

    def _row_box(self, option: QStyleOptionViewItem, index: _Index, exact: bool = True) -> RowLayout:
        item: ChatItem = index.data(ITEM_ROLE)
        return self.layout(item, option.rect.top(), self.layout_width(), index.row() == 0, exact)

    # -- Qt's delegate interface --------------------------------------------------------------------
    def sizeHint(self, option: QStyleOptionViewItem, index: _Index) -> QSize:  # noqa: N802 (Qt override)
        # called for every row at each layout: a few look-ups once a row is known, arithmetic before
        row, rows = index.row(), self._model.rows
        item = rows[row]
        width = self._layout_width or self.layout_width()
        first, last = row == 0, row == len(rows) - 1
        key = (item.revision, width, self.colour_drafts, first, last)
        known = item.row_size
        if known is None or known[0] != key:
            exact = self.is_measured(item, self.content_width(width))
            known = (key, self.row_height(item, width, first, last, exact))
            item.row_size = known
        return QSize(width, known[1])

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: _Index) -> None:
        item: ChatItem = index.data(ITEM_ROLE)
        width = self.layout_width()
        box = self.layout(item, option.rect.top(), width, index.row() == 0, exact=True)
        last = index.row() == index.model().rowCount() - 1
        if box.bubble.bottom() + 1 + (MARGIN_PX if last else 0) != option.rect.bottom() + 1:
            self._relayout_later(index)  # the estimate was off: the view lays out again
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        bubble = box.bubble.adjusted(0, 0, -1, -1)
        if item.role == "user":
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(USER_BG)
        else:
            painter.setPen(QPen(BORDER, 1))
            painter.setBrush(ASSISTANT_BG)
        painter.drawRoundedRect(QRect(bubble).translated(0, 0), 12, 12)
        painter.setFont(self.bold)
        painter.setPen(QColor(MUTED))
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        name = self.bold_fm.elidedText(
            ROLE_NAMES.get(item.role, item.role.title()), Qt.TextElideMode.ElideRight, box.role.width()
        )
        painter.drawText(box.role, align, name)
        self._paint_actions(painter, item, box)
        wrap = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap
        if box.notice is not None:
            painter.setFont(self.small)
            painter.setPen(QColor(WARNING))
            painter.drawText(box.notice, wrap, item.notice)
        if box.badge is not None:
            painter.setFont(self.small)
            painter.setPen(BADGE_FG)
            painter.drawText(box.badge, wrap, item.badge)
        if box.tools_header is not None and box.tools is not None:
            self._paint_tools(painter, item, box.tools_header, box.tools, wrap)
        self._paint_content(painter, item, box.content)
        if box.error is not None:
            painter.setFont(self.font)
            painter.setPen(QColor(ERROR))
            painter.drawText(box.error, wrap, item.error)
        if box.stats is not None:
            painter.setFont(self.small)
            painter.setPen(QColor(MUTED))
            painter.drawText(box.stats, wrap, item.stats)
        painter.restore()

    def _relayout_later(self, index: _Index) -> None:
        """Ask for a new layout once this paint is over: a layout (and the scroll that follows it) from
        inside a paint event would not be painted."""
        self._stale.append(QPersistentModelIndex(index))
        if not self._stale_timer.isActive():
            self._stale_timer.start()

    def _emit_stale(self) -> None:
        stale, self._stale = self._stale, []
        for index in stale:
            if index.isValid():
                self.sizeHintChanged.emit(QModelIndex(index))

    def _paint_actions(self, painter: QPainter, item: ChatItem, box: RowLayout) -> None:
        painter.setFont(self.font)
        for name, rect in box.actions:
            enabled = not (self.busy and name in BUSY_BLOCKED)
            hovered = enabled and self.hover == (item.message_id, name)
            if hovered:
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(HOVER_BG)
                painter.drawRoundedRect(rect, 6, 6)
            painter.setPen(HOVER_FG if hovered else QColor(MUTED) if enabled else DISABLED_FG)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, ACTION_TEXT[name])

    def _paint_tools(
        self, painter: QPainter, item: ChatItem, header: QRect, body: QRect, wrap: Qt.AlignmentFlag
    ) -> None:
        painter.setFont(self.small)
        if self.hover == (item.message_id, "tools"):
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(HOVER_BG)
            painter.drawRoundedRect(header, 4, 4)
        painter.setPen(TOOLS_FG)
        painter.drawText(
            header.adjusted(2, 0, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, item.tools_header
        )
        painter.setPen(QColor(MUTED))
        painter.drawText(body, wrap, item.tools_text)

    def _paint_content(self, painter: QPainter, item: ChatItem, rect: QRect) -> None:
        doc = self.document(item, rect.width())
        painter.save()
        painter.translate(rect.topLeft())
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = QPalette(self._view.palette())
        palette.setColor(QPalette.ColorRole.Text, TEXT_FG)
        context.palette = palette
        context.clip = QRect(0, 0, rect.width(), rect.height())
        painter.setClipRect(context.clip)
        doc.documentLayout().draw(painter, context)
        painter.restore()

    def anchor_at(self, item: ChatItem, box: RowLayout, x: int, y: int) -> str:
        if not box.content.contains(x, y):
            return ""
        doc = self.document(item, box.content.width())
        return doc.documentLayout().anchorAt(QPointF(x - box.content.left(), y - box.content.top()))

    def editorEvent(  # noqa: N802 (Qt override)
        self, event: QEvent, model: QAbstractItemModel, option: QStyleOptionViewItem, index: _Index
    ) -> bool:
        kind = event.type()
        if not isinstance(event, QMouseEvent) or kind not in (
            QEvent.Type.MouseButtonRelease,
            QEvent.Type.MouseButtonDblClick,
            QEvent.Type.MouseButtonPress,
        ):
            return False
        item: ChatItem = index.data(ITEM_ROLE)
        box = self._row_box(option, index)
        pos = event.position().toPoint()
        action = box.action_at(pos.x(), pos.y())
        if action is not None:
            released = kind == QEvent.Type.MouseButtonRelease and event.button() == Qt.MouseButton.LeftButton
            if released and not (self.busy and action in BUSY_BLOCKED):
                self.action_triggered.emit(action, item.message_id)
            return True  # a click on an action never opens the text editor
        anchor = self.anchor_at(item, box, pos.x(), pos.y())
        if anchor and kind == QEvent.Type.MouseButtonRelease and event.button() == Qt.MouseButton.LeftButton:
            open_link(anchor)
            return True
        return False

    # -- the read-only text browser for selecting text --------------------------------------------------
    def createEditor(self, parent: QWidget, option: QStyleOptionViewItem, index: _Index) -> QWidget:  # noqa: N802
        browser = QTextBrowser(parent)
        browser.setObjectName("messageText")
        browser.setFrameShape(QFrame.Shape.NoFrame)
        browser.setReadOnly(True)
        browser.setOpenLinks(False)
        browser.anchorClicked.connect(lambda url: open_link(url.toString()))
        browser.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        browser.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        browser.document().setDocumentMargin(0)
        browser.document().setDefaultFont(self.font)
        browser.viewport().setAutoFillBackground(False)
        browser.setStyleSheet("QTextBrowser#messageText { background: transparent; border: none; padding: 0; }")
        self.editor = browser
        return browser

    def destroyEditor(self, editor: QWidget, index: _Index) -> None:  # noqa: N802 (Qt override)
        if editor is self.editor:
            self.editor = None
        super().destroyEditor(editor, index)

    def setEditorData(self, editor: QWidget, index: _Index) -> None:  # noqa: N802 (Qt override)
        item: ChatItem = index.data(ITEM_ROLE)
        if isinstance(editor, QTextBrowser):
            html = item.html(self.colour_drafts)
            if editor.property("shownHtml") != html:
                editor.setHtml(html)
                editor.setProperty("shownHtml", html)

    def setModelData(self, editor: QWidget, model: QAbstractItemModel, index: _Index) -> None:  # noqa: N802
        return  # read-only: nothing goes back into the conversation

    def updateEditorGeometry(  # noqa: N802 (Qt override)
        self, editor: QWidget, option: QStyleOptionViewItem, index: _Index
    ) -> None:
        editor.setGeometry(self._row_box(option, index).content)


def open_link(url: str) -> None:
    if safe_url(url):
        QDesktopServices.openUrl(QUrl(url))
