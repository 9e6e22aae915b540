"""The sidebar's list of conversations as a Qt item model, most recent first.

:class:`ConversationListModel` holds plain ``Conversation`` records and is
changed only through begin/end calls (reset, insert, move, remove) and
``dataChanged``, so views keep their selection and scroll position.  Editing a
title in a view does not change the model: it emits
``title_edited(conversation_id, title)`` and the owner, after the store
accepted the rename, calls :meth:`upsert`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal

from engine.storage import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole
Index = QModelIndex | QPersistentModelIndex


class ConversationListModel(QAbstractListModel):
    title_edited = Signal(str, str)

    def __init__(self) -> None:
        super().__init__()
        self._items: list[Conversation] = []

    # -- Qt model API ---------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        item = self._items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return item.title
        if role == Qt.ItemDataRole.ToolTipRole:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(item.updated))
            return f"{item.title}\nLast active {when}"
        if role == ID_ROLE:
            return item.id
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        base = super().flags(index)
        return base | Qt.ItemFlag.ItemIsEditable if index.isValid() else base

    def setData(self, index: Index, value: object, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if role != Qt.ItemDataRole.EditRole or not index.isValid():
            return False
        title = " ".join(str(value).split())
        item = self._items[index.row()]
        if not title or title == item.title:
            return False
        self.title_edited.emit(item.id, title)
        return True

    # -- changes from the owner ---------------------------------------------------------
    def set_conversations(self, conversations: Sequence[Conversation]) -> None:
        self.beginResetModel()
        self._items = list(conversations)
        self.endResetModel()

    def upsert(self, conversation: Conversation, to_top: bool = False) -> None:
        """Add or refresh ``conversation``; new ones and ``to_top`` ones go to row 0."""
        row = self.row_of(conversation.id)
        if row is None:
            self.beginInsertRows(QModelIndex(), 0, 0)
            self._items.insert(0, conversation)
            self.endInsertRows()
            return
        self._items[row] = conversation
        self.dataChanged.emit(self.index(row), self.index(row))
        if to_top and row > 0:
            self.beginMoveRows(QModelIndex(), row, row, QModelIndex(), 0)
            self._items.insert(0, self._items.pop(row))
            self.endMoveRows()

    def remove(self, conversation_id: str) -> None:
        row = self.row_of(conversation_id)
        if row is None:
            return
        self.beginRemoveRows(QModelIndex(), row, row)
        del self._items[row]
        self.endRemoveRows()

    # -- queries ----------------------------------------------------------------------
    def row_of(self, conversation_id: str) -> int | None:
        for row, item in enumerate(self._items):
            if item.id == conversation_id:
                return row
        return None

    def conversation_at(self, row: int) -> Conversation:
        return self._items[row]

    def ids(self) -> list[str]:
        return [item.id for item in self._items]

    def titles(self) -> list[str]:
        return [item.title for item in self._items]
