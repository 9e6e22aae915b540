"""The left column: New chat, history search, the conversation list, Settings.

The sidebar holds no data of its own beyond the :class:`ConversationListModel`
its owner fills; every user intent leaves as a signal:
``new_chat_requested``, ``conversation_selected(id)``,
``rename_requested(id, title)`` (double-click or context menu, edited in
place), ``delete_requested(id)``, ``export_requested(id)``,
``keep_last_requested(id)`` ("Keep last N turns…": the owner asks for N),
``search_changed(query)`` (debounced; ``""`` when cleared),
``hit_chosen(conversation_id, message_id | None)`` and ``settings_requested``.
The owner answers a search with :meth:`show_results`.

Branches (``Conversation.parent_id``) are listed under their parent, each
level indented by ``INDENT_PX`` (:mod:`app.views.conversation_list` orders them).

Projects (``set_projects``) are header rows with their chats under them,
indented one level.  "New project…" (under New chat) emits
``new_project_requested``; selecting a project's header emits
``project_selected(id)`` (the owner opens a new chat in it); its context menu
emits ``new_chat_in_project_requested(id)``, ``project_settings_requested(id)``
and ``project_delete_requested(id)``; a chat's menu has "Move to project…"
(``move_to_project_requested(conversation_id)``: the owner asks where).

Neither list ever scrolls sideways: :class:`FitWidthDelegate` sizes every row
to the list's width, so a long title is elided with "…" (its tooltip
shows it in full) and a long search snippet wraps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from PySide6.QtCore import (
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QPoint,
    QRect,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QLineEdit,
    QListView,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStackedWidget,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.views.conversation_list import ID_ROLE, KIND_ROLE, LEVEL_ROLE, PROJECT, ConversationListModel
from engine.storage import Conversation, Project, SearchHit

SEARCH_DEBOUNCE_MS = 200
WIDTH = 240
INDENT_PX = 14  # a branch's row is indented this much per level under its parent
MAX_INDENT_LEVELS = 4  # deeper branches line up with the fourth level (the title keeps its room)


def indent_of(index: QModelIndex | QPersistentModelIndex) -> int:
    """How far a row is indented: ``INDENT_PX`` per level (a branch, a project's chat; rows without one: none)."""
    depth = index.data(LEVEL_ROLE)
    return INDENT_PX * min(depth, MAX_INDENT_LEVELS) if isinstance(depth, int) else 0


class FitWidthDelegate(QStyledItemDelegate):
    """Rows as wide as the view's viewport, never wider.

    The height is measured at the viewport's width (so wrapped text gets the
    lines it needs); the width hint is 1 px, and a list view stretches each
    row to its viewport, so the content never outgrows it.  Qt then elides
    single-line text to fit, with the view's ``textElideMode``.
    """

    def __init__(self, view: QAbstractItemView) -> None:
        super().__init__(view)
        self._view = view

    def sizeHint(  # noqa: N802 (Qt override)
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        fitted = QStyleOptionViewItem(option)
        fitted.rect.setWidth(max(1, self._view.viewport().width()))
        return QSize(1, super().sizeHint(fitted, index).height())

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        indent = indent_of(index)
        if not indent:
            super().paint(painter, option, index)
            return
        shifted = QStyleOptionViewItem(option)
        shifted.rect.setLeft(shifted.rect.left() + indent)
        super().paint(painter, shifted, index)

    def updateEditorGeometry(  # noqa: N802 (Qt override)
        self, editor: QWidget, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        """The rename editor covers its row (past its indent) and is never shorter than its own size hint (no
        clipped title)."""
        rect = QRect(option.rect)
        rect.setLeft(rect.left() + indent_of(index))
        height = max(rect.height(), editor.sizeHint().height())
        rect.setTop(rect.center().y() - height // 2)
        rect.setHeight(height)
        editor.setGeometry(rect)


def _no_sideways_scrolling(view: QListView) -> None:
    view.setItemDelegate(FitWidthDelegate(view))
    view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    view.setTextElideMode(Qt.TextElideMode.ElideRight)


class Sidebar(QWidget):
    new_chat_requested = Signal()
    conversation_selected = Signal(str)
    rename_requested = Signal(str, str)
    delete_requested = Signal(str)
    export_requested = Signal(str)
    keep_last_requested = Signal(str)
    search_changed = Signal(str)
    hit_chosen = Signal(str, object)
    settings_requested = Signal()
    new_project_requested = Signal()
    project_selected = Signal(str)
    new_chat_in_project_requested = Signal(str)
    project_settings_requested = Signal(str)
    project_delete_requested = Signal(str)
    move_to_project_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setMinimumWidth(180)
        self.resize(WIDTH, self.height())
        self._syncing = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)

        self.new_button = QPushButton("+  New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_chat_requested)
        layout.addWidget(self.new_button)
        self.new_project_button = QPushButton("New project\u2026")
        self.new_project_button.setToolTip(
            "A folder of chats with its own system prompt, documents and values; its new chats start warm"
        )
        self.new_project_button.clicked.connect(self.new_project_requested)
        layout.addWidget(self.new_project_button)

        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("Search history")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.textChanged.connect(self._search_edited)
        layout.addWidget(self.search_box)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DEBOUNCE_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search_box.text().strip()))

        self.model = ConversationListModel()
        self.model.title_edited.connect(self.rename_requested)
        self.list_view = QListView()
        self.list_view.setModel(self.model)
        self.list_view.setUniformItemSizes(True)
        _no_sideways_scrolling(self.list_view)
        self.list_view.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.list_view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list_view.customContextMenuRequested.connect(self._context_menu)
        self.list_view.selectionModel().currentChanged.connect(self._current_changed)

        self.results = QListWidget()
        self.results.setWordWrap(True)
        _no_sideways_scrolling(self.results)
        self.results.setResizeMode(QListView.ResizeMode.Adjust)  # re-wrap when the sidebar is resized
        self.results.itemClicked.connect(self._hit_clicked)
        self.results.itemActivated.connect(self._hit_clicked)
        self.no_results = QLabel("No matches.")
        self.no_results.setObjectName("hint")
        results_page = QWidget()
        results_layout = QVBoxLayout(results_page)
        results_layout.setContentsMargins(0, 0, 0, 0)
        results_layout.addWidget(self.no_results)
        results_layout.addWidget(self.results, 1)

        self.stack = QStackedWidget()
        self.stack.addWidget(self.list_view)
        self.stack.addWidget(results_page)
        layout.addWidget(self.stack, 1)

        self.settings_button = QPushButton("Settings")
        self.settings_button.setToolTip("Model, device, sampling and speed settings (Ctrl+,); About this machine: F1")
        self.settings_button.clicked.connect(self.settings_requested)
        layout.addWidget(self.settings_button)

    # -- from the owner ---------------------------------------------------------------
    def set_conversations(self, conversations: Sequence[Conversation]) -> None:
        with self._quiet():
            self.model.set_conversations(conversations)

    def set_projects(self, projects: Sequence[Project]) -> None:
        with self._quiet():
            self.model.set_projects(projects)

    def select_project(self, project_id: str) -> None:
        """Highlight a project's header without emitting ``project_selected``."""
        with self._quiet():
            row = self.model.project_row(project_id)
            if row is not None:
                self.list_view.setCurrentIndex(self.model.index(row))

    def upsert(self, conversation: Conversation, to_top: bool = False) -> None:
        with self._quiet():
            self.model.upsert(conversation, to_top)

    def remove(self, conversation_id: str) -> None:
        with self._quiet():
            self.model.remove(conversation_id)

    def select(self, conversation_id: str | None) -> None:
        """Highlight a conversation without emitting ``conversation_selected``."""
        with self._quiet():
            row = self.model.row_of(conversation_id) if conversation_id is not None else None
            selection = self.list_view.selectionModel()
            if row is None:
                selection.clearSelection()
                selection.setCurrentIndex(QModelIndex(), QItemSelectionModel.SelectionFlag.NoUpdate)
            else:
                self.list_view.setCurrentIndex(self.model.index(row))

    def show_results(self, hits: Sequence[SearchHit]) -> None:
        self.results.clear()
        for hit in hits:
            snippet = " ".join(hit.snippet.split())
            text = hit.title if hit.message_id is None else f"{hit.title}\n{snippet}"
            item = QListWidgetItem(text)
            item.setData(ID_ROLE, (hit.conversation_id, hit.message_id))
            item.setToolTip(snippet)
            self.results.addItem(item)
        self.no_results.setVisible(not hits)
        self.stack.setCurrentIndex(1)

    def rename(self, conversation_id: str) -> None:
        """Start editing a title in place."""
        row = self.model.row_of(conversation_id)
        if row is not None:
            self.list_view.edit(self.model.index(row))

    # -- internals ---------------------------------------------------------------------
    @contextmanager
    def _quiet(self) -> Iterator[None]:
        """Model and selection changes made by the owner are not user choices."""
        syncing, self._syncing = self._syncing, True
        try:
            yield
        finally:
            self._syncing = syncing

    def _search_edited(self, text: str) -> None:
        if text.strip():
            self._search_timer.start()
        else:
            self._search_timer.stop()
            self.stack.setCurrentIndex(0)
            self.search_changed.emit("")

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not self._syncing and current.isValid():
            if current.data(KIND_ROLE) == PROJECT:
                self.project_selected.emit(current.data(ID_ROLE))
            else:
                self.conversation_selected.emit(current.data(ID_ROLE))

    def _hit_clicked(self, item: QListWidgetItem) -> None:
        conversation_id, message_id = item.data(ID_ROLE)
        self.hit_chosen.emit(conversation_id, message_id)

    def _context_menu(self, pos: QPoint) -> None:
        index = self.list_view.indexAt(pos)
        if not index.isValid():
            return
        menu = QMenu(self)
        self.fill_menu(menu, index)
        menu.exec(self.list_view.viewport().mapToGlobal(pos))

    def fill_menu(self, menu: QMenu, index: QModelIndex | QPersistentModelIndex) -> None:
        """The context menu of a row: a project's or a chat's."""
        row_id = index.data(ID_ROLE)
        if index.data(KIND_ROLE) == PROJECT:
            menu.addAction("New chat in project", lambda: self.new_chat_in_project_requested.emit(row_id))
            menu.addAction("Project settings\u2026", lambda: self.project_settings_requested.emit(row_id))
            menu.addSeparator()
            menu.addAction("Delete project\u2026", lambda: self.project_delete_requested.emit(row_id))
            return
        conversation_id = row_id
        menu.addAction("Rename", lambda: self.rename(conversation_id))
        menu.addAction("Export Markdown\u2026", lambda: self.export_requested.emit(conversation_id))
        keep = menu.addAction("Keep last N turns\u2026", lambda: self.keep_last_requested.emit(conversation_id))
        keep.setToolTip("A new chat, branched off this one, with its system prompt and only its newest turns")
        menu.addAction("Move to project\u2026", lambda: self.move_to_project_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete\u2026", lambda: self.delete_requested.emit(conversation_id))
