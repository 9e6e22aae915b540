"""The sidebar's list of conversations as a Qt item model: projects, most recent first, branches under their parent.

:class:`ConversationListModel` holds plain ``Conversation`` records in the
order of their last activity (``set_conversations`` takes them most recent
first, as the store lists them; ``upsert(..., to_top=True)`` makes one the most
recent).  It shows them nested (:func:`nested`): each chat of its own, then its
branches (``Conversation.parent_id``) under it, most recent first (a family
as recent as its most recent member), each level indented one step
(``DEPTH_ROLE``; a branch's title reads "↳ title").  A branch whose parent
is not in the list (deleted: the store made it a chat of its own) is shown
at the top level.

Projects (``set_projects``) come first, by name, each a header row
(``KIND_ROLE`` is ``PROJECT``, ``ID_ROLE`` its id) with its chats under it
(``Conversation.project_id``), nested as above one level in (``LEVEL_ROLE``:
how far a row is indented; ``DEPTH_ROLE`` stays the branch depth); then the
chats in no project (or in one not listed).  :meth:`row_of` finds chats only,
:meth:`project_row` project headers.

The model is changed only through begin/end calls (insert, move, remove, and a
layout change where rows move in ways one move cannot say) and ``dataChanged``,
so views keep their selection and scroll position.  Editing a title in a view
does not change the model: it emits ``title_edited(conversation_id, title)``
and the owner, after the store accepted the rename, calls :meth:`upsert`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QFont

from engine.storage import Conversation, Project

ID_ROLE = Qt.ItemDataRole.UserRole
DEPTH_ROLE = Qt.ItemDataRole.UserRole + 1  # how many branch steps below a chat of its own (0: one of those)
KIND_ROLE = Qt.ItemDataRole.UserRole + 2  # CHAT or PROJECT
LEVEL_ROLE = Qt.ItemDataRole.UserRole + 3  # how many steps the row is indented (a project's chats: one more)
CHAT, PROJECT = "chat", "project"
BRANCH_MARK = "\u21b3 "  # before a branch's title
PROJECT_MARK = "\u25a4 "  # before a project's name
Index = QModelIndex | QPersistentModelIndex
Row = tuple[Conversation, int]  # a conversation and its depth
Shown = tuple[Conversation | Project, int, int]  # a row as shown: chat or project, branch depth, indent level


def grouped(projects: Sequence[Project], conversations: Sequence[Conversation]) -> list[Shown]:
    """The rows as shown: each project (in the order given) and its chats nested under it, then the chats in
    no listed project, nested (:func:`nested`)."""
    known = {p.id for p in projects}
    rows: list[Shown] = []
    for project in projects:
        rows.append((project, 0, 0))
        inside = [c for c in conversations if c.project_id == project.id]
        rows.extend((c, depth, depth + 1) for c, depth in nested(inside))
    loose = [c for c in conversations if c.project_id not in known]
    rows.extend((c, depth, depth) for c, depth in nested(loose))
    return rows


def nested(conversations: Sequence[Conversation]) -> list[Row]:
    """``conversations`` (most recent first) in display order with their depth: each chat whose parent is not
    among them, followed by its branches, theirs under them.  A family is as recent as its most recent member
    (a reply in a branch brings its parent's rows up with it); each level is most recent first."""
    present = {c.id for c in conversations}
    rank = {c.id: n for n, c in enumerate(conversations)}
    children: dict[str, list[Conversation]] = {}
    roots: list[Conversation] = []
    for c in conversations:
        if c.parent_id is not None and c.parent_id in present and c.parent_id != c.id:
            children.setdefault(c.parent_id, []).append(c)
        else:
            roots.append(c)
    newest: dict[str, int] = {}

    def recency(c: Conversation, path: frozenset[str] = frozenset()) -> int:
        if c.id not in newest:
            below = [recency(k, path | {c.id}) for k in children.get(c.id, []) if k.id not in path]
            newest[c.id] = min([rank[c.id], *below])
        return newest[c.id]

    rows: list[Row] = []
    seen: set[str] = set()

    def walk(c: Conversation, depth: int) -> None:
        seen.add(c.id)
        rows.append((c, depth))
        for child in sorted(children.get(c.id, []), key=recency):
            if child.id not in seen:
                walk(child, depth + 1)

    for c in sorted(roots, key=recency):
        walk(c, 0)
    for c in conversations:  # parents in a loop (a damaged file): shown at the top level rather than lost
        if c.id not in seen:
            walk(c, 0)
    return rows


class ConversationListModel(QAbstractListModel):
    title_edited = Signal(str, str)

    def __init__(self) -> None:
        super().__init__()
        self._order: list[Conversation] = []  # most recent first
        self._projects: list[Project] = []  # by name
        self._items: list[Shown] = []  # as shown

    # -- Qt model API ---------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        item, depth, level = self._items[index.row()]
        if isinstance(item, Project):
            return self._project_data(item, role)
        if role == LEVEL_ROLE:
            return level
        if role == KIND_ROLE:
            return CHAT
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{BRANCH_MARK}{item.title}" if depth else item.title
        if role == Qt.ItemDataRole.EditRole:
            return item.title
        if role == Qt.ItemDataRole.ToolTipRole:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(item.updated))
            parent = self._parent_title(item)
            branch = f"\nBranch of \u201c{parent}\u201d" if parent is not None else ""
            return f"{item.title}{branch}\nLast active {when}"
        if role == ID_ROLE:
            return item.id
        if role == DEPTH_ROLE:
            return depth
        return None

    def _project_data(self, project: Project, role: int) -> object:
        chats = sum(1 for c in self._order if c.project_id == project.id)
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{PROJECT_MARK}{project.name}"
        if role == Qt.ItemDataRole.ToolTipRole:
            prompt = project.system_prompt.strip()
            cut = prompt[:120] + ("\u2026" if len(prompt) > 120 else "")
            said = f"\nSystem prompt: {cut}" if prompt else ""
            docs = f"\n{len(project.documents)} document(s)" if project.documents else ""
            return f"Project \u201c{project.name}\u201d: {chats} chat{'s' if chats != 1 else ''}{said}{docs}"
        if role == Qt.ItemDataRole.FontRole:
            font = QFont()
            font.setBold(True)
            return font
        if role == ID_ROLE:
            return project.id
        if role == KIND_ROLE:
            return PROJECT
        if role in (DEPTH_ROLE, LEVEL_ROLE):
            return 0
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        base = super().flags(index)
        if not index.isValid() or isinstance(self._items[index.row()][0], Project):
            return base
        return base | Qt.ItemFlag.ItemIsEditable

    def setData(self, index: Index, value: object, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if role != Qt.ItemDataRole.EditRole or not index.isValid():
            return False
        title = " ".join(str(value).split())
        item = self._items[index.row()][0]
        if isinstance(item, Project) or not title or title == item.title:
            return False
        self.title_edited.emit(item.id, title)
        return True

    # -- changes from the owner ---------------------------------------------------------
    def set_conversations(self, conversations: Sequence[Conversation]) -> None:
        self.beginResetModel()
        self._order = list(conversations)
        self._items = grouped(self._projects, self._order)
        self.endResetModel()

    def set_projects(self, projects: Sequence[Project]) -> None:
        """Show these projects (in this order) with their chats under them."""
        self._projects = list(projects)
        self._apply(self._order)

    def project(self, project_id: str) -> Project | None:
        return next((p for p in self._projects if p.id == project_id), None)

    def projects(self) -> list[Project]:
        return list(self._projects)

    def upsert(self, conversation: Conversation, to_top: bool = False) -> None:
        """Add or refresh ``conversation``; new ones and ``to_top`` ones become the most recent (a chat of its
        own goes to row 0, a branch to the top of its parent's branches)."""
        order = [c for c in self._order if c.id != conversation.id]
        at = next((i for i, c in enumerate(self._order) if c.id == conversation.id), None)
        order.insert(0 if at is None or to_top else at, conversation)
        self._apply(order)

    def remove(self, conversation_id: str) -> None:
        """Drop a conversation; its branches (the store has made them chats of their own) move to the top level."""
        kept = [c for c in self._order if c.id != conversation_id]
        if len(kept) != len(self._order):
            self._apply(kept)

    # -- queries ----------------------------------------------------------------------
    def row_of(self, conversation_id: str) -> int | None:
        """The row of that chat (never a project's header)."""
        for row, (item, _depth, _level) in enumerate(self._items):
            if item.id == conversation_id and isinstance(item, Conversation):
                return row
        return None

    def project_row(self, project_id: str) -> int | None:
        for row, (item, _depth, _level) in enumerate(self._items):
            if item.id == project_id and isinstance(item, Project):
                return row
        return None

    def conversation_at(self, row: int) -> Conversation:
        item = self._items[row][0]
        if not isinstance(item, Conversation):
            raise IndexError(f"row {row} is a project's header, not a chat")
        return item

    def depth_at(self, row: int) -> int:
        return self._items[row][1]

    def ids(self) -> list[str]:
        """Every row's id, as shown (a project's header: the project's id)."""
        return [item.id for item, _depth, _level in self._items]

    def titles(self) -> list[str]:
        """Every row's title (a project's header: its name)."""
        return [item.name if isinstance(item, Project) else item.title for item, _depth, _level in self._items]

    # -- internals --------------------------------------------------------------------
    def _parent_title(self, item: Conversation) -> str | None:
        if item.parent_id is None:
            return None
        return next((c.title for c in self._order if c.id == item.parent_id), None)

    def _apply(self, order: list[Conversation]) -> None:
        """Show ``order`` (most recent first): rows removed, moved, inserted and refreshed, in that order."""
        self._order = order
        new = grouped(self._projects, order)
        new_ids = [row[0].id for row in new]
        wanted = set(new_ids)
        for row in reversed(range(len(self._items))):
            if self._items[row][0].id not in wanted:
                self.beginRemoveRows(QModelIndex(), row, row)
                del self._items[row]
                self.endRemoveRows()
        present = {shown[0].id for shown in self._items}
        self._reorder([i for i in new_ids if i in present])
        for row, shown in enumerate(new):
            if shown[0].id not in present:
                self.beginInsertRows(QModelIndex(), row, row)
                self._items.insert(row, shown)
                self.endInsertRows()
        for row, shown in enumerate(new):
            if self._items[row] != shown:
                self._items[row] = shown
                self.dataChanged.emit(self.index(row), self.index(row))

    def _reorder(self, ids: list[str]) -> None:
        """Put the rows (the same ones) in the order of ``ids``: one block move where that says it, else a
        layout change that carries the views' persistent indexes (selection, current row) along."""
        old = [shown[0].id for shown in self._items]
        if old == ids:
            return
        first = next(i for i, (a, b) in enumerate(zip(old, ids, strict=True)) if a != b)
        start = old.index(ids[first])  # the block that moved up to ``first`` begins here
        length = 1
        while start + length < len(old) and first + length < len(ids) and old[start + length] == ids[first + length]:
            length += 1
        moved = old[:first] + old[start : start + length] + old[first:start] + old[start + length :]
        by_id = {shown[0].id: shown for shown in self._items}
        if moved == ids:
            self.beginMoveRows(QModelIndex(), start, start + length - 1, QModelIndex(), first)
            self._items = [by_id[i] for i in ids]
            self.endMoveRows()
            return
        self.layoutAboutToBeChanged.emit()
        persistent = self.persistentIndexList()
        self._items = [by_id[i] for i in ids]
        rows = {i: row for row, i in enumerate(ids)}
        self.changePersistentIndexList(persistent, [self.index(rows[old[p.row()]]) for p in persistent])
        self.layoutChanged.emit()
