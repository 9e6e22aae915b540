"""Paints one chat message into the rectangles its :class:`~app.views.message_geometry.RowLayout` gives.

:func:`paint_row` draws, in order: the bubble (tinted for the user, outlined
for a reply), the role name (elided, never an action), the action buttons
(the one under the mouse highlighted; those :func:`~app.views.message_geometry.action_enabled`
refuses greyed out: ``BUSY_BLOCKED`` while the chat's reply streams, an arrow
past the first or last version; the version label "2/3" in the muted colour),
the notice (warning colour), the answer-cache badge (accent colour), a
thinking model's thinking line (highlighted under the mouse) and, when open, its
text (muted), the tool section (header line, highlighted under the mouse, and one line per
call), the content (its laid-out ``QTextDocument``, clipped to its
rectangle), the sources (each label a link, highlighted under the
mouse), the error and the stats line.  It reads the fonts and the
documents from a :class:`~app.views.message_geometry.MessageGeometry` and
changes nothing but the painter, whose state it restores.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QAbstractTextDocumentLayout, QColor, QPainter, QPalette, QPen

from app.views.chat_model import ChatItem
from app.views.message_geometry import (
    LABELS,
    SOURCE,
    SOURCE_GAP,
    MessageGeometry,
    RowLayout,
    action_enabled,
    action_text,
    thinking_title,
)
from app.views.style import current

ROLE_NAMES = {"user": "You", "assistant": "Brisk"}

Hover = tuple[int, str] | None  # (message id, action) under the mouse


def paint_row(
    painter: QPainter,
    geometry: MessageGeometry,
    item: ChatItem,
    box: RowLayout,
    *,
    hover: Hover,
    busy: bool,
    palette: QPalette,
) -> None:
    """Draw ``item`` laid out as ``box``; ``palette`` is the view's (the content's text colour is set here)."""
    theme = current()  # the colours of the theme in use, read at each paint
    painter.save()
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    bubble = box.bubble.adjusted(0, 0, -1, -1)
    if item.role == "user":
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(theme.user_bubble))
    else:
        painter.setPen(QPen(QColor(theme.bubble_border), 1))
        painter.setBrush(QColor(theme.window))
    painter.drawRoundedRect(QRect(bubble).translated(0, 0), 12, 12)
    painter.setFont(geometry.bold)
    painter.setPen(QColor(theme.muted))
    align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    name = geometry.bold_fm.elidedText(
        ROLE_NAMES.get(item.role, item.role.title()), Qt.TextElideMode.ElideRight, box.role.width()
    )
    painter.drawText(box.role, align, name)
    _paint_actions(painter, geometry, item, box, hover, busy)
    wrap = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap
    if box.notice is not None:
        painter.setFont(geometry.small)
        painter.setPen(QColor(theme.warning))
        painter.drawText(box.notice, wrap, item.notice)
    if box.badge is not None:
        painter.setFont(geometry.small)
        painter.setPen(QColor(theme.badge))
        painter.drawText(box.badge, wrap, item.badge)
    if box.thinking_header is not None:
        _paint_thinking(painter, geometry, item, box, wrap, hover)
    if box.tools_header is not None and box.tools is not None:
        _paint_tools(painter, geometry, item, box.tools_header, box.tools, wrap, hover)
    _paint_content(painter, geometry, item, box.content, palette)
    if box.sources_prefix is not None:
        _paint_sources(painter, geometry, item, box, hover)
    if box.error is not None:
        painter.setFont(geometry.font)
        painter.setPen(QColor(theme.error))
        painter.drawText(box.error, wrap, item.error)
    if box.stats is not None:
        painter.setFont(geometry.small)
        painter.setPen(QColor(theme.muted))
        painter.drawText(box.stats, wrap, item.stats)
    painter.restore()


def _paint_actions(
    painter: QPainter, geometry: MessageGeometry, item: ChatItem, box: RowLayout, hover: Hover, busy: bool
) -> None:
    theme = current()
    painter.setFont(geometry.font)
    for name, rect in box.actions:
        enabled = name in LABELS or action_enabled(item, name, busy)
        hovered = enabled and name not in LABELS and hover == (item.message_id, name)
        if hovered:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(theme.hover))
            painter.drawRoundedRect(rect, 6, 6)
        painter.setPen(QColor(theme.text if hovered else theme.muted if enabled else theme.disabled))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, action_text(item, name))


def _paint_tools(
    painter: QPainter,
    geometry: MessageGeometry,
    item: ChatItem,
    header: QRect,
    body: QRect,
    wrap: Qt.AlignmentFlag,
    hover: Hover,
) -> None:
    theme = current()
    painter.setFont(geometry.small)
    if hover == (item.message_id, "tools"):
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(theme.hover))
        painter.drawRoundedRect(header, 4, 4)
    painter.setPen(QColor(theme.tools_fg))
    painter.drawText(
        header.adjusted(2, 0, 0, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, item.tools_header
    )
    painter.setPen(QColor(theme.muted))
    painter.drawText(body, wrap, item.tools_text)


def _paint_thinking(
    painter: QPainter, geometry: MessageGeometry, item: ChatItem, box: RowLayout, wrap: Qt.AlignmentFlag, hover: Hover
) -> None:
    theme = current()
    header = box.thinking_header
    assert header is not None
    painter.setFont(geometry.small)
    if hover == (item.message_id, "thinking"):
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(theme.hover))
        painter.drawRoundedRect(header, 4, 4)
    painter.setPen(QColor(theme.muted))
    middle = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    title = geometry.small_fm.elidedText(thinking_title(item), Qt.TextElideMode.ElideRight, header.width() - 2)
    painter.drawText(header.adjusted(2, 0, 0, 0), middle, title)
    if box.thinking is not None:
        painter.drawText(box.thinking, wrap, item.thinking)


def _paint_sources(painter: QPainter, geometry: MessageGeometry, item: ChatItem, box: RowLayout, hover: Hover) -> None:
    theme = current()
    painter.setFont(geometry.small)
    middle = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    if box.sources_prefix is not None:
        painter.setPen(QColor(theme.muted))
        painter.drawText(box.sources_prefix, middle, item.sources_prefix)
    labels = item.source_labels
    for place, (n, rect) in enumerate(box.sources):
        if hover == (item.message_id, f"{SOURCE}{n}"):
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(theme.hover))
            painter.drawRoundedRect(rect, 4, 4)
        painter.setPen(QColor(theme.badge))
        text = geometry.small_fm.elidedText(labels[n], Qt.TextElideMode.ElideMiddle, rect.width() - 2)
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)
        following = box.sources[place + 1][1] if place + 1 < len(box.sources) else None
        if following is not None and following.top() == rect.top():
            painter.setPen(QColor(theme.muted))
            gap = rect.adjusted(rect.width(), 0, 0, 0)
            gap.setRight(following.left() - 1)
            painter.drawText(gap, Qt.AlignmentFlag.AlignCenter, SOURCE_GAP)


def _paint_content(
    painter: QPainter, geometry: MessageGeometry, item: ChatItem, rect: QRect, view_palette: QPalette
) -> None:
    doc = geometry.document(item, rect.width())
    painter.save()
    painter.translate(rect.topLeft())
    context = QAbstractTextDocumentLayout.PaintContext()
    palette = QPalette(view_palette)
    palette.setColor(QPalette.ColorRole.Text, QColor(current().text))
    context.palette = palette
    context.clip = QRect(0, 0, rect.width(), rect.height())
    painter.setClipRect(context.clip)
    doc.documentLayout().draw(painter, context)
    painter.restore()
