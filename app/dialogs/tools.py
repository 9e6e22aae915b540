"""The Tools dialog: which tools replies may use, the folders ``files`` may read, fetch, MCP servers.

``ToolsDialog(settings, parent, probe=probe_server)`` edits a copy; after it is
accepted, :meth:`ToolsDialog.result_settings` gives the new
:class:`~engine.storage.Settings` (``tools_enabled``, ``granted_dirs``,
``fetch_allow_private``, ``mcp_servers``; every other field unchanged).
Saving and applying are the window's job.

* Built-in tools: one check box each (``checks[NAME]``); ``fetch`` starts off.
* The loaded model (``loaded``, default the parent window's last ``Loaded``): when its chat template has no
  tool format (``ModelInfo.tool_template`` false), a line says so and ``tool_prompt`` (Brisk's own tool
  prompt in the system message; ``Settings.tool_prompt``, on by default) is offered.
* Granted folders: :meth:`grant` / :meth:`revoke` (the buttons ask for a folder).
* MCP servers: a command line (stdio) or an http(s) URL; :meth:`add_server`
  adds one.  Each server is checked on a worker thread (``probe``: start it,
  list its tools, stop it; :func:`app.state.tools.probe_server`), so the dialog
  never blocks; its row then says ``running · N tools`` or ``failed: why``,
  and its tools appear under it, each with a check box (a new server's tools
  start enabled).  Tools of a server not yet checked keep their saved state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.background import in_background
from app.state.tools import BUILTIN, ServerProbe, probe_server
from app.views.controls import scrolling_page
from app.views.style import current
from engine.api import Loaded
from engine.storage import Settings

Probe = Callable[[str], ServerProbe]
TARGET_ROLE = Qt.ItemDataRole.UserRole + 1
PRIVATE_TIP = "Let fetch reach localhost, 10.x, 192.168.x and other private or link-local addresses"
SERVER_HINT = "A command line, e.g. uvx mcp-server-time, or an http(s) URL"
NO_TOOL_FORMAT = "This model's template has no tool format; Brisk adds its own tool instructions to the system prompt."
NO_TOOL_PROMPT = (
    "This model's template has no tool format, and Brisk's tool prompt is off: the model is not told about "
    "the tools (your /NAME lines still run them)."
)
TOOL_PROMPT_TIP = (
    "Put the enabled tools' schemas and a call format Brisk reads into the system prompt, for a model whose "
    "chat template ignores tools. It lengthens every prompt by the schemas (about 190 tokens for the calculator)."
)


class ToolsDialog(QDialog):
    probed = Signal(object)  # a ServerProbe, after its row was updated (tests wait on it)

    def __init__(
        self,
        settings: Settings,
        parent: QWidget | None = None,
        *,
        probe: Probe | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        super().__init__(parent)
        if loaded is None:
            loaded = getattr(parent, "loaded", None)
        self.setWindowTitle("Tools")
        self.setMinimumWidth(560)
        self._original = settings
        self._probe = probe or probe_server
        self._enabled = set(settings.tools_enabled)
        self.probes: dict[str, ServerProbe] = {}
        self._new_servers: set[str] = set()
        # taller than an 800-pixel screen allows: the groups scroll, none is squeezed
        outer, page, column_of_groups = scrolling_page(self)

        builtin = QGroupBox("Built-in tools")
        column = QVBoxLayout(builtin)
        self.checks: dict[str, QCheckBox] = {}
        for name, description in BUILTIN.items():
            box = QCheckBox(f"{name}: {description}")
            box.setObjectName(f"tool_{name}")
            box.setChecked(name in self._enabled)
            column.addWidget(box)
            self.checks[name] = box
        self.private = QCheckBox("fetch may reach private and local addresses")
        self.private.setToolTip(PRIVATE_TIP)
        self.private.setChecked(settings.fetch_allow_private)
        column.addWidget(self.private)
        self.tool_format = QLabel()  # the loaded model's chat template has no tool format: what Brisk does
        self.tool_format.setObjectName("tool_format")
        self.tool_format.setWordWrap(True)
        self.tool_prompt = QCheckBox("Use Brisk's tool prompt for this model")
        self.tool_prompt.setObjectName("tool_prompt")
        self.tool_prompt.setToolTip(TOOL_PROMPT_TIP)
        self.tool_prompt.setChecked(settings.tool_prompt)
        self.tool_prompt.toggled.connect(self._say_tool_format)
        column.addWidget(self.tool_format)
        column.addWidget(self.tool_prompt)
        info = getattr(loaded, "info", None)
        without = getattr(info, "tool_template", None) is False
        self.tool_format.setVisible(without)
        self.tool_prompt.setVisible(without)
        self._say_tool_format(self.tool_prompt.isChecked())
        hint = QLabel("Type /NAME ARGS in a message to call a tool yourself, e.g. /calculator 2*(3+4).")
        hint.setWordWrap(True)
        hint.setStyleSheet(f"color: {current().muted};")
        column.addWidget(hint)
        column_of_groups.addWidget(builtin)

        folders = QGroupBox("Folders the files tool may read")
        column = QVBoxLayout(folders)
        self.folders = QListWidget()
        self.folders.setMaximumHeight(90)
        self.folders.addItems(settings.granted_dirs)
        column.addWidget(self.folders)
        row = QHBoxLayout()
        grant = QPushButton("Grant a folder\u2026")
        grant.clicked.connect(self._choose_folder)
        revoke = QPushButton("Revoke")
        revoke.clicked.connect(lambda: self.revoke(self._current_folder()))
        row.addWidget(grant)
        row.addWidget(revoke)
        row.addStretch(1)
        column.addLayout(row)
        column_of_groups.addWidget(folders)

        servers = QGroupBox("MCP servers")
        column = QVBoxLayout(servers)
        self.servers = QTreeWidget()
        self.servers.setHeaderLabels(["Server or tool", "State"])
        self.servers.setColumnWidth(0, 300)
        self.servers.setMinimumHeight(140)
        column.addWidget(self.servers)
        row = QHBoxLayout()
        self.server_edit = QLineEdit()
        self.server_edit.setPlaceholderText(SERVER_HINT)
        self.server_edit.returnPressed.connect(self._add_typed)
        add = QPushButton("Add")
        add.clicked.connect(self._add_typed)
        remove = QPushButton("Remove")
        remove.clicked.connect(lambda: self.remove_server(self._current_server()))
        again = QPushButton("Check again")
        again.clicked.connect(lambda: self._check(self._current_server()))
        for widget in (self.server_edit, add, remove, again):
            row.addWidget(widget, 1 if widget is self.server_edit else 0)
        column.addLayout(row)
        column_of_groups.addWidget(servers)

        note = QLabel(
            "Tools you enable apply from the next message. Folders, fetch's addresses and MCP servers "
            "are given to the engine when it starts."
        )
        note.setWordWrap(True)
        note.setStyleSheet(f"color: {current().muted};")
        column_of_groups.addWidget(note)
        self.problem = QLabel()  # why Save did not close the dialog
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet(f"color: {current().error};")
        self.problem.hide()
        outer.addWidget(self.problem)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        outer.addWidget(buttons)
        for target in settings.mcp_servers:
            self._add_row(target)
        # as tall as the groups need at this width (wrapped lines counted) where the screen allows
        width = self.minimumWidth()
        wanted = page.heightForWidth(width - 24) + buttons.sizeHint().height() + 40
        screen = self.screen()
        room = int(screen.availableGeometry().height() * 0.9) if screen is not None else wanted
        self.resize(width, min(wanted, room))

    def _say_tool_format(self, on: bool) -> None:
        self.tool_format.setText(NO_TOOL_FORMAT if on else NO_TOOL_PROMPT)

    # -- folders -----------------------------------------------------------------------------
    def granted(self) -> list[str]:
        return [self.folders.item(i).text() for i in range(self.folders.count())]

    def grant(self, path: str) -> None:
        if path and path not in self.granted():
            self.folders.addItem(path)

    def revoke(self, path: str | None) -> None:
        for i in range(self.folders.count()):
            if self.folders.item(i).text() == path:
                self.folders.takeItem(i)
                return

    def _current_folder(self) -> str | None:
        item = self.folders.currentItem()
        return item.text() if item is not None else None

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Grant a folder to the files tool")
        self.grant(path)

    # -- saving ----------------------------------------------------------------------------------
    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt override)
        """Enter in the server field adds the server (and checks it); it never also saves and closes."""
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and self.focusWidget() is self.server_edit:
            event.accept()
            return
        super().keyPressEvent(event)

    def unsaved_problems(self) -> list[str]:
        """Why the servers added in this dialog cannot be saved yet: still being checked, or failed."""
        problems = []
        for target in self.server_targets():
            if target not in self._new_servers:
                continue  # saved before: its state is said in the list, and removing it is the user's call
            probe = self.probes.get(target)
            if probe is None:
                problems.append(f"{target} is still being checked")
            elif probe.status != "running":
                problems.append(f"{target} did not start ({probe.message})")
        return problems

    def accept(self) -> None:
        """Save, unless a server added here is unchecked or broken (said above the buttons)."""
        problems = self.unsaved_problems()
        if problems:
            self.problem.setText(
                "Not saved: " + "; ".join(problems) + ". Wait for the check, or remove it or Check again."
            )
            self.problem.show()
            return
        self.problem.hide()
        super().accept()

    # -- MCP servers -----------------------------------------------------------------------------
    def server_targets(self) -> list[str]:
        return [str(self.servers.topLevelItem(i).data(0, TARGET_ROLE)) for i in range(self.servers.topLevelItemCount())]

    def add_server(self, target: str) -> bool:
        """Add a server (checked in the background); False when it is empty or already listed."""
        target = target.strip()
        if not target or target in self.server_targets():
            return False
        self._new_servers.add(target)
        self._add_row(target)
        return True

    def remove_server(self, target: str | None) -> None:
        for i in range(self.servers.topLevelItemCount()):
            if self.servers.topLevelItem(i).data(0, TARGET_ROLE) == target:
                self.servers.takeTopLevelItem(i)
                known = self.probes.pop(target, None)
                if known is not None:
                    self._enabled -= {name for name, _ in known.tools}
                return

    def server_state(self, target: str) -> str:
        item = self._row(target)
        return item.text(1) if item is not None else ""

    def _add_typed(self) -> None:
        if self.add_server(self.server_edit.text()):
            self.server_edit.clear()

    def _row(self, target: str | None) -> QTreeWidgetItem | None:
        for i in range(self.servers.topLevelItemCount()):
            item = self.servers.topLevelItem(i)
            if item.data(0, TARGET_ROLE) == target:
                return item
        return None

    def _current_server(self) -> str | None:
        item = self.servers.currentItem()
        while item is not None and item.parent() is not None:
            item = item.parent()
        return None if item is None else str(item.data(0, TARGET_ROLE))

    def _add_row(self, target: str) -> None:
        item = QTreeWidgetItem([target, ""])
        item.setData(0, TARGET_ROLE, target)
        item.setToolTip(0, target)
        self.servers.addTopLevelItem(item)
        self._check(target)

    def _check(self, target: str | None) -> None:
        item = self._row(target)
        if item is None or target is None:
            return
        self._take_checks(item)
        item.takeChildren()
        item.setText(1, "checking\u2026")
        probe = self._probe
        in_background(self, lambda: probe(target), lambda dialog, result: dialog._show_probe(target, result))

    def _show_probe(self, target: str, result: object) -> None:
        if not isinstance(result, ServerProbe):
            result = ServerProbe(target, "failed", f"{type(result).__name__}: {result}")
        item = self._row(target)
        if item is None:
            return  # removed while it was checked
        self.probes[target] = result
        if result.status == "running":
            count = len(result.tools)
            item.setText(1, f"running \u00b7 {count} tool{'s' if count != 1 else ''}")
            item.setToolTip(1, "")
        else:
            item.setText(1, f"failed: {result.message}")
            item.setToolTip(1, result.message)
        new = target in self._new_servers
        for name, description in result.tools:
            child = QTreeWidgetItem([name, ""])
            child.setToolTip(0, description)
            child.setFlags(child.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            on = name in self._enabled or new
            child.setCheckState(0, Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            item.addChild(child)
        item.setExpanded(True)
        self.probed.emit(result)

    def _take_checks(self, item: QTreeWidgetItem) -> None:
        """Remember the check boxes under a server row before they are rebuilt."""
        for i in range(item.childCount()):
            child = item.child(i)
            if child.checkState(0) == Qt.CheckState.Checked:
                self._enabled.add(child.text(0))
            else:
                self._enabled.discard(child.text(0))

    def set_tool_enabled(self, name: str, on: bool) -> bool:
        """Tick or untick one tool, built in or from a checked server; False when it is not listed."""
        if name in self.checks:
            self.checks[name].setChecked(on)
            return True
        for i in range(self.servers.topLevelItemCount()):
            server = self.servers.topLevelItem(i)
            for j in range(server.childCount()):
                if server.child(j).text(0) == name:
                    server.child(j).setCheckState(0, Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
                    return True
        return False

    # -- the result ---------------------------------------------------------------------------------
    def enabled(self) -> list[str]:
        """The enabled tool names: built-in ticks, checked servers' ticks, unchecked servers' saved names."""
        names = [name for name, box in self.checks.items() if box.isChecked()]
        listed: set[str] = set()
        for i in range(self.servers.topLevelItemCount()):
            server = self.servers.topLevelItem(i)
            for j in range(server.childCount()):
                child = server.child(j)
                listed.add(child.text(0))
                if child.checkState(0) == Qt.CheckState.Checked:
                    names.append(child.text(0))
        checked_all = all(t in self.probes for t in self.server_targets())
        kept = [] if checked_all else [n for n in self._original.tools_enabled if n not in BUILTIN and n not in listed]
        return list(dict.fromkeys(names + kept))

    def result_settings(self) -> Settings:
        return dataclasses.replace(
            self._original,
            tools_enabled=self.enabled(),
            tool_prompt=self.tool_prompt.isChecked(),
            granted_dirs=self.granted(),
            fetch_allow_private=self.private.isChecked(),
            mcp_servers=self.server_targets(),
        )
