"""The window's conversations: open, new, rename, delete, export, search.

:class:`ConversationActions` is a mixin of
:class:`~app.window.main_window.MainWindow` (it holds no state of its own):
each method changes the store first and then the sidebar and the chat view,
and a :class:`~engine.storage.StoreError` becomes an error banner, never a crash.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.state.context import meter_text, meter_tip, usage
from app.state.session import ChatSession
from app.views.chat_view import ChatView
from app.views.composer import Composer
from app.views.sidebar import Sidebar
from engine.storage import Message, Store, StoreError


class ConversationActions:
    """Mixed into MainWindow, which provides these attributes and the methods called below."""

    store: Store
    session: ChatSession
    chat_view: ChatView
    composer: Composer
    sidebar: Sidebar
    _store_error: Any
    show_banner: Any
    stop: Any
    show_busy: Any  # app.window.turns: Send/Stop as the open chat is
    parameters: Any  # app.window.parameters.ParametersController
    typing: Any  # app.window.draft_prefill.TypingPrefill
    documents: Any  # app.window.document_controller.DocumentsController
    statusBar: Any  # noqa: N815 (QMainWindow's)
    setWindowTitle: Any  # noqa: N815

    def _load_history(self) -> None:
        try:
            conversations = self.store.list_conversations()
        except StoreError as exc:
            self._store_error(exc)
            return
        self.sidebar.set_conversations(conversations)
        if conversations:
            self.open_conversation(conversations[0].id)

    def _messages(self) -> list[Message]:
        try:
            return self.session.messages()
        except StoreError as exc:
            self._store_error(exc)
            return []

    def new_chat(self) -> None:
        self.session.open(None)
        self.chat_view.clear()
        self.show_busy()
        self.sidebar.select(None)
        self._show_title()
        self.parameters.show_chat()
        self.documents.show_chat()  # none yet (and the context meter with them)
        self.composer.editor.setFocus()
        self.typing.chat_changed()  # the draft in the composer now belongs to this chat

    def show_context(self, messages: list[Any] | None = None) -> None:
        """The context meter for the open chat (``messages``: its stored messages, read if not given): the whole,
        and the attached documents' share of it (the tooltip has each part).  Called again when a document is
        attached or detached, it counts the chat's documents as they are now."""
        if messages is None:
            messages = self._messages() if self.session.conversation_id else []
        loaded = getattr(self, "loaded", None)
        length = loaded.info.context_length if loaded is not None else 0
        replies = [m.metrics for m in messages if m.role == "assistant"]
        try:
            docs = self.session.documents()
        except StoreError:
            docs = []
        parts = usage(replies, docs, self.session.skip_documents, self.documents.searched(docs))
        self.composer.context.setText(meter_text(parts, length))
        self.composer.context.setToolTip(meter_tip(parts, length))

    def open_conversation(self, conversation_id: str) -> None:
        try:
            messages = self.session.open(conversation_id)
        except StoreError as exc:
            self._store_error(exc)
            return
        self.chat_view.set_messages(messages, self.session.active)  # the chat's own reply, if it streams
        self.show_busy()
        self.sidebar.select(conversation_id)
        self._show_title()
        self.parameters.show_chat()
        self.documents.show_chat(messages=messages)  # its chips and context meter; changed files read again
        self.typing.chat_changed()

    def _open_hit(self, conversation_id: str, message_id: int | None) -> None:
        self.open_conversation(conversation_id)
        if message_id is not None:
            self.chat_view.scroll_to_message(message_id)

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            return
        try:
            self.store.rename_conversation(conversation_id, title)
        except StoreError as exc:
            self._store_error(exc)
            return
        self._refresh_entry(conversation_id)
        self._show_title()

    def delete_conversation(self, conversation_id: str, confirm: bool = True) -> bool:
        if confirm and not self._confirm_delete(conversation_id):
            return False
        self.stop(conversation_id)  # its reply, if one streams (the open chat's or another's)
        self.session.forget(conversation_id)
        try:
            self.store.delete_conversation(conversation_id)
        except StoreError as exc:
            self._store_error(exc)
            return False
        self.sidebar.remove(conversation_id)
        if self.session.conversation_id == conversation_id:
            self.new_chat()
        return True

    def _confirm_delete(self, conversation_id: str) -> bool:
        row = self.sidebar.model.row_of(conversation_id)
        title = self.sidebar.model.conversation_at(row).title if row is not None else "this conversation"
        answer = QMessageBox.question(
            cast(QWidget, self),  # the MainWindow it is mixed into
            "Delete conversation",
            f"Delete \u201c{title}\u201d and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        return answer == QMessageBox.StandardButton.Yes

    def export_markdown(self, conversation_id: str, path: Path | str | None = None) -> Path | None:
        try:
            text = self.store.export_markdown(conversation_id)
            title = self.store.get_conversation(conversation_id).title
        except StoreError as exc:
            self._store_error(exc)
            return None
        if path is None:
            name = re.sub(r"[^\w\- ]+", "", title).strip() or "conversation"
            window = cast(QWidget, self)  # the MainWindow it is mixed into
            chosen, _ = QFileDialog.getSaveFileName(
                window, "Export Markdown", str(Path.home() / f"{name}.md"), "Markdown (*.md);;All files (*)"
            )
            if not chosen:
                return None
            path = chosen
        target = Path(path)
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            self.show_banner("export", "error", f"Could not write {target}: {exc.strerror or exc}. Pick another place.")
            return None
        self.statusBar().showMessage(f"Exported to {target}", 5000)
        return target

    def search(self, query: str) -> None:
        if not query.strip():
            return
        try:
            hits = self.store.search(query)
        except StoreError as exc:
            self._store_error(exc)
            return
        self.sidebar.show_results(hits)

    def _refresh_entry(self, conversation_id: str) -> None:
        try:
            conversation = self.store.get_conversation(conversation_id)
        except StoreError:
            return  # deleted meanwhile: nothing to show
        self.sidebar.upsert(conversation, to_top=True)
        if conversation_id == self.session.conversation_id:
            self.sidebar.select(conversation_id)

    def _show_title(self) -> None:
        row = self.sidebar.model.row_of(self.session.conversation_id or "")
        title = self.sidebar.model.conversation_at(row).title if row is not None else ""
        self.setWindowTitle(f"{title} \u2014 Brisk" if title else "Brisk")
