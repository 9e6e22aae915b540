"""The chat list's item delegate: Qt's entry points for one message row (size, paint, clicks, text browser).

:class:`MessageDelegate` answers the list view.  What a row looks like lives in
two modules it calls: :class:`~app.views.message_geometry.MessageGeometry`
(``geometry``: fonts, the :class:`~app.views.message_geometry.RowLayout` of a
row, heights, laid-out documents) and :func:`~app.views.message_paint.paint_row`.
The same geometry serves painting, hit-testing and the text browser opened
over a message.

Measuring is lazy, so a long conversation opens fast: :meth:`sizeHint` gives
a row that has never been painted an *estimate* from its plain text; painting
a row lays its HTML out for the exact height, and when that differs from the
row's laid-out height the delegate emits ``sizeHintChanged`` once the paint is
over and the view lays out again (Qt merges these into one pass).  Rows are
laid out for the view's width less a scroll bar (:meth:`layout_width`), so the
bar appearing does not change every row's height.

Clicks on an action emit ``action_triggered(name, message_id)`` (``copy``,
``regenerate``, ``edit``, ``compare``, the version arrows ``older`` and
``newer``, and ``tools`` for the tool section's header; only those
:func:`~app.views.message_geometry.action_enabled` allows: none of
``BUSY_BLOCKED`` while ``busy``, never the version label); a click on a web
link opens it (only ``http(s)``, see :func:`~app.views.markdown_render.safe_url`).  A click on a
reply's thinking line opens or closes its thinking here (:meth:`MessageDelegate.toggle_thinking`).
The editor is a read-only ``QTextBrowser`` over the content, opened on demand
(double-click or "Select text"), so any message's text can be selected and
copied; nothing goes back into the conversation.
"""

from __future__ import annotations

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QPointF,
    QSize,
    Qt,
    QTimer,
    QUrl,
    Signal,
)
from PySide6.QtGui import QDesktopServices, QMouseEvent, QPainter
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
from app.views.markdown_render import COPY_LINK, safe_url
from app.views.message_geometry import MARGIN_PX, MessageGeometry, RowLayout, action_enabled
from app.views.message_paint import paint_row

_Index = QModelIndex | QPersistentModelIndex


class MessageDelegate(QStyledItemDelegate):
    action_triggered = Signal(str, int)  # (action, message id)
    code_copy_requested = Signal(int, int)  # (message id, code block number): its "Copy code" link

    def __init__(self, view: QAbstractItemView, model: ChatModel) -> None:
        super().__init__(view)
        self._view = view
        self._model = model
        self.geometry = MessageGeometry(view.font())
        self.busy = False
        self.hover: tuple[int, str] | None = None  # (message id, action) under the mouse
        self._layout_width: int | None = None
        self.editor: QTextBrowser | None = None  # the text browser open over a message, if any
        self._stale: list[QPersistentModelIndex] = []
        self._stale_timer = QTimer(self)
        self._stale_timer.setSingleShot(True)
        self._stale_timer.setInterval(0)
        self._stale_timer.timeout.connect(self._emit_stale)

    @property
    def colour_drafts(self) -> bool:
        return self.geometry.colour_drafts

    @colour_drafts.setter
    def colour_drafts(self, on: bool) -> None:
        self.geometry.colour_drafts = on

    @property
    def compare_available(self) -> bool:
        return self.geometry.compare_available

    @compare_available.setter
    def compare_available(self, available: bool) -> None:
        self.geometry.compare_available = available

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

    def row_layout(self, item: ChatItem, top: int, first: bool) -> RowLayout:
        """The exact layout of ``item``'s row whose top edge is at ``top`` in the view now."""
        return self.geometry.layout(item, top, self.layout_width(), first)

    def _row_box(self, option: QStyleOptionViewItem, index: _Index, exact: bool = True) -> RowLayout:
        item: ChatItem = index.data(ITEM_ROLE)
        return self.geometry.layout(item, option.rect.top(), self.layout_width(), index.row() == 0, exact)

    # -- Qt's delegate interface --------------------------------------------------------------------
    def sizeHint(self, option: QStyleOptionViewItem, index: _Index) -> QSize:  # noqa: N802 (Qt override)
        # called for every row at each layout: a few look-ups once a row is known, arithmetic before
        row, rows = index.row(), self._model.rows
        item = rows[row]
        width = self._layout_width or self.layout_width()
        first, last = row == 0, row == len(rows) - 1
        geometry = self.geometry
        key = (item.revision, width, geometry.colour_drafts, first, last)
        known = item.row_size
        if known is None or known[0] != key:
            exact = geometry.is_measured(item, geometry.content_width(width))
            known = (key, geometry.row_height(item, width, first, last, exact))
            item.row_size = known
            answered = item.answered
            if answered is not None and answered[0] == key and answered[1] != known[1]:
                # the same row at the same width, measured since (a paint, a hit test): the view still
                # places the rows below it, and sizes its scroll range, by the old height until told
                self._relayout_later(index)
        item.answered = known
        return QSize(width, known[1])

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: _Index) -> None:
        item: ChatItem = index.data(ITEM_ROLE)
        width = self.layout_width()
        box = self.geometry.layout(item, option.rect.top(), width, index.row() == 0, exact=True)
        last = index.row() == index.model().rowCount() - 1
        if box.bubble.bottom() + 1 + (MARGIN_PX if last else 0) != option.rect.bottom() + 1:
            self._relayout_later(index)  # the estimate was off: the view lays out again
        paint_row(painter, self.geometry, item, box, hover=self.hover, busy=self.busy, palette=self._view.palette())

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

    def anchor_at(self, item: ChatItem, box: RowLayout, x: int, y: int) -> str:
        if not box.content.contains(x, y):
            return ""
        doc = self.geometry.document(item, box.content.width())
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
            if released and action == "thinking":
                self.toggle_thinking(item.message_id)
            elif released and action_enabled(item, action, self.busy):
                self.action_triggered.emit(action, item.message_id)
            return True  # a click on an action never opens the text editor
        anchor = self.anchor_at(item, box, pos.x(), pos.y())
        if anchor and kind == QEvent.Type.MouseButtonRelease and event.button() == Qt.MouseButton.LeftButton:
            self._follow(anchor, item.message_id)
            return True
        return bool(anchor) and anchor.startswith(COPY_LINK)  # a press on "Copy code" opens no text editor

    def toggle_thinking(self, message_id: int) -> bool:
        """Open or close a reply's thinking; returns whether it is open now."""
        return self._model.toggle(message_id, "thinking")

    def _follow(self, anchor: str, message_id: int) -> None:
        if anchor.startswith(COPY_LINK):
            number = anchor.removeprefix(COPY_LINK)
            if number.isdigit():
                self.code_copy_requested.emit(message_id, int(number))
        else:
            open_link(anchor)

    # -- the read-only text browser for selecting text --------------------------------------------------
    def createEditor(self, parent: QWidget, option: QStyleOptionViewItem, index: _Index) -> QWidget:  # noqa: N802
        browser = QTextBrowser(parent)
        browser.setObjectName("messageText")
        browser.setFrameShape(QFrame.Shape.NoFrame)
        browser.setReadOnly(True)
        browser.setOpenLinks(False)
        message_id = index.data(ITEM_ROLE).message_id
        browser.anchorClicked.connect(lambda url: self._follow(url.toString(), message_id))
        browser.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        browser.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        browser.document().setDocumentMargin(0)
        browser.document().setDefaultFont(self.geometry.font)
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
            html = item.html(self.geometry.colour_drafts)
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
