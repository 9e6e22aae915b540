"""The conversation pane: a scrolling column of message bubbles.

``set_messages`` shows a stored conversation; ``add_user_message`` and
``start_reply`` append a turn; ``reply_updated`` asks for a repaint of the
streaming reply, which happens at once if the last one was at least
``THROTTLE_MS`` ago and otherwise on a single-shot timer, so a fast stream
costs at most one Markdown render per 50 ms and the window never freezes;
``reply_finished`` repaints at once.  The view stays pinned to the bottom while
content grows unless the user has scrolled up; scrolling back down re-pins it.

Copy puts a message's text on the clipboard; Regenerate and Edit are emitted
as ``regenerate_requested(message_id)`` / ``edit_requested(message_id)``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QApplication, QLabel, QLayout, QScrollArea, QVBoxLayout, QWidget

from app.state.reply import ReplyState, stats_line
from app.views.markdown_render import render_reply, render_user
from app.views.message_widget import MessageWidget
from engine.api import Metrics
from engine.storage import Message

THROTTLE_MS = 50
COLUMN_MAX_PX = 860
MARGIN_PX = 16
PIN_SLACK_PX = 24
TRUNCATED_NOTICE = "Older turns were dropped to fit the model's context."
EMPTY_TEXT = "Ask anything. Replies stream in as they are generated."


class _Page(QWidget):
    """The scrolled page.  Its height is its layout's height for the viewport's width, nothing more: a
    word-wrapped label's minimum height, which Qt measures at a narrow width, must not stretch the page
    (that left hundreds of pixels of blank space under the last message)."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(0, 0)


class ChatView(QScrollArea):
    regenerate_requested = Signal(int)
    edit_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.colour_drafts = True
        self._bubbles: dict[int, MessageWidget] = {}
        self._reply: ReplyState | None = None
        self._last_render = 0.0
        self._pinned = True
        self._busy = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._render_reply)

        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        page = _Page()
        page.setObjectName("chatPanel")
        page.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # a QWidget subclass: paint the style
        # One column straight on the page (no row of stretches around a width-capped widget): then the
        # page's height follows its width exactly (height-for-width), with no blank space under the last
        # message.  The column is centred and capped at COLUMN_MAX_PX by the margins (``resizeEvent``).
        self._column = QVBoxLayout(page)
        self._column.setContentsMargins(MARGIN_PX, MARGIN_PX, MARGIN_PX, MARGIN_PX)
        self._column.setSpacing(12)
        self._column.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self.empty_label = QLabel(EMPTY_TEXT)
        self.empty_label.setObjectName("hint")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._column.addWidget(self.empty_label)
        self._column.addStretch(1)
        self.setWidget(page)

        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        side = max(MARGIN_PX, (self.viewport().width() - COLUMN_MAX_PX) // 2)
        self._column.setContentsMargins(side, MARGIN_PX, side, MARGIN_PX)
        super().resizeEvent(event)

    # -- content ------------------------------------------------------------------
    def clear(self) -> None:
        self._timer.stop()
        self._reply = None
        for bubble in self._bubbles.values():
            bubble.deleteLater()
            self._column.removeWidget(bubble)
        self._bubbles.clear()
        self.empty_label.show()
        self._pinned = True

    def set_messages(self, messages: Sequence[Message], active: ReplyState | None = None) -> None:
        self.clear()
        for message in messages:
            if active is not None and message.id == active.message_id:
                self.start_reply(active)
            elif message.role == "user":
                self.add_user_message(message.id, message.content)
            elif message.role == "assistant":
                self._add_stored_reply(message)
        self.scroll_to_bottom()

    def add_user_message(self, message_id: int, text: str) -> MessageWidget:
        bubble = self._add(MessageWidget("user", message_id))
        bubble.set_content(render_user(text), text)
        return bubble

    def start_reply(self, reply: ReplyState) -> MessageWidget:
        bubble = self._bubbles.get(reply.message_id) or self._add(MessageWidget("assistant", reply.message_id))
        self._reply = reply
        self._pinned = True
        self._render_reply()
        return bubble

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
        elif reply.message_id in self._bubbles:
            self._paint(self._bubbles[reply.message_id], reply)

    def remove_from(self, message_id: int) -> None:
        """Drop the bubbles of ``message_id`` and every later message."""
        for mid in [m for m in self._bubbles if m >= message_id]:
            bubble = self._bubbles.pop(mid)
            self._column.removeWidget(bubble)
            bubble.deleteLater()
        if self._reply is not None and self._reply.message_id >= message_id:
            self._reply = None
        self.empty_label.setVisible(not self._bubbles)

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        for bubble in self._bubbles.values():
            bubble.set_actions_enabled(not busy)

    # -- queries --------------------------------------------------------------------
    def bubble(self, message_id: int) -> MessageWidget | None:
        return self._bubbles.get(message_id)

    def bubbles(self) -> list[MessageWidget]:
        return [self._bubbles[m] for m in sorted(self._bubbles)]

    @property
    def pinned(self) -> bool:
        return self._pinned

    def copy_message(self, message_id: int) -> None:
        bubble = self._bubbles.get(message_id)
        if bubble is not None:
            QApplication.clipboard().setText(bubble.plain_text)

    def scroll_to_message(self, message_id: int) -> None:
        bubble = self._bubbles.get(message_id)
        if bubble is not None:
            self._pinned = False
            self.ensureWidgetVisible(bubble, 0, 40)

    def scroll_to_bottom(self) -> None:
        self._pinned = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    # -- internals --------------------------------------------------------------------
    def _add(self, bubble: MessageWidget) -> MessageWidget:
        self._bubbles[bubble.message_id] = bubble
        self._column.insertWidget(self._column.count() - 1, bubble)
        self.empty_label.hide()
        bubble.set_actions_enabled(not self._busy)
        mid = bubble.message_id
        bubble.copy_clicked.connect(lambda: self.copy_message(mid))
        bubble.regenerate_clicked.connect(lambda: self.regenerate_requested.emit(mid))
        bubble.edit_clicked.connect(lambda: self.edit_requested.emit(mid))
        return bubble

    def _add_stored_reply(self, message: Message) -> None:
        bubble = self._add(MessageWidget("assistant", message.id))
        row = message.metrics if isinstance(message.metrics, Mapping) else {}  # a damaged row: no numbers
        metrics = Metrics.from_dict(row)
        bubble.set_content(render_reply(message.content, colour_drafts=False), message.content)
        finish = str(row.get("finish_reason") or ("cancelled" if message.status == "cancelled" else ""))
        line = stats_line(metrics, finish)
        if message.status == "streaming":
            line = (line + " \u00b7 " if line else "") + "unfinished"
        bubble.set_stats(line)
        bubble.set_notice(TRUNCATED_NOTICE if metrics.truncated or row.get("truncated") else "")
        if message.status == "error":
            bubble.set_error(str(row.get("error") or "This reply ended with an error."))

    def _render_reply(self) -> None:
        reply = self._reply
        if reply is None:
            return
        bubble = self._bubbles.get(reply.message_id)
        if bubble is not None:
            self._paint(bubble, reply)
        self._last_render = time.perf_counter()

    def _paint(self, bubble: MessageWidget, reply: ReplyState) -> None:
        html = render_reply(reply.segments, colour_drafts=self.colour_drafts, streaming=reply.streaming)
        bubble.set_content(html, reply.text)
        bubble.set_stats(reply.status_line())
        bubble.set_notice(TRUNCATED_NOTICE if reply.truncated else "")
        bubble.set_error(reply.error)

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._pinned = value >= bar.maximum() - PIN_SLACK_PX

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._pinned:
            self.verticalScrollBar().setValue(maximum)
