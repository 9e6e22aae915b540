"""The main window: wires the sidebar, chat view, composer and status bar to
the store (through :class:`~app.session.ChatSession`) and to the engine
(through :class:`~app.bridge.EngineBridge`).

``MainWindow(store, bridge, settings, store_warning=None, model_override=None)``
never blocks on the engine: it submits requests and reacts to the bridge's
``event`` signal.  Public methods (``send``, ``stop``, ``regenerate``,
``edit_message``, ``new_chat``, ``open_conversation``, ``rename_conversation``,
``delete_conversation``, ``export_markdown``, ``search``, ``apply_settings``,
``load_model``) are what the widgets call and what tests drive.  Store
failures become an error banner (never a crash); a failed model load becomes a
banner with an "Open Settings" button, and the window stays usable.  A
``LoadFailed`` that follows ``Loaded`` (only the draft model failed) is a
warning: the model stays loaded and Send stays enabled.  After each ``Loaded``
the engine's answer memory is seeded from the saved history
(:mod:`app.answer_seed`).  F1 (or the Settings dialog) opens "About this
machine" (``show_about``).

``run_gui`` (defined in :mod:`app.launch`) is re-exported here for the CLI.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QInputDialog,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.about_dialog import AboutDialog
from app.answer_seed import seed_answers
from app.banner import Banner
from app.bridge import EngineBridge
from app.chat_view import ChatView
from app.composer import Composer
from app.launch import run_gui
from app.session import ChatSession, Turn
from app.settings_dialog import SettingsDialog, needs_reload
from app.sidebar import WIDTH, Sidebar
from app.status_area import StatusArea
from app.style import STYLESHEET
from engine.api import Loaded, LoadFailed, LoadProgress, Warning
from engine.storage import Message, Settings, Store, StoreError

__all__ = ["MainWindow", "run_gui"]

LOADING_TIP = "The model is still loading. You can type; Send unlocks when it is ready."
FAILED_TIP = "No model is loaded. Pick another model in Settings."
ABOUT_SHORTCUT = "F1"


class MainWindow(QMainWindow):
    def __init__(
        self,
        store: Store,
        bridge: EngineBridge,
        settings: Settings,
        *,
        store_warning: str | None = None,
        model_override: str | None = None,
        settings_path: Path | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.bridge = bridge
        self.settings = settings
        self.model_ready = False
        self.loaded: Loaded | None = None  # the last Loaded event: model facts for "About this machine"
        self.about: AboutDialog | None = None
        self._model_override = model_override
        self._settings_path = settings_path
        self.session = ChatSession(store, settings)
        self.session.on_store_error = self._store_error
        self._banners: dict[str, Banner] = {}
        self._build()
        bridge.event.connect(self._on_event)
        if store_warning:
            self.show_banner("store-fallback", "warning", store_warning)
        self._load_history()
        self.composer.editor.setFocus()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        self.setWindowTitle("Brisk")
        self.resize(1100, 740)
        self.setStyleSheet(STYLESHEET)
        self.sidebar = Sidebar()
        panel = QWidget()
        panel.setObjectName("chatPanel")
        column = QVBoxLayout(panel)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        self._banner_area = QVBoxLayout()
        self._banner_area.setContentsMargins(16, 8, 16, 0)
        self._banner_area.setSpacing(6)
        column.addLayout(self._banner_area)
        self.chat_view = ChatView()
        self.chat_view.colour_drafts = self.settings.colour_draft_tokens
        column.addWidget(self.chat_view, 1)
        self.composer = Composer()
        self.composer.set_ready(False, LOADING_TIP)
        column.addWidget(self.composer)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.sidebar)
        splitter.addWidget(panel)
        splitter.setStretchFactor(1, 1)
        splitter.setCollapsible(1, False)
        splitter.setSizes([WIDTH, 860])
        self.setCentralWidget(splitter)
        self.status_area = StatusArea()
        self.statusBar().addWidget(self.status_area, 1)

        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_markdown)
        self.sidebar.search_changed.connect(self.search)
        self.sidebar.hit_chosen.connect(self._open_hit)
        self.sidebar.settings_requested.connect(self.open_settings)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.edit_message)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)

        self.stop_action = self._action("Stop", QKeySequence(Qt.Key.Key_Escape), self.stop)
        self.stop_action.setEnabled(False)
        self._action("New chat", QKeySequence.StandardKey.New, self.new_chat)
        self._action("Search", QKeySequence.StandardKey.Find, self.sidebar.search_box.setFocus)
        self._action("Settings", QKeySequence("Ctrl+,"), self.open_settings)
        self._action("About this machine", QKeySequence(ABOUT_SHORTCUT), self.show_about)

    def _action(self, text: str, shortcut: QKeySequence | QKeySequence.StandardKey, slot: object) -> QAction:
        action = QAction(text, self)
        action.setShortcut(shortcut)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    # -- banners -------------------------------------------------------------------------
    def show_banner(
        self, key: str, kind: str, text: str, action_text: str | None = None, on_action: object = None
    ) -> Banner:
        banner = self._banners.get(key)
        if banner is None or banner.kind != kind:
            if banner is not None:
                banner.deleteLater()
            banner = Banner(kind, text, action_text, on_action)  # type: ignore[arg-type]
            self._banners[key] = banner
            self._banner_area.addWidget(banner)
        banner.set_text(text)
        return banner

    def hide_banner(self, key: str) -> None:
        banner = self._banners.get(key)
        if banner is not None:
            banner.hide()

    def banner(self, key: str) -> Banner | None:
        """The banner for ``key`` if it is showing."""
        banner = self._banners.get(key)
        return banner if banner is not None and not banner.isHidden() else None

    def _store_error(self, exc: StoreError) -> None:
        self.show_banner("store-error", "error", str(exc))

    # -- engine events ---------------------------------------------------------------------
    def load_model(self, model: str | None = None) -> None:
        if model:
            self._model_override = model
        self.model_ready = False
        self.composer.set_ready(False, LOADING_TIP)
        self.hide_banner("load")
        self.hide_banner("draft")
        s = self.settings
        self.bridge.load(self._model_override or s.model, s.device, s.dtype, s.quant, s.draft_model, s.draft_quant)

    def _on_event(self, event: object) -> None:
        if isinstance(event, LoadProgress):
            self.status_area.loading(event.fraction, event.message)
        elif isinstance(event, Loaded):
            self.model_ready = True
            self.loaded = event
            self.status_area.loaded(event)
            self.composer.set_ready(True)
            self.hide_banner("load")
            if self.about is not None:
                self.about.set_loaded(event)
            self._seed_answers()
        elif isinstance(event, Warning) and event.kind == "draft":
            self.show_banner(
                "draft",
                "warning",
                f"{event.message} Replies use the main model alone.",
                "Open Settings\u2026",
                self.open_settings,
            )
        elif isinstance(event, LoadFailed):
            self.model_ready = False
            self.loaded = None
            if self.about is not None:
                self.about.set_loaded(None)
            self.status_area.failed(event.message)
            self.composer.set_ready(False, FAILED_TIP)
            self.show_banner(
                "load",
                "error",
                f"The model could not be loaded. {event.message}",
                "Open Settings\u2026",
                self.open_settings,
            )
        else:
            self._on_reply_event(event)

    def _seed_answers(self) -> None:
        """Let the engine draft from answers saved in earlier sessions."""
        if not self.settings.answer_cache:
            return
        try:
            seed_answers(self.bridge.engine, self.store)
        except StoreError as exc:
            self._store_error(exc)

    def _on_reply_event(self, event: object) -> None:
        reply = self.session.apply(event)
        if reply is None:
            return
        shown = reply.conversation_id == self.session.conversation_id
        if reply.streaming:
            if shown:
                self.chat_view.reply_updated(reply)
            return
        if shown:
            self.chat_view.reply_finished(reply)
        self._set_busy(self.session.active is not None)
        self._refresh_entry(reply.conversation_id)

    # -- turns ---------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        if not text.strip():
            self.composer.show_hint("Type a message first.")
            return False
        try:
            turn = self.session.send(text)
        except StoreError as exc:
            self._store_error(exc)
            return False
        except RuntimeError as exc:  # a reply is still streaming
            self.composer.show_hint(str(exc))
            return False
        self.composer.clear()
        self._refresh_entry(turn.reply.conversation_id)
        self.sidebar.select(turn.reply.conversation_id)
        self._show_title()
        if turn.user_message_id is not None:
            self.chat_view.add_user_message(turn.user_message_id, text)
        self._start(turn)
        return True

    def stop(self) -> None:
        reply = self.session.stop()
        if reply is None:
            return
        self.bridge.cancel(reply.request_id)
        if reply.conversation_id == self.session.conversation_id:
            self.chat_view.reply_finished(reply)
        self._set_busy(False)
        self._refresh_entry(reply.conversation_id)

    def regenerate(self, message_id: int | None = None) -> bool:
        if not self._can_start():
            return False
        if message_id is None:
            replies = [m.id for m in self._messages() if m.role == "assistant"]
            if not replies:
                return False
            message_id = replies[-1]
        try:
            turn = self.session.regenerate(message_id)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.remove_from(message_id)
        self._start(turn)
        return True

    def edit_message(self, message_id: int, text: str | None = None) -> bool:
        if not self._can_start():
            return False
        if text is None:
            old = next((m.content for m in self._messages() if m.id == message_id), "")
            text, ok = QInputDialog.getMultiLineText(
                self, "Edit message", "Edit your message. The replies after it will be replaced.", old
            )
            if not ok:
                return False
        if not text.strip():
            self.composer.show_hint("An edited message cannot be empty.")
            return False
        try:
            turn = self.session.edit(message_id, text)
        except (StoreError, ValueError) as exc:
            self.show_banner("store-error", "error", str(exc))
            return False
        self.chat_view.remove_from(message_id)
        if turn.user_message_id is not None:
            self.chat_view.add_user_message(turn.user_message_id, text)
        self._start(turn)
        return True

    def _can_start(self) -> bool:
        if self.session.active is not None:
            self.composer.show_hint("A reply is still streaming. Press Esc to stop it.")
            return False
        if not self.model_ready:
            self.composer.show_hint(FAILED_TIP if self.banner("load") else LOADING_TIP)
            return False
        return True

    def _start(self, turn: Turn) -> None:
        self.chat_view.start_reply(turn.reply)
        self._set_busy(True)
        self.bridge.submit(turn.request)

    def _set_busy(self, busy: bool) -> None:
        self.composer.set_busy(busy)
        self.chat_view.set_busy(busy)
        self.stop_action.setEnabled(busy)

    # -- conversations -------------------------------------------------------------------------
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
        self.sidebar.select(None)
        self._show_title()
        self.composer.editor.setFocus()

    def open_conversation(self, conversation_id: str) -> None:
        try:
            messages = self.session.open(conversation_id)
        except StoreError as exc:
            self._store_error(exc)
            return
        active = self.session.active
        shown_active = active if active is not None and active.conversation_id == conversation_id else None
        self.chat_view.set_messages(messages, shown_active)
        self.sidebar.select(conversation_id)
        self._show_title()

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
        active = self.session.active
        if active is not None and active.conversation_id == conversation_id:
            self.stop()
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
            self,
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
            chosen, _ = QFileDialog.getSaveFileName(
                self, "Export Markdown", str(Path.home() / f"{name}.md"), "Markdown (*.md);;All files (*)"
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

    # -- settings ---------------------------------------------------------------------------------
    def show_about(self) -> AboutDialog:
        """Open (or raise) the "About this machine" window; it does not block."""
        if self.about is None:
            self.about = AboutDialog(self.loaded, self)
        self.about.show()
        self.about.raise_()
        self.about.activateWindow()
        return self.about

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self, loaded=self.loaded)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.apply_settings(dialog.result_settings())

    def apply_settings(self, new: Settings) -> None:
        old = self.settings
        self.settings = new
        self.session.settings = new
        self.chat_view.colour_drafts = new.colour_draft_tokens
        try:
            new.save(self._settings_path)
        except OSError as exc:
            self.show_banner("settings", "error", f"Settings could not be saved ({exc}); they apply until you quit.")
        if new.system_prompt != old.system_prompt and self.session.conversation_id is not None:
            try:
                self.store.set_system_prompt(self.session.conversation_id, new.system_prompt)
            except StoreError as exc:
                self._store_error(exc)
        engine = getattr(self.bridge, "engine", None)
        if new.prefix_cache_mb != old.prefix_cache_mb and hasattr(engine, "set_prefix_budget"):
            engine.set_prefix_budget(new.prefix_cache_mb << 20)  # type: ignore[union-attr]
        if needs_reload(old, new):
            if new.model != old.model:
                self._model_override = None
            self.load_model()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        self.stop()  # keeps a streaming reply's text, saved as "cancelled"
        super().closeEvent(event)
