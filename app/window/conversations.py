"""The window's conversations: open, new, rename, delete, export, search, branch.

:class:`ConversationActions` is a mixin of
:class:`~app.window.main_window.MainWindow` (it holds no state of its own
beyond the branches whose first reply is still to come): each method changes
the store first and then the sidebar and the chat view, and a
:class:`~engine.storage.StoreError` becomes an error banner, never a crash.

Branches: "Branch from here" on a reply (the chat view's context menu) makes a
new chat holding the conversation up to and including that reply
(:meth:`ConversationActions.branch_from`); on a message of the user's, the
conversation before it, with that message put in the composer to edit and
send.  "Keep last N turns…" (Chat menu, the sidebar's context menu) makes a
new chat with the system prompt and only the newest N turns
(:meth:`ConversationActions.keep_last_turns`).  Either opens at once, listed
under its parent.  Its history is the parent's, token for token, so the
engine's prefix cache serves it: the first reply's Done says how many prompt
tokens were reused, and the status bar says so ("reused N of P prompt tokens
from the cache").  Deleting a chat keeps its branches, as chats of their own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from app.state.context import meter_text, meter_tip, usage
from app.state.session import ChatSession
from app.views.chat_view import ChatView
from app.views.composer import Composer
from app.views.sidebar import Sidebar
from engine.api import Done, Error, Started
from engine.storage import Message, Store, StoreError

KEEP_TURNS_DEFAULT = 2  # "Keep last N turns…" offers this N


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
    latency: Any  # app.panels.controller.LatencyController
    typing: Any  # app.window.draft_prefill.TypingPrefill
    documents: Any  # app.window.document_controller.DocumentsController
    statusBar: Any  # noqa: N815 (QMainWindow's)
    menuBar: Any  # noqa: N815 (QMainWindow's)
    setWindowTitle: Any  # noqa: N815
    bridge: Any  # app.bridge.EngineBridge
    _fresh_branches: dict[str, str | None]  # branch id -> its first reply's request id, once it started

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
        projects = getattr(self, "projects", None)  # app.window.projects: a plain new chat is in no project
        if projects is not None:
            projects.new_chat_outside()
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
        self.latency.show_chat(conversation_id)  # the panel shows this chat's reply, not the last one begun
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
            branches = self.store.branches(conversation_id)
            self.store.delete_conversation(conversation_id)
        except StoreError as exc:
            self._store_error(exc)
            return False
        self.sidebar.remove(conversation_id)
        for branch in branches:  # chats of their own now, as the store keeps them
            self._refresh_entry(branch.id, to_top=False)
        if self.session.conversation_id == conversation_id:
            self.new_chat()
        return True

    def _confirm_delete(self, conversation_id: str) -> bool:
        row = self.sidebar.model.row_of(conversation_id)
        title = self.sidebar.model.conversation_at(row).title if row is not None else "this conversation"
        try:
            branches = len(self.store.branches(conversation_id))
        except StoreError:
            branches = 0
        kept = f" Its {branches} branch{'es' if branches != 1 else ''} stay, as chats of their own." if branches else ""
        answer = QMessageBox.question(
            cast(QWidget, self),  # the MainWindow it is mixed into
            "Delete conversation",
            f"Delete \u201c{title}\u201d and all its messages? This cannot be undone.{kept}",
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

    def _refresh_entry(self, conversation_id: str, to_top: bool = True) -> None:
        try:
            conversation = self.store.get_conversation(conversation_id)
        except StoreError:
            return  # deleted meanwhile: nothing to show
        self.sidebar.upsert(conversation, to_top=to_top)
        if conversation_id == self.session.conversation_id:
            self.sidebar.select(conversation_id)

    def _show_title(self) -> None:
        row = self.sidebar.model.row_of(self.session.conversation_id or "")
        title = self.sidebar.model.conversation_at(row).title if row is not None else ""
        self.setWindowTitle(f"{title} \u2014 Brisk" if title else "Brisk")

    # -- branches -------------------------------------------------------------------------
    def _build_branching(self) -> None:
        """Connect "Branch from here" and "Keep last N turns…" (Chat menu and sidebar) and the first replies'
        reuse note; called once the menus exist."""
        self._fresh_branches = {}
        self.chat_view.branch_requested.connect(self.branch_from)
        self.sidebar.keep_last_requested.connect(lambda conversation_id: self.keep_last_turns(conversation_id))
        self.keep_last_action = QAction("Keep last N turns\u2026", cast(QWidget, self))
        self.keep_last_action.setToolTip(
            "A new chat, branched off this one, with its system prompt and only its newest turns"
        )
        self.keep_last_action.triggered.connect(lambda: self.keep_last_turns())
        chat_menu = next((a.menu() for a in self.menuBar().actions() if a.text() == "&Chat"), None)
        if chat_menu is not None:
            chat_menu.addAction(self.keep_last_action)
        self.bridge.event.connect(self._branch_event)

    def branch_from(self, message_id: int) -> str | None:
        """Branch the open chat from one of its messages and open the branch; returns its id (None: not made).

        After a reply: the branch holds the conversation up to and including it.  At a message of the
        user's: the conversation before it, and the message goes into the composer to edit and send."""
        conversation_id = self.session.conversation_id
        messages = self._messages() if conversation_id is not None else []
        target = next((m for m in messages if m.id == message_id), None)
        if conversation_id is None or target is None:
            return None
        if target.status == "streaming":
            self.composer.show_hint("This reply is still being written; branch from it when it ends (or press Esc).")
            return None
        draft = target.content if target.role == "user" else None
        after: int | None = message_id
        if draft is not None:
            earlier = [m.id for m in messages if m.id < message_id]
            after = earlier[-1] if earlier else None
        try:
            branch_id = self.store.branch_conversation(conversation_id, after)
        except StoreError as exc:
            self._store_error(exc)
            return None
        self._open_branch(branch_id)
        if draft is not None:
            self.composer.editor.setPlainText(draft)
            self.composer.editor.setFocus()
        return branch_id

    def keep_last_turns(self, conversation_id: str | None = None, turns: int | None = None) -> str | None:
        """A new chat with the system prompt and the newest ``turns`` turns of ``conversation_id`` (default the
        open chat; ``turns`` None: asked, default ``KEEP_TURNS_DEFAULT``), opened; returns its id."""
        conversation_id = conversation_id or self.session.conversation_id
        if conversation_id is None:
            self.composer.show_hint("Open a chat first: its newest turns go into the new one.")
            return None
        if self.session.streaming(conversation_id) is not None:
            self.composer.show_hint("A reply is still streaming in that chat. Wait for it to end (or press Esc).")
            return None
        if turns is None:
            turns, ok = QInputDialog.getInt(
                cast(QWidget, self),
                "Keep last turns",
                "A new chat with this chat's system prompt and only its newest turns (a question and its "
                "reply). How many turns?",
                KEEP_TURNS_DEFAULT,
                1,
                10_000,
            )
            if not ok:
                return None
        try:
            branch_id = self.store.keep_last_turns(conversation_id, turns)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return None
        self._open_branch(branch_id)
        return branch_id

    def _open_branch(self, branch_id: str) -> None:
        self._fresh_branches[branch_id] = None
        self._refresh_entry(branch_id)
        self.open_conversation(branch_id)
        self.statusBar().showMessage("Branched: its first reply starts from the cached prompt of its parent.", 5000)

    def _branch_event(self, event: object) -> None:
        """Note a branch's first reply: which request it is (``Started``), then how much it reused (``Done``)."""
        if not self._fresh_branches:
            return
        request_id = getattr(event, "request_id", None)
        if isinstance(event, Started):
            for branch_id, known in self._fresh_branches.items():
                reply = self.session.streaming(branch_id)
                if known is None and reply is not None and reply.request_id == request_id:
                    self._fresh_branches[branch_id] = request_id
            return
        found = next((b for b, r in self._fresh_branches.items() if r == request_id), None)
        if found is None:
            return
        if isinstance(event, Error):  # it failed: the next reply is the first one
            self._fresh_branches[found] = None
        elif isinstance(event, Done):
            del self._fresh_branches[found]
            m = event.metrics
            if m.prompt_tokens and m.answer_cache is None:  # an answer-cache hit read no prompt
                ttft = f" (TTFT {m.ttft_s:.2f} s)" if m.ttft_s is not None else ""
                self.statusBar().showMessage(
                    f"Branch's first reply: reused {m.cached_tokens:,} cached tokens of {m.prompt_tokens:,}{ttft}.",
                    15000,
                )
