"""The main window: wires the sidebar, chat view, composer and status bar to
the store (through :class:`~app.state.session.ChatSession`) and to the engine
(through :class:`~app.bridge.EngineBridge`, the only way to it).

``MainWindow(store, bridge, settings, store_warning=None, model_override=None)``
never blocks on the engine: it submits requests and reacts to the bridge's
``event`` signal.  Public methods are what the widgets call and what tests
drive: turns (``send``, ``stop``, ``regenerate``, ``show_version``,
``edit_message``: in :mod:`app.window.turns`; replies stream in several chats
at once, busy per chat), conversations (``new_chat``, ``open_conversation``,
``rename_conversation``, ``delete_conversation``, ``export_markdown``,
``search``: in :mod:`app.window.conversations`), and here the model and the
settings (``load_model``, ``apply_settings``, ``open_settings``,
``show_about``), banners and :meth:`MainWindow.add_panel` (a dock beside the
chat).  File > Quit (Ctrl+Q) closes the window as its close button does.
Store failures become an error banner (never a crash); a failed model load
becomes a banner with an "Open Settings" button, and the window stays
usable.  A ``Warning(kind="draft")`` (only the draft model failed) is a
warning banner: the model stays loaded and Send stays enabled.  After each
``Loaded`` the engine's answer memory is seeded from the saved history
(:mod:`app.state.answer_seed`, through the bridge).  F1 (or the Settings
dialog) opens "About this machine".  Ctrl+T (or the "Tools" button in the
status bar) opens the Tools dialog (:meth:`MainWindow.open_tools`); enabled tools
apply from the next message, folder/fetch/MCP changes through
``bridge.set_tool_settings`` when the bridge offers it, else at the next start
(a notice says so).  A ``Warning(kind="tools")`` (an MCP server that failed in
the engine) is a warning banner; so is every other kind ("cache", "engine"...),
one banner per kind (:func:`warning_text`).  The View menu shows and hides the
latency panel (Ctrl+Shift+L) and resets the layout (:mod:`app.window.layout`),
which is remembered in the data folder when the window is given a
``layout_file``.  The streaming and parallel-tools switches
are saved in Settings.  Replies run on the engine Settings name (the local
model or a saved server, :mod:`app.engines`); a change of engine, server or
API key stops a streaming reply and rebuilds the bridge's backend.  The chat
view's "Compare…" opens the latency panel's compare dialog, and a reply's
tooltip is the configuration it ran with.  Documents attached to chats (File >
Attach files…, the paperclip, drag and drop), their chips, a reply's sources
and Tools > Documents… are :class:`~app.window.document_controller.DocumentsController`'s
(``document_library``: the index's factory, default the process's).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDockWidget,
    QMainWindow,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge
from app.dialogs.about import AboutDialog
from app.dialogs.models import ModelsDialog
from app.dialogs.settings import SettingsDialog, needs_reload
from app.dialogs.tools import ToolsDialog
from app.engines import engine_choice
from app.panels.charts import apply_theme as chart_theme
from app.panels.controller import LatencyController
from app.state.answer_seed import answer_pairs
from app.state.answer_stats import CacheTally
from app.state.config import config_tooltip
from app.state.session import ChatSession
from app.state.tools import backend_changes, enabled_tools, tool_settings
from app.views import style
from app.views.banner import Banner
from app.views.chat_view import ChatView
from app.views.composer import Composer
from app.views.sidebar import Sidebar
from app.views.status_area import StatusArea
from app.window.conversations import ConversationActions
from app.window.document_controller import DocumentsController, Library
from app.window.draft_prefill import TypingPrefill
from app.window.layout import LAYOUT_VERSION, PANEL_SHORTCUT, PARAMETERS_SHORTCUT, LayoutFile, default_widths
from app.window.parameters import ParametersController
from app.window.projects import ProjectsController
from app.window.serving import ServerSwitch
from app.window.turns import FAILED_TIP, LOADING_TIP, TurnActions
from engine.api import DraftPrefill, Loaded, LoadFailed, LoadProgress, ServedReply, Tuning, Warning
from engine.storage import LOCAL, Settings, Store, StoreError
from engine.storage.params import PresetFile

__all__ = ["MainWindow"]

ABOUT_SHORTCUT = "F1"
WARNING_PREFIX = {"cache": "Cache: ", "engine": "Engine: ", "settings": "Settings: "}


def warning_text(event: Warning) -> str:
    """The banner's text for an engine ``Warning``: what it is about, then the engine's own sentence."""
    prefix = WARNING_PREFIX.get(event.kind, f"{event.kind.capitalize()}: " if event.kind else "")
    return prefix + event.message


class MainWindow(TurnActions, ConversationActions, QMainWindow):
    def __init__(
        self,
        store: Store,
        bridge: EngineBridge,
        settings: Settings,
        *,
        store_warning: str | None = None,
        model_override: str | None = None,
        settings_path: Path | None = None,
        layout_file: LayoutFile | None = None,
        presets: PresetFile | None = None,
        document_library: Library | None = None,
    ) -> None:
        super().__init__()
        self.layout_file = layout_file  # where the layout is remembered (None: never, as in most tests)
        self.store = store
        self.bridge = bridge
        self.settings = settings
        self.model_ready = False
        self._load_began = time.monotonic()  # when the current load was asked for
        self._usable_s: float | None = None  # from then until its Loaded: the load time the status bar says
        self.loaded: Loaded | None = None  # the last Loaded event: model facts for "About this machine"
        self.about: AboutDialog | None = None
        self._model_override = model_override
        self._settings_path = settings_path
        self.session = ChatSession(store, settings)
        self.session.on_store_error = self._store_error
        self._banners: dict[str, Banner] = {}
        self._build()
        self.cache_tally = CacheTally()  # answer-cache hits of this session, for the panel
        self.tools_dialog: ToolsDialog | None = None
        self.models_dialog: ModelsDialog | None = None
        self.latency = LatencyController(self)  # the latency panel's dock, switches and compare
        self.latency.stream, self.latency.parallel_tools = settings.stream, settings.parallel_tools
        self.latency.settings_changed()
        self.latency.panel.switches.changed.connect(self._save_switches)
        self.chat_view.compare_requested.connect(self.latency.compare_message)  # "Compare…" on a user message
        self.chat_view.set_compare_available(True)
        self.chat_view.tooltip_provider = self._reply_tooltip  # the configuration each reply ran with
        self.parameters = ParametersController(self, presets)  # the open chat's values, in a tab beside it
        self.typing = TypingPrefill(self)  # the draft is prefilled while it is typed
        self.server_switch = ServerSwitch(self)  # Tools > Server: the model served to other programs
        self.documents = DocumentsController(self, document_library)  # attached files, sources, Documents view
        self.setTabPosition(Qt.DockWidgetArea.RightDockWidgetArea, QTabWidget.TabPosition.North)
        self.tabifyDockWidget(self.latency.dock, self.parameters.dock)
        self.latency.dock.raise_()
        self._build_menus()
        self._build_branching()  # "Branch from here", "Keep last N turns…" (app.window.conversations)
        self.projects = ProjectsController(self)  # projects in the sidebar, their new chats started warm
        self._restore_layout()
        self._build_summary()
        self.apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_scheme_changed)
        bridge.event.connect(self._on_event)
        if store_warning:
            self.show_banner("store-fallback", "warning", store_warning)
        self.parameters.show_chat()  # the next new chat's, until a saved one is opened
        self._load_history()
        self.composer.editor.setFocus()
        self.server_switch.start_saved()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        self.setWindowTitle("Brisk")
        self.resize(1100, 740)
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
        self.splitter = splitter
        sidebar_width, _panel = default_widths(self.width())
        splitter.setSizes([sidebar_width, self.width() - sidebar_width])
        self.setCentralWidget(splitter)
        self.status_area = StatusArea()
        self.statusBar().addWidget(self.status_area, 1)
        self.tools_button = QToolButton()
        self.tools_button.setObjectName("toolsButton")
        self.tools_button.setAutoRaise(True)
        self.tools_button.setToolTip("Tools replies may use, granted folders, MCP servers (Ctrl+T)")
        self.tools_button.clicked.connect(self.open_tools)
        self.statusBar().addPermanentWidget(self.tools_button)
        self._show_tools_count()

        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_markdown)
        self.sidebar.search_changed.connect(self.search)
        self.sidebar.hit_chosen.connect(self._open_hit)
        self.sidebar.settings_requested.connect(self.open_settings)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.copied.connect(
            lambda _id, chars: self.composer.show_hint(f"Copied {chars:,} characters to the clipboard.")
        )
        self.chat_view.edit_requested.connect(self.edit_message)
        self.chat_view.version_requested.connect(self.show_version)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(lambda: self.stop())  # the open chat's reply
        self.composer.queue_cancel_requested.connect(self.cancel_queued)  # take a queued message back

        self.stop_action = self._action("Stop", QKeySequence(Qt.Key.Key_Escape), lambda: self.stop())
        self.stop_action.setEnabled(False)
        self.quit_action = self._action("Quit", QKeySequence("Ctrl+Q"), self.close)  # as the close button does
        self.quit_action.setToolTip("Close Brisk (replies still streaming keep their text)")
        self._action("New chat", QKeySequence.StandardKey.New, self.new_chat)
        self._action("Search", QKeySequence.StandardKey.Find, self.sidebar.search_box.setFocus)
        self._action("Settings", QKeySequence("Ctrl+,"), self.open_settings)
        self._action("Tools", QKeySequence("Ctrl+T"), self.open_tools)
        self._action("About this machine", QKeySequence(ABOUT_SHORTCUT), self.show_about)
        self._action("Server\u2026", QKeySequence("Ctrl+Shift+E"), lambda: self.server_switch.open())
        self.attach_action = self._action("Attach files\u2026", QKeySequence("Ctrl+O"), lambda: self.documents.choose())
        self.attach_action.setToolTip("Attach files to this chat: they are read once and go with every message")
        self.attach_folder_action = self._action(
            "Attach a folder\u2026", QKeySequence("Ctrl+Shift+O"), lambda: self.documents.choose(folder=True)
        )
        self._action("Documents\u2026", QKeySequence("Ctrl+Shift+D"), lambda: self.documents.open_view())
        self._action("Models\u2026", QKeySequence("Ctrl+Shift+M"), self.open_models)

    def _build_menus(self) -> None:
        """Chat, View, Tools and Help menus over the actions (their shortcuts work with the menu bar hidden)."""
        bar = self.menuBar()
        named = {action.text(): action for action in self.actions()}
        files = bar.addMenu("&File")
        for name in ("Attach files\u2026", "Attach a folder\u2026"):
            files.addAction(named[name])
        files.addSeparator()
        files.addAction(self.quit_action)
        chat = bar.addMenu("&Chat")
        for name in ("New chat", "Search", "Stop"):
            chat.addAction(named[name])
        view = bar.addMenu("&View")
        self.panel_action = self._dock_action(
            self.latency.dock, "Latency panel", PANEL_SHORTCUT, "Show or hide the latency panel"
        )
        self.parameters_action = self._dock_action(
            self.parameters.dock,
            "Parameters panel",
            PARAMETERS_SHORTCUT,
            "Show or hide the open chat's system prompt, sampling values and presets",
        )
        view.addAction(self.panel_action)
        view.addAction(self.parameters_action)
        self.reset_layout_action = view.addAction("Reset layout")
        self.reset_layout_action.triggered.connect(self.reset_layout)
        tools = bar.addMenu("&Tools")
        for name in ("Models\u2026", "Settings", "Tools", "Server\u2026", "Documents\u2026"):
            tools.addAction(named[name])
        help_menu = bar.addMenu("&Help")
        help_menu.addAction(named["About this machine"])

    # -- look ----------------------------------------------------------------------------
    def apply_theme(self) -> None:
        """Colour the window by the ``theme`` setting ("system": dark when the system's colour scheme is)."""
        dark = QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
        style.apply(style.theme_for(self.settings.theme, dark), self)
        self.chat_view.chat_model.restyle_all()  # replies render again with the theme's colours
        self.chat_view.viewport().update()
        panel = self.latency.panel
        for chart in (panel.waterfall, panel.tokens, panel.history_chart):
            chart_theme(chart)

    def _system_scheme_changed(self, _scheme: object) -> None:
        if self.settings.theme == "system":
            self.apply_theme()

    # -- layout --------------------------------------------------------------------------
    def _build_summary(self) -> None:
        """The latency panel in one line at the foot of the window while the panel is not in view; a click opens it."""
        summary = QToolButton()
        summary.setObjectName("latencySummary")
        summary.setAutoRaise(True)
        summary.setText(self.latency.panel.summary)
        summary.setToolTip(f"The last reply's latency; click to open the latency panel ({PANEL_SHORTCUT})")
        summary.clicked.connect(lambda: self.panel_action.isChecked() or self.panel_action.trigger())
        self.latency.panel.summary_changed.connect(summary.setText)
        self.statusBar().insertPermanentWidget(1, summary)  # index 0 is the status area, a normal widget
        self.panel_action.toggled.connect(lambda shown: summary.setVisible(not shown))
        summary.setVisible(not self.panel_action.isChecked())
        self.latency_summary = summary

    def reset_layout(self) -> None:
        """The default proportions: sidebar, chat at least CHAT_SHARE of the width, the panel docked right."""
        dock, parameters = self.latency.dock, self.parameters.dock
        for one in (dock, parameters):
            if one.isFloating():
                one.setFloating(False)
            self.removeDockWidget(one)
        for one in (dock, parameters):  # added back, not only tabified: Qt, not Python, owns each again
            self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, one)
        self.tabifyDockWidget(dock, parameters)  # one column on the right, two tabs
        sidebar, panel = default_widths(self.width())
        if panel is None:
            dock.hide()
            parameters.hide()
            self.splitter.setSizes([sidebar, self.width() - sidebar])
            return
        dock.show()
        parameters.show()
        dock.raise_()
        self.resizeDocks([dock], [panel], Qt.Orientation.Horizontal)
        self.splitter.setSizes([sidebar, self.width() - sidebar - panel])

    def _restore_layout(self) -> None:
        saved = self.layout_file.load() if self.layout_file is not None else None
        if (
            saved is not None
            and self.restoreGeometry(saved.geometry)
            and self.restoreState(saved.state, LAYOUT_VERSION)
        ):
            return
        self.reset_layout()

    def save_layout(self) -> None:
        if self.layout_file is not None:
            self.layout_file.save(bytes(self.saveGeometry().data()), bytes(self.saveState(LAYOUT_VERSION).data()))

    def _dock_action(self, dock: QDockWidget, text: str, shortcut: str, tip: str) -> QAction:
        """A View menu entry for ``dock``: shows it and brings its tab to the front unless it is in view, else
        closes it; checked while it is in view (a tab behind another is not)."""
        action = QAction(text, self)
        action.setCheckable(True)
        action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(f"{tip} ({shortcut})")

        def toggle(show: bool) -> None:  # the check mark follows visibilityChanged, which tab changes send too
            if show:
                dock.show()
                dock.raise_()
            else:
                dock.close()

        action.triggered.connect(toggle)
        dock.visibilityChanged.connect(action.setChecked)
        self.addAction(action)
        return action

    def _action(self, text: str, shortcut: QKeySequence | QKeySequence.StandardKey, slot: object) -> QAction:
        action = QAction(text, self)
        action.setShortcut(shortcut)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def add_panel(
        self, title: str, widget: QWidget, area: Qt.DockWidgetArea = Qt.DockWidgetArea.RightDockWidgetArea
    ) -> QDockWidget:
        """Show ``widget`` in a dock beside the chat (the latency panel); the user can move or close it."""
        dock = QDockWidget(title, self)
        dock.setObjectName(f"panel_{title}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

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
        self._load_began, self._usable_s = time.monotonic(), None
        self.composer.set_ready(False, LOADING_TIP)
        self.hide_banner("load")
        self.hide_banner("draft")
        choice = engine_choice(self.settings, self._model_override)  # the local model or a saved server
        self.server_switch.loading()
        self.bridge.use_engine(choice.key, choice.factory)
        self.bridge.load(choice.spec)

    def _on_event(self, event: object) -> None:
        if isinstance(event, ServedReply):  # another program's request, answered by the server
            self.server_switch.on_event(event)
            return
        self.latency.on_event(event)
        if isinstance(event, LoadProgress):
            self.status_area.loading(event.fraction, event.message)
        elif isinstance(event, Loaded):
            self.model_ready = True
            self.loaded = event
            if self._usable_s is None:  # the load time said is the time to a usable chat, engine start included
                self._usable_s = time.monotonic() - self._load_began
            self.status_area.loaded(event, self._usable_s)
            self.show_context()
            self.composer.set_ready(True)
            self.hide_banner("load")
            if self.about is not None:
                self.about.set_loaded(event)
            self.server_switch.on_event(event)
            self.documents.model_loaded(event)  # the chips' token counts in this model's tokenizer
            self.parameters.panel.set_thinking_switch(bool(event.info.thinking_switch))  # the template has one
            self._seed_answers()
        elif isinstance(event, DraftPrefill):
            self.typing.on_event(event)
        elif isinstance(event, Tuning):
            self.status_area.tuning(event.message, event.done)
        elif isinstance(event, Warning) and event.kind == "draft":
            self.show_banner(
                "draft",
                "warning",
                f"{event.message} Replies use the main model alone.",
                "Open Settings\u2026",
                self.open_settings,
            )
        elif isinstance(event, Warning) and event.kind == "tools":
            self.show_banner("tools", "warning", event.message, "Tools\u2026", self.open_tools)
        elif isinstance(event, Warning):  # every other kind ("cache", "engine", "settings"...): said, not dropped
            self.show_banner(f"warning-{event.kind}", "warning", warning_text(event))
        elif isinstance(event, LoadFailed):
            self.model_ready = False
            self.loaded = None
            if self.about is not None:
                self.about.set_loaded(None)
            self.server_switch.on_event(event)
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
            pairs = answer_pairs(self.store)
        except StoreError as exc:
            self._store_error(exc)
            return
        self.bridge.seed_answers(pairs)

    # -- settings ---------------------------------------------------------------------------------
    def show_about(self) -> AboutDialog:
        """Open (or raise) the "About this machine" window; it does not block."""
        if self.about is None:
            self.about = AboutDialog(self.loaded, self, report=self.bridge.machine_report)
        self.about.show()
        self.about.raise_()
        self.about.activateWindow()
        return self.about

    def open_settings(self) -> None:
        overflow = self.session.overflow()  # the open chat's policy: Settings' "This chat"
        dialog = SettingsDialog(
            self.settings, self, loaded=self.loaded, report=self.bridge.machine_report, overflow=overflow
        )
        try:
            if dialog.exec() == QDialog.DialogCode.Accepted:
                self.apply_settings(dialog.result_settings())
                self.set_overflow(dialog.result_overflow())
        finally:
            dialog.deleteLater()  # not kept hidden under the window, one more each time Settings opens

    def open_models(self) -> ModelsDialog:
        """Open (or raise) the Models view; Load, Use as draft and Add folder apply through :meth:`apply_settings`."""
        if self.models_dialog is None:
            dialog = ModelsDialog(self.settings.model, self.settings.model_folders, self)
            dialog.load_requested.connect(
                lambda path: self.apply_settings(dataclasses.replace(self.settings, model=path, engine=LOCAL))
            )
            dialog.draft_requested.connect(
                lambda path: self.apply_settings(dataclasses.replace(self.settings, draft_model=path))
            )
            dialog.folders_changed.connect(
                lambda folders: self.apply_settings(dataclasses.replace(self.settings, model_folders=list(folders)))
            )
            self.models_dialog = dialog
        self.models_dialog.show()
        self.models_dialog.raise_()
        self.models_dialog.activateWindow()
        return self.models_dialog

    def open_tools(self) -> ToolsDialog:
        """Open the Tools dialog (window-modal, not blocking); Save applies it through :meth:`apply_tools`."""
        if self.tools_dialog is not None:
            self.tools_dialog.close()
        dialog = ToolsDialog(self.settings, self)
        dialog.accepted.connect(lambda: self.apply_tools(dialog.result_settings()))
        self.tools_dialog = dialog
        dialog.open()
        return dialog

    def apply_tools(self, new: Settings) -> None:
        """Save tool settings; the engine gets folder/fetch/server changes now if it can, else at the next start."""
        changed = backend_changes(self.settings, new)
        self.apply_settings(new)
        apply = getattr(self.bridge, "set_tool_settings", None)
        if changed and not (callable(apply) and apply(tool_settings(new))):
            self.show_banner(
                "tools-restart",
                "info",
                "Folder, fetch and MCP server changes apply when Brisk next starts; "
                "the tools you enabled apply from the next message.",
            )

    def _show_tools_count(self) -> None:
        count = len(enabled_tools(self.settings))
        self.tools_button.setText(f"Tools: {count} on" if count else "Tools: off")

    def _save_switches(self, config: object) -> None:
        """Keep the panel's streaming and parallel-tools switches in Settings (the others already are)."""
        stream, parallel = getattr(config, "stream", True), getattr(config, "parallel_tools", True)
        if (stream, parallel) != (self.settings.stream, self.settings.parallel_tools):
            self.apply_settings(dataclasses.replace(self.settings, stream=stream, parallel_tools=parallel))

    def apply_settings(self, new: Settings) -> None:
        old = self.settings
        self.settings = new
        self.session.settings = new
        self.chat_view.colour_drafts = new.colour_draft_tokens
        self._show_tools_count()
        try:
            new.save(self._settings_path)
        except OSError as exc:
            self.show_banner("settings", "error", f"Settings could not be saved ({exc}); they apply until you quit.")
        if new.system_prompt != old.system_prompt and self.session.conversation_id is not None:
            try:
                self.store.set_system_prompt(self.session.conversation_id, new.system_prompt)
            except StoreError as exc:
                self._store_error(exc)
        self.parameters.show_chat()  # the defaults a chat follows may have changed
        if new.theme != old.theme:
            self.apply_theme()
        if new.prefix_cache_mb != old.prefix_cache_mb:
            self.bridge.set_prefix_budget(new.prefix_cache_mb << 20)
        self.latency.settings_changed()
        self.server_switch.settings_changed()
        self.documents.settings_changed()  # a remote engine reads no documents: the paperclip says so
        engine_changed = engine_choice(new).key != self.bridge.engine_key  # another engine, server or key
        if engine_changed:
            self.stop_all()  # the old engine goes: the replies streaming there keep their text
        if needs_reload(old, new) or engine_changed:
            if new.model != old.model:
                self._model_override = None
            self.load_model()

    def _reply_tooltip(self, message_id: int) -> str:
        """A reply's tooltip: the configuration it ran with (live, or from its stored metrics)."""
        item = self.chat_view.chat_model.item(message_id)
        if item is None or item.role != "assistant":
            return ""
        if item.reply is not None:
            return config_tooltip(item.reply.config)
        metrics = next((m.metrics for m in self._messages() if m.id == message_id), None)
        return config_tooltip(metrics if isinstance(metrics, Mapping) else None)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        self.stop_all()  # replies still streaming, in any chat, keep their text, saved as "cancelled"
        self.documents.shutdown()  # files still being read stop (nothing half-indexed is kept)
        self.save_layout()
        super().closeEvent(event)
