"""What is under the mouse in the chat view: the hovered action, the pointer's shape, tooltips, the context menu.

:class:`ChatPointer` is handed the chat view's viewport events
(``ChatView.viewportEvent``).  A mouse move finds the row and the part of it
under the pointer (with the delegate's exact :class:`RowLayout`): over an
action button or the tool section's header that action is the delegate's
``hover`` (painted highlighted) and the pointer is a hand (not over the
version label, which is text); over a link in the
content the pointer is a hand too.  Leaving the view clears the hover.  A
tooltip event shows the action's tip over an action, else the message's own
tooltip (the view's ``tooltip_for``), else none.

:meth:`ChatPointer.context_menu` builds a message's right-click menu: its
actions (greyed out as the buttons are; the version arrows as "Previous
version" and "Next version"), which trigger
exactly as a click on the button does (the delegate's ``action_triggered``),
then "Show thinking"/"Hide thinking" for a reply that thought, then the reply's sources (each opens its
passage), then "Select text".  Apart
from that menu this changes only the hover, the cursor and the tooltip; clicks
are the delegate's.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QHelpEvent, QMouseEvent
from PySide6.QtWidgets import QListView, QMenu, QToolTip

from app.views.chat_delegate import MessageDelegate
from app.views.chat_model import ChatItem, ChatModel
from app.views.message_geometry import (
    LABELS,
    MENU_TEXT,
    SOURCE,
    RowLayout,
    action_enabled,
    action_text,
    action_tip,
)


class ChatPointer:
    """Hover, cursor, tooltips and the context menu for one chat view (``view``, showing ``model``
    through ``delegate``); ``tooltip_for`` and ``select_text`` are the view's."""

    def __init__(
        self,
        view: QListView,
        model: ChatModel,
        delegate: MessageDelegate,
        tooltip_for: Callable[[int], str],
        select_text: Callable[[int], object],
    ) -> None:
        self._view, self._model, self._delegate = view, model, delegate
        self._tooltip_for, self._select_text = tooltip_for, select_text

    def viewport_event(self, event: QEvent) -> bool:
        """Follow the pointer for one viewport event; True when the event is consumed (a tooltip)."""
        kind = event.type()
        if kind == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            self._show_tooltip(event)
            return True
        if kind == QEvent.Type.MouseMove and isinstance(event, QMouseEvent):
            self._track_hover(event.position().toPoint())
        elif kind == QEvent.Type.Leave:
            self._set_hover(None)
        return False

    def _hit(self, pos: QPoint) -> tuple[ChatItem, RowLayout] | None:
        view = self._view
        index = view.indexAt(pos)
        if not index.isValid():
            return None
        item = self._model.item_at(index.row())
        top = view.visualRect(index).top()
        return item, self._delegate.row_layout(item, top, index.row() == 0)

    def _track_hover(self, pos: QPoint) -> None:
        hit = self._hit(pos)
        hover, pointing = None, False
        if hit is not None:
            item, box = hit
            action = box.action_at(pos.x(), pos.y())
            if action is not None and action not in LABELS:
                hover, pointing = (item.message_id, action), True
            else:
                pointing = bool(self._delegate.anchor_at(item, box, pos.x(), pos.y()))
        self._set_hover(hover)
        cursor = Qt.CursorShape.PointingHandCursor if pointing else Qt.CursorShape.ArrowCursor
        self._view.viewport().setCursor(cursor)

    def _set_hover(self, hover: tuple[int, str] | None) -> None:
        delegate = self._delegate
        if hover != delegate.hover:
            delegate.hover = hover
            self._view.viewport().update()

    def _show_tooltip(self, event: QHelpEvent) -> None:
        hit = self._hit(event.pos())
        text = ""
        if hit is not None:
            item, box = hit
            action = box.action_at(event.pos().x(), event.pos().y())
            text = action_tip(item, action) if action is not None else self._tooltip_for(item.message_id)
        if text:
            QToolTip.showText(event.globalPos(), text, self._view.viewport())
        else:
            QToolTip.hideText()
            event.ignore()

    def context_menu(self, message_id: int) -> QMenu:
        """The menu a right-click on a message opens: its actions, and Select text."""
        menu = QMenu(self._view)
        item = self._model.item(message_id)
        if item is None:
            return menu
        delegate = self._delegate
        for name in delegate.geometry.actions(item):
            if name in LABELS:
                continue
            action = menu.addAction(MENU_TEXT.get(name) or action_text(item, name))
            action.setToolTip(action_tip(item, name))
            action.setEnabled(action_enabled(item, name, delegate.busy))
            action.triggered.connect(lambda _=False, n=name: delegate.action_triggered.emit(n, message_id))
        if item.thinking_header:  # the thinking line, for the keyboard too
            words = "Hide thinking" if item.thinking_open else "Show thinking"
            menu.addAction(words).triggered.connect(lambda: delegate.toggle_thinking(message_id))
        for n in range(len(item.sources)):  # the sources, for the keyboard too
            source = menu.addAction(item.source_menu_text(n))
            source.setToolTip(action_tip(item, f"{SOURCE}{n}"))
            source.triggered.connect(lambda _=False, a=f"{SOURCE}{n}": delegate.action_triggered.emit(a, message_id))
        menu.addSeparator()
        menu.addAction("Select text").triggered.connect(lambda: self._select_text(message_id))
        return menu
