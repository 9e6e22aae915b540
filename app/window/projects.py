"""Projects in the window: a folder of chats with its own system prompt, documents and values, started warm.

:class:`ProjectsController` owns the projects' part of the sidebar (their
header rows, "New project…", a project's menu, a chat's "Move to project…")
and the Chat menu's "New project…".  Opening a project (selecting its header,
or "New chat in project") opens a new chat in it: the next chat's system
prompt, values and documents are the project's (``ChatSession.pending_*``),
and its first message creates it in the project (``pending_project``).

Warm start: the moment a project is opened, the prompt its new chat will send
(system prompt and documents, rendered as that chat renders them, then a
one-word stand-in for the first message: :data:`WARM_DRAFT`) goes to the
engine as a typing hint for the new chat's draft (``engine.runtime.hints``):
the engine prefills it while idle, and the draft typed next continues that job
(the stand-in is cropped away; a draft already in the composer is hinted
as itself), so the first reply starts from the cached
prefix (its ``Metrics.cached_tokens``).  Nothing is hinted before a model is
loaded or with the prefix cache off.  Deleting a project keeps its chats,
outside any project.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QInputDialog, QMessageBox

from app.dialogs.project import ProjectDialog
from engine.api import DraftPrefill
from engine.storage import Project, StoreError, params

WARM_DRAFT = "Hello"  # the stand-in first message a project's warm hint renders after its prefix
NO_PROJECT = "(No project)"


class ProjectsController(QObject):
    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.open_project_id: str | None = None  # the project whose new chat is open (None: none)
        self._given: list[dict[str, Any]] | None = None  # the documents a project gave the next new chat
        self.warmed = 0  # warm hints handed to the engine (tests read it)
        sidebar = window.sidebar
        sidebar.new_project_requested.connect(lambda: self.new_project())
        sidebar.project_selected.connect(self.open_project)
        sidebar.new_chat_in_project_requested.connect(self.open_project)
        sidebar.project_settings_requested.connect(lambda pid: self.edit_project(pid))
        sidebar.project_delete_requested.connect(lambda pid: self.delete_project(pid))
        sidebar.move_to_project_requested.connect(lambda cid: self.move_to_project(cid))
        self.new_project_action = QAction("New project\u2026", window)
        self.new_project_action.setToolTip("A folder of chats with its own system prompt, documents and values")
        self.new_project_action.triggered.connect(lambda: self.new_project())
        chat_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&Chat"), None)
        if chat_menu is not None:
            chat_menu.addAction(self.new_project_action)
        window.bridge.event.connect(self._on_event)
        self.refresh()

    # -- the sidebar's projects ---------------------------------------------------------
    def refresh(self) -> list[Project]:
        try:
            projects = self.window.store.list_projects()
        except StoreError as exc:
            self.window._store_error(exc)
            return []
        self.window.sidebar.set_projects(projects)
        return projects

    def new_project(self, name: str | None = None, system_prompt: str = "") -> str | None:
        """Make a project (``name`` None: asked in a small dialog) and open a new chat in it; returns its id."""
        if name is None:
            dialog = ProjectDialog(self.window)
            if dialog.exec() != QDialog.DialogCode.Accepted:
                return None
            name, system_prompt = dialog.name(), dialog.system_prompt()
        try:
            project_id = self.window.store.create_project(name, system_prompt)
        except (StoreError, ValueError) as exc:
            self.window.show_banner("store-error", "error", str(exc))
            return None
        self.refresh()
        self.open_project(project_id)
        return project_id

    def open_project(self, project_id: str) -> None:
        """Open a new chat in the project, with its prompt, values and documents, and warm its prefix."""
        window = self.window
        try:
            project = window.store.get_project(project_id)
        except StoreError as exc:
            window._store_error(exc)
            return
        window.new_chat()
        session = window.session
        own, _problems = params.checked(project.params)
        session.pending_system, session.pending_params = project.system_prompt, own
        session.pending_documents = self._given = [dict(d) for d in project.documents]
        session.pending_project = self.open_project_id = project_id
        window.parameters.show_chat()
        window.documents.show_chat()
        window.sidebar.select_project(project_id)
        window.setWindowTitle(f"New chat in {project.name} \u2014 Brisk")
        window.statusBar().showMessage(f"New chat in \u201c{project.name}\u201d: its prompt is being prefilled.", 5000)
        self.warm()

    def warm(self) -> bool:
        """Hint the open project's new chat: its prefix is prefilled while the engine is idle."""
        window = self.window
        session = window.session
        if session.conversation_id is not None or session.pending_project is None:
            return False
        if not window.model_ready or not window.settings.prefix_cache or session.active is not None:
            return False
        typed = window.composer.text()  # a draft kept across the switch is hinted as itself
        try:
            request = session.draft_request(typed if typed.strip() else WARM_DRAFT)
        except StoreError:
            return False
        if window.bridge.hint(request):
            self.warmed += 1
            return True
        return False

    def new_chat_outside(self) -> None:
        """A plain new chat: the documents a project gave the next new chat are not its."""
        session = self.window.session
        if self._given is not None and session.pending_documents == self._given:
            session.pending_documents = []
        self._given, self.open_project_id = None, None

    # -- a project's settings, deleting it, moving chats ---------------------------------
    def edit_project(self, project_id: str, dialog: ProjectDialog | None = None) -> bool:
        """The project's settings (name, prompt, values, documents); True when saved."""
        window = self.window
        try:
            project = window.store.get_project(project_id)
            chat_docs = window.session.documents()
        except StoreError as exc:
            window._store_error(exc)
            return False
        if dialog is None:
            dialog = ProjectDialog(
                window,
                name=project.name,
                system_prompt=project.system_prompt,
                params=project.params,
                documents=project.documents,
                chat_documents=chat_docs,
                settings=True,
            )
            if dialog.exec() != QDialog.DialogCode.Accepted:
                return False
        own, problems = params.checked(dialog.params())
        if problems:
            window.show_banner("project", "error", "The project's values were not saved: " + "; ".join(problems))
            return False
        try:
            window.store.rename_project(project_id, dialog.name())
            window.store.set_project_prompt(project_id, dialog.system_prompt())
            window.store.set_project_params(project_id, own)
            window.store.set_project_documents(project_id, dialog.documents())
        except (StoreError, ValueError) as exc:
            window.show_banner("store-error", "error", str(exc))
            return False
        self.refresh()
        if window.session.conversation_id is None and window.session.pending_project == project_id:
            self.open_project(project_id)  # its new chat starts with the values as they are now
        return True

    def delete_project(self, project_id: str, confirm: bool = True) -> bool:
        window = self.window
        try:
            project = window.store.get_project(project_id)
            chats = len(window.store.project_chats(project_id))
        except StoreError as exc:
            window._store_error(exc)
            return False
        if confirm:
            kept = f" Its {chats} chat{'s' if chats != 1 else ''} stay, outside any project." if chats else ""
            answer = QMessageBox.question(
                window,
                "Delete project",
                f"Delete the project \u201c{project.name}\u201d?{kept}",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return False
        try:
            window.store.delete_project(project_id)
            conversations = window.store.list_conversations()
        except StoreError as exc:
            window._store_error(exc)
            return False
        if window.session.pending_project == project_id:
            window.session.pending_project = None
        self.refresh()
        window.sidebar.set_conversations(conversations)
        window.sidebar.select(window.session.conversation_id)
        return True

    def move_to_project(self, conversation_id: str, project_id: str | None = None, ask: bool = True) -> bool:
        """Put the chat in a project (``ask``: chosen in a list, "(No project)" takes it out); True when moved."""
        window = self.window
        projects = self.refresh()
        if ask:
            names = [NO_PROJECT, *(p.name for p in projects)]
            name, ok = QInputDialog.getItem(window, "Move to project", "Move the chat to:", names, 0, False)
            if not ok:
                return False
            project_id = next((p.id for p in projects if p.name == name), None)
        try:
            window.store.move_to_project(conversation_id, project_id)
        except StoreError as exc:
            window._store_error(exc)
            return False
        window._refresh_entry(conversation_id, to_top=False)
        return True

    def _on_event(self, event: object) -> None:
        session = self.window.session
        if (
            isinstance(event, DraftPrefill)
            and session.pending_project is not None
            and session.conversation_id is None
            and event.conversation_id == session.draft_id
            and event.total
            and event.ready == event.total
            and not self.window.composer.text().strip()
        ):
            self.window.statusBar().showMessage(f"Project prompt ready: {event.ready:,} tokens prefilled.", 5000)
