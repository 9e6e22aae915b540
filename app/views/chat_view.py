"""The conversation pane: a list view over :class:`~app.views.chat_model.ChatModel`,
painted by :class:`~app.views.chat_delegate.MessageDelegate`.

No widget per message: a conversation of any length is one model row per
message and only the visible rows are laid out and painted, so 10,000
messages open as fast as the store reads them (``python -m app.bench_chat_view``).

``set_messages`` shows a stored conversation; ``add_user_message`` and
``start_reply`` append a turn; ``reply_updated`` asks for a repaint of the
streaming reply, which happens at once if the last one was at least
``THROTTLE_MS`` ago and otherwise on a single-shot timer, so a fast stream
costs at most one Markdown render per 50 ms; ``reply_finished`` repaints at
once.  The view stays pinned to the bottom while content grows unless the user
has scrolled up; scrolling back down re-pins it.  The list ends at the last
message: there is never blank space under it.

Actions on a message (drawn in its header, also in its context menu): Copy
puts its text on the clipboard; the context menu's "Branch from here" emits
``branch_requested(message_id)``; Regenerate, Edit and Compare\u2026 are emitted as
``regenerate_requested(message_id)``, ``edit_requested(message_id)`` and
``compare_requested(message_id)``; a reply with several versions shows
"\u2039 2/3 \u203a", whose arrows emit ``version_requested(message_id, number)``
(the caller shows that version with :meth:`ChatView.replace_message`;
:meth:`ChatView.start_reply` takes a regenerated reply's ``version``)
(Compare\u2026 shows on user messages once
:meth:`ChatView.set_compare_available` turned it on).  Double-click or
"Select text" opens a read-only text browser over one message to select and
copy part of it.  A reply's tooltip is set with :meth:`ChatView.set_reply_tooltip`
or computed on hover by ``tooltip_provider(message_id)``.

:meth:`ChatView.bubble` / :meth:`ChatView.bubbles` return read-only
:class:`~app.views.message_handle.MessageHandle` s of the rows as the user sees
them.  :meth:`ChatView.toggle_tools` opens or closes a reply's tool results
(also a click on the section's header).  A reply's sources (the documents it
drew on, listed under it) emit ``source_requested(message_id, n)`` when one is
clicked (:meth:`ChatView.source_rect` says where source ``n`` is drawn).
What is under the mouse (hover, cursor, tooltips, the context menu) is
:class:`~app.views.chat_pointer.ChatPointer`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QModelIndex, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QContextMenuEvent, QFont, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemDelegate,
    QAbstractItemView,
    QApplication,
    QFrame,
    QListView,
    QMenu,
    QTextBrowser,
    QWidget,
)

from app.state.reply import ReplyState
from app.views.chat_delegate import MessageDelegate
from app.views.chat_model import TRUNCATED_NOTICE, ChatItem, ChatModel, item_from_message
from app.views.chat_pointer import ChatPointer
from app.views.markdown_render import code_blocks
from app.views.message_geometry import MARGIN_PX, RowLayout, source_index
from app.views.message_handle import MessageHandle
from app.views.style import current
from engine.storage import Message

__all__ = ["EMPTY_TEXT", "THROTTLE_MS", "TRUNCATED_NOTICE", "ChatView", "MessageHandle"]

THROTTLE_MS = 50
PIN_SLACK_PX = 24
EMPTY_TEXT = "Ask anything. Replies stream in as they are generated."
BRANCH_TIPS = {  # by whether the message is the user's
    False: "A new chat with the conversation up to this reply; it starts from this chat's cached prompt",
    True: "A new chat with the conversation before this message, and this message in the composer to edit",
}


class ChatView(QListView):
    regenerate_requested = Signal(int)
    edit_requested = Signal(int)
    compare_requested = Signal(int)
    version_requested = Signal(int, int)  # message id, the version to show
    branch_requested = Signal(int)  # "Branch from here" on a message
    copied = Signal(int, int)  # message id, characters put on the clipboard
    source_requested = Signal(int, int)  # message id, the source's place in the reply's list

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chat_model = ChatModel(self)
        self.delegate = MessageDelegate(self, self.chat_model)
        # hover, cursor, tooltips and the context menu
        self._pointer = ChatPointer(self, self.chat_model, self.delegate, self.tooltip_for, self.select_text)
        self.setModel(self.chat_model)
        self.setItemDelegate(self.delegate)
        self.tooltip_provider: Callable[[int], str] | None = None
        self._reply: ReplyState | None = None
        self._last_render = 0.0
        self._pinned = True
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._render_reply)

        self.setObjectName("chatView")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.verticalScrollBar().setSingleStep(24)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setUniformItemSizes(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked)
        self.setMouseTracking(True)
        self.setAutoFillBackground(True)
        self.delegate.action_triggered.connect(self._on_action)
        self.delegate.code_copy_requested.connect(self.copy_code)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    # -- settings ----------------------------------------------------------------------------------
    @property
    def colour_drafts(self) -> bool:
        return self.delegate.colour_drafts

    @colour_drafts.setter
    def colour_drafts(self, on: bool) -> None:
        if on != self.delegate.colour_drafts:
            self.delegate.colour_drafts = on
            self.chat_model.touch_all()

    def set_busy(self, busy: bool) -> None:
        """While the chat's reply streams, Regenerate, Edit, Compare and the version arrows are greyed out."""
        self.delegate.busy = busy
        self.viewport().update()

    def set_compare_available(self, available: bool) -> None:
        """Show "Compare\u2026" on user messages (for the latency panel, which handles ``compare_requested``)."""
        self.delegate.compare_available = available
        self.viewport().update()

    def set_reply_tooltip(self, message_id: int, text: str) -> None:
        """The tooltip of one message (e.g. the configuration a reply ran with); "" removes it."""
        item = self.chat_model.item(message_id)
        if item is not None:
            item.tooltip = text

    def tooltip_for(self, message_id: int) -> str:
        item = self.chat_model.item(message_id)
        if item is None:
            return ""
        if item.tooltip or self.tooltip_provider is None:
            return item.tooltip
        return self.tooltip_provider(message_id)

    # -- content ------------------------------------------------------------------------------------
    def clear(self) -> None:
        self._timer.stop()
        self._reply = None
        self.chat_model.reset([])
        self._pinned = True

    def set_messages(self, messages: Sequence[Message], active: ReplyState | None = None) -> None:
        self._timer.stop()
        self._reply = None
        items: list[ChatItem] = []
        for message in messages:
            if active is not None and message.id == active.message_id:
                item = self._reply_item(active)
                item.version, item.versions = message.version, message.versions
                items.append(item)
                self._reply = active
            elif message.role in ("user", "assistant") or message.damaged:
                items.append(item_from_message(message))
        self.chat_model.reset(items)
        self._pinned = True
        self._measure_tail()
        self.scroll_to_bottom()

    def add_user_message(self, message_id: int, text: str) -> MessageHandle:
        item = ChatItem(message_id, "user", text)
        self.chat_model.append(item)
        return MessageHandle(self, item)

    def start_reply(self, reply: ReplyState, version: tuple[int, int] | None = None) -> MessageHandle:
        """Show a reply that starts streaming: a new row, or (a regenerated reply, ``version`` its number and
        how many versions there are now) its message's row, emptied."""
        item = self.chat_model.item(reply.message_id)
        if item is None:
            item = self._reply_item(reply)
            self.chat_model.append(item)
        elif version is not None:  # the same message, a new version: nothing of the old one stays
            item = self._reply_item(reply)
            self.chat_model.replace(item)
        if version is not None:
            item.version, item.versions = version
        item.reply = reply
        self._reply = reply
        self._pinned = True
        self._render_reply()
        return MessageHandle(self, item)

    def reply_updated(self, reply: ReplyState) -> None:
        if reply is not self._reply or self._timer.isActive():
            return
        waited_ms = (time.perf_counter() - self._last_render) * 1000
        if waited_ms >= THROTTLE_MS:
            self._render_reply()
        else:
            self._timer.start(int(THROTTLE_MS - waited_ms) + 1)

    def reply_finished(self, reply: ReplyState) -> None:
        """Final repaint of a reply (also for a stopped reply whose metrics came late)."""
        if reply is self._reply:
            self._timer.stop()
            self._render_reply()
            self._reply = None
            return
        item = self.chat_model.item(reply.message_id)
        if item is not None:
            item.reply = reply
            item.refresh_from_reply()
            self.chat_model.touch(reply.message_id)

    def replace_message(self, message: Message) -> MessageHandle | None:
        """Show ``message`` as stored now in place of its row (another version of a reply)."""
        if self.chat_model.item(message.id) is None:
            return None
        if self._reply is not None and self._reply.message_id == message.id:
            self._timer.stop()
            self._reply = None
        item = item_from_message(message)
        self.chat_model.replace(item)
        return MessageHandle(self, item)

    def remove_from(self, message_id: int) -> None:
        """Drop the rows of ``message_id`` and every later message."""
        self.chat_model.remove_from(message_id)
        if self._reply is not None and self._reply.message_id >= message_id:
            self._timer.stop()
            self._reply = None

    # -- queries ------------------------------------------------------------------------------------
    def bubble(self, message_id: int) -> MessageHandle | None:
        item = self.chat_model.item(message_id)
        return None if item is None else MessageHandle(self, item)

    def bubbles(self) -> list[MessageHandle]:
        return [MessageHandle(self, item) for item in self.chat_model.items()]

    @property
    def pinned(self) -> bool:
        return self._pinned

    def index_of(self, message_id: int) -> QModelIndex:
        row = self.chat_model.row_of(message_id)
        return QModelIndex() if row is None else self.chat_model.index(row)

    def row_layout(self, message_id: int) -> RowLayout | None:
        """Where the parts of a message are now, in viewport coordinates (None: not in the view)."""
        index = self.index_of(message_id)
        if not index.isValid():
            return None
        self.executeDelayedItemsLayout()
        top = self.visualRect(index).top()
        item = self.chat_model.item_at(index.row())
        return self.delegate.row_layout(item, top, index.row() == 0)

    def action_rect(self, message_id: int, action: str) -> QRect:
        """Where an action of a message is drawn (an empty rect if that message has no such action)."""
        box = self.row_layout(message_id)
        return next((rect for name, rect in box.actions if name == action), QRect()) if box else QRect()

    def source_rect(self, message_id: int, n: int) -> QRect:
        """Where source ``n`` of a reply is drawn (an empty rect if it has none such)."""
        box = self.row_layout(message_id)
        return next((rect for place, rect in box.sources if place == n), QRect()) if box else QRect()

    def copy_message(self, message_id: int) -> None:
        """Put the message's text on the clipboard and say so (``copied``: the message id, its characters)."""
        item = self.chat_model.item(message_id)
        if item is not None:
            QApplication.clipboard().setText(item.text)
            self.copied.emit(message_id, len(item.text))

    def copy_code(self, message_id: int, number: int) -> None:
        """Put code block ``number`` of a message on the clipboard, as written, and say so (``copied``)."""
        item = self.chat_model.item(message_id)
        blocks = code_blocks(item.text) if item is not None else []
        if 0 <= number < len(blocks):
            QApplication.clipboard().setText(blocks[number])
            self.copied.emit(message_id, len(blocks[number]))

    def select_text(self, message_id: int) -> QTextBrowser | None:
        """Open the read-only text browser over one message (closing one open elsewhere); returns it."""
        index = self.index_of(message_id)
        if not index.isValid():
            return None
        shown = self.delegate.editor
        if shown is not None and self.state() == QAbstractItemView.State.EditingState:
            self.closeEditor(shown, QAbstractItemDelegate.EndEditHint.NoHint)
        self.scrollTo(index, QAbstractItemView.ScrollHint.EnsureVisible)
        self.edit(index)
        return self.delegate.editor

    def scroll_to_message(self, message_id: int) -> None:
        index = self.index_of(message_id)
        if index.isValid():
            self._pinned = False
            self._measure_rows(max(0, index.row() - 2), index.row() + 8)
            self.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtTop)

    def scroll_to_bottom(self) -> None:
        self._pinned = True
        self.executeDelayedItemsLayout()
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def context_menu(self, message_id: int) -> QMenu:
        """The menu a right-click on a message opens: its actions, "Branch from here", and Select text."""
        menu = self._pointer.context_menu(message_id)
        item = self.chat_model.item(message_id)
        if item is None:
            return menu
        branch = QAction("Branch from here", menu)
        branch.setToolTip(BRANCH_TIPS[item.role == "user"])
        branch.setEnabled(not item.streaming)  # a reply still streaming has no end to branch after yet
        branch.triggered.connect(lambda: self.branch_requested.emit(message_id))
        separators = [action for action in menu.actions() if action.isSeparator()]
        if separators:  # after the message's actions, before Select text
            menu.insertAction(separators[-1], branch)
        else:
            menu.addAction(branch)
        return menu

    # -- internals ------------------------------------------------------------------------------------
    def _reply_item(self, reply: ReplyState) -> ChatItem:
        item = ChatItem(reply.message_id, "assistant", reply=reply)
        item.refresh_from_reply()
        return item

    def _on_action(self, action: str, message_id: int) -> None:
        if action == "copy":
            self.copy_message(message_id)
        elif action == "regenerate":
            self.regenerate_requested.emit(message_id)
        elif action == "edit":
            self.edit_requested.emit(message_id)
        elif action == "compare":
            self.compare_requested.emit(message_id)
        elif action in ("older", "newer"):
            item = self.chat_model.item(message_id)
            if item is not None:
                self.version_requested.emit(message_id, item.version + (1 if action == "newer" else -1))
        elif action == "tools":
            self.toggle_tools(message_id)
        elif (n := source_index(action)) is not None:
            self.source_requested.emit(message_id, n)

    def toggle_tools(self, message_id: int) -> bool:
        """Open or close a reply's tool results; returns whether they are open now."""
        return self.chat_model.toggle(message_id, "tools")

    def _render_reply(self) -> None:
        reply = self._reply
        if reply is None:
            return
        item = self.chat_model.item(reply.message_id)
        if item is not None:
            item.reply = reply
            item.refresh_from_reply()
            self.chat_model.touch(reply.message_id)
        self._last_render = time.perf_counter()

    def _measure_rows(self, start: int, stop: int) -> None:
        geometry = self.delegate.geometry
        inner = geometry.content_width(self.delegate.layout_width())
        for row in range(max(0, start), min(stop, self.chat_model.rowCount())):
            geometry.content_height(self.chat_model.item_at(row), inner, exact=True)

    def _measure_tail(self) -> None:
        """Lay out exactly the last rows that fill the viewport, so a reopened chat shows its end at once."""
        if not self.isVisible():
            return  # the width is not known yet: painting measures what it shows
        geometry = self.delegate.geometry
        inner = geometry.content_width(self.delegate.layout_width())
        need, row = self.viewport().height() * 2, self.chat_model.rowCount() - 1
        while need > 0 and row >= 0:
            item = self.chat_model.item_at(row)
            need -= geometry.content_height(item, inner, exact=True)
            row -= 1

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._pinned = value >= bar.maximum() - PIN_SLACK_PX

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._pinned:
            self.verticalScrollBar().setValue(maximum)

    # -- Qt events -------------------------------------------------------------------------------------
    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        self.delegate.view_resized()
        super().resizeEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt override)
        if self.chat_model.rowCount():
            super().paintEvent(event)
            return
        painter = QPainter(self.viewport())
        font = QFont(self.font())
        font.setPixelSize(11)
        painter.setFont(font)
        painter.setPen(QColor(current().muted))
        rect = self.viewport().rect().adjusted(MARGIN_PX, MARGIN_PX, -MARGIN_PX, -MARGIN_PX)
        painter.drawText(rect, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop, EMPTY_TEXT)

    def viewportEvent(self, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if self._pointer.viewport_event(event):
            return True
        return super().viewportEvent(event)

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:  # noqa: N802 (Qt override)
        index = self.indexAt(event.pos())
        if not index.isValid():
            return
        self.context_menu(self.chat_model.item_at(index.row()).message_id).exec(event.globalPos())
