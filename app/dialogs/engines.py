"""The Settings dialog's "Engine" group: the local model, or one of several saved servers.

``EngineSection(settings)`` edits copies of ``Settings.engine`` and
``Settings.servers``; :meth:`EngineSection.values` returns both for
``dataclasses.replace``.  The engine list holds "This computer" and every
saved server; choosing a server shows its fields: a name, the base URL of an
OpenAI-compatible server (llama.cpp, vLLM, SGLang, Ollama, TGI), the model
(picked from the server's ``/v1/models``, asked on a worker thread by
"Refresh", or typed; empty means the server's first) and an API key.  "Add
server" and "Remove" edit the list (a removed server's key is deleted too).

The API key never goes into ``settings.json``: :meth:`EngineSection.commit`
(called when the dialog is accepted) checks the servers (one message per
problem, shown in the group) and hands each key typed here to
:func:`app.engines.save_key`, which keeps it in the system keyring, or, where
there is none, for this session only, and the group says so.  An empty key
field leaves the saved key as it is; "Forget key" deletes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import engines
from app.background import in_background
from app.views.controls import form_row
from engine.storage import Settings
from engine.storage.settings import LOCAL

LOCAL_TEXT = "This computer (the local model)"
NEW_URL = "http://127.0.0.1:8080/v1"
URL_TIP = "The base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1 (llama.cpp) or :8000/v1 (vLLM)"
MODEL_TIP = "The server's model id; Refresh asks the server for its list. Empty: the first one it lists."
KEY_TIP = "Sent only to this server. Empty keeps the saved key, if any."
KEY_KEPT = "Keys are kept in the system keyring, never in the settings file."
KEY_SESSION = (
    "No system keyring was found: a key typed here lasts this session only and is asked again next time "
    "(it is never written to the settings file)."
)
CHECKING_KEYRING = "Checking for a system keyring\u2026"


class EngineSection(QGroupBox):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__("Engine", parent)
        self.servers: list[dict[str, str]] = [dict(s) for s in settings.servers]
        self.keys: dict[int, str] = {}  # server index -> the key typed for it ("" with forgotten: delete)
        self.forgotten: set[int] = set()
        self.removed_urls: list[str] = []  # servers removed here: their keys are deleted on commit
        self.persistent: bool | None = None  # keys.persistent(), once the check answered
        self.models_ready = False  # the last Refresh answered (tests wait on it)
        self._filling = False
        outer = QVBoxLayout(self)

        row = QHBoxLayout()
        self.engine_combo = QComboBox()
        self.engine_combo.setToolTip("Where replies are generated: this computer, or a server you saved")
        row.addWidget(self.engine_combo, 1)
        self.add_button = QPushButton("Add server\u2026")
        self.add_button.clicked.connect(self.add_server)
        row.addWidget(self.add_button)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Forget this server (and its key)")
        self.remove_button.clicked.connect(self.remove_server)
        row.addWidget(self.remove_button)
        outer.addLayout(row)

        self.server_box = QWidget()
        form = QFormLayout(self.server_box)
        form.setContentsMargins(0, 0, 0, 0)
        self.name_edit = QLineEdit()
        form.addRow("Name", self.name_edit)
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText(NEW_URL)
        self.url_edit.setToolTip(URL_TIP)
        form.addRow("Base URL", self.url_edit)
        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.model_combo.setToolTip(MODEL_TIP)
        line = self.model_combo.lineEdit()
        if line is not None:
            line.setPlaceholderText("The server's first model")
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setToolTip("Ask the server which models it serves (/v1/models)")
        self.refresh_button.clicked.connect(self.refresh_models)
        form_row(form, "Model", self.model_combo, self.refresh_button)
        self.models_label = QLabel()
        self.models_label.setObjectName("hint")
        self.models_label.setWordWrap(True)
        self.models_label.hide()
        form.addRow(self.models_label)
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("Unchanged")
        self.key_edit.setToolTip(KEY_TIP)
        self.forget_button = QPushButton("Forget key")
        self.forget_button.clicked.connect(self.forget_key)
        form_row(form, "API key", self.key_edit, self.forget_button)
        self.key_note = QLabel(CHECKING_KEYRING)
        self.key_note.setObjectName("hint")
        self.key_note.setWordWrap(True)
        form.addRow(self.key_note)
        outer.addWidget(self.server_box)

        self.problem_label = QLabel()
        self.problem_label.setObjectName("notice")
        self.problem_label.setWordWrap(True)
        self.problem_label.hide()
        outer.addWidget(self.problem_label)

        self._fill_combo(settings.engine)
        self.engine_combo.currentIndexChanged.connect(self._show_selected)
        self.name_edit.textEdited.connect(self._name_edited)
        self.url_edit.textEdited.connect(lambda text: self._edited("base_url", text.strip()))
        self.model_combo.currentTextChanged.connect(lambda text: self._edited("model", text.strip()))
        self.key_edit.textEdited.connect(self._key_edited)
        self._show_selected()
        in_background(self, engines.keys_persist, EngineSection._keyring_checked)

    # -- what the dialog reads ------------------------------------------------------------------
    def current(self) -> int:
        """The index of the chosen server in :attr:`servers`, -1 for the local model."""
        data = self.engine_combo.currentData()
        return data if isinstance(data, int) else -1

    def values(self) -> dict[str, Any]:
        index = self.current()
        return {
            "engine": self.servers[index]["name"] if index >= 0 else LOCAL,
            "servers": [dict(s) for s in self.servers],
        }

    def problems(self) -> list[str]:
        """What must change before the servers can be saved (empty: nothing)."""
        _, found = dataclasses.replace(Settings(), **self.values()).checked()
        return [problem.rsplit("; using", 1)[0] for problem in found]

    def commit(self) -> bool:
        """Check the servers and keep the keys typed for them; False (the reason shown) when they cannot be saved."""
        problems = self.problems()
        if not problems:
            kept = {server["base_url"] for server in self.servers}
            changes = [
                (s["base_url"], self.keys.get(i, ""))
                for i, s in enumerate(self.servers)
                if self.keys.get(i) or i in self.forgotten
            ]
            changes += [(url, "") for url in self.removed_urls if url not in kept]  # no server uses that key now
            for url, key in changes:
                try:
                    engines.save_key(url, key)
                except Exception as exc:  # a URL the server check refuses (a bad port): say so, keep the dialog
                    problems.append(str(exc).rstrip("."))
        self.problem_label.setText("\n".join(f"Cannot save: {p}." for p in problems))
        self.problem_label.setVisible(bool(problems))
        return not problems

    # -- editing ---------------------------------------------------------------------------------
    def add_server(self) -> int:
        """Add a server with a fresh name and select it; returns its index."""
        taken = {s["name"] for s in self.servers}
        n = len(self.servers) + 1
        while f"Server {n}" in taken:
            n += 1
        self.servers.append({"name": f"Server {n}", "base_url": NEW_URL, "model": ""})
        self._fill_combo(self.servers[-1]["name"])
        self._show_selected()
        self.url_edit.setFocus()
        return len(self.servers) - 1

    def remove_server(self) -> None:
        index = self.current()
        if index < 0:
            return
        removed = self.servers.pop(index)
        self.keys = {i - (i > index): k for i, k in self.keys.items() if i != index}
        self.forgotten = {i - (i > index) for i in self.forgotten if i != index}
        self.removed_urls.append(removed["base_url"])
        self._fill_combo(LOCAL)
        self._show_selected()

    def forget_key(self) -> None:
        index = self.current()
        if index >= 0:
            self.keys.pop(index, None)
            self.forgotten.add(index)
            self.key_edit.clear()
            self.key_edit.setPlaceholderText("Forgotten when you save")

    def refresh_models(self) -> None:
        """Ask the server for its models on a worker thread; the list fills when it answers."""
        index = self.current()
        if index < 0:
            return
        url = self.servers[index]["base_url"]
        typed = self.keys.get(index, "")
        forgotten = index in self.forgotten
        self.models_ready = False
        self.refresh_button.setEnabled(False)
        self._say_models(f"Asking {url} for its models\u2026", error=False)

        def work() -> list[str]:
            key = typed or ("" if forgotten else engines.load_key(url))
            return engines.list_server_models(url, key)

        in_background(self, work, lambda section, found: section._models_listed(index, url, found))

    # -- internals -------------------------------------------------------------------------------
    def _fill_combo(self, engine: str) -> None:
        self._filling = True
        self.engine_combo.clear()
        self.engine_combo.addItem(LOCAL_TEXT, -1)
        for i, server in enumerate(self.servers):
            self.engine_combo.addItem(f"Server: {server['name']}", i)
        chosen = next((i for i, s in enumerate(self.servers) if s["name"] == engine), -1)
        self.engine_combo.setCurrentIndex(chosen + 1)
        self._filling = False

    def _show_selected(self) -> None:
        if self._filling:
            return
        index = self.current()
        self.server_box.setVisible(index >= 0)
        self.remove_button.setEnabled(index >= 0)
        self.models_label.hide()
        if index < 0:
            return
        server = self.servers[index]
        self._filling = True
        self.name_edit.setText(server["name"])
        self.url_edit.setText(server["base_url"])
        self.model_combo.clear()
        if server["model"]:
            self.model_combo.addItem(server["model"])
        self.model_combo.setEditText(server["model"])
        self.key_edit.setText(self.keys.get(index, ""))
        self.key_edit.setPlaceholderText("Forgotten when you save" if index in self.forgotten else "Unchanged")
        self._filling = False

    def _edited(self, field: str, value: str) -> None:
        index = self.current()
        if index >= 0 and not self._filling:
            self.servers[index][field] = value

    def _name_edited(self, text: str) -> None:
        index = self.current()
        if index < 0:
            return
        self.servers[index]["name"] = text.strip()
        self.engine_combo.setItemText(index + 1, f"Server: {text.strip()}")

    def _key_edited(self, text: str) -> None:
        index = self.current()
        if index >= 0:
            self.keys[index] = text.strip()
            self.forgotten.discard(index)

    def _say_models(self, text: str, *, error: bool) -> None:
        self.models_label.setObjectName("notice" if error else "hint")
        self.models_label.style().unpolish(self.models_label)
        self.models_label.style().polish(self.models_label)
        self.models_label.setText(text)
        self.models_label.show()

    def _models_listed(self, index: int, url: str, found: object) -> None:
        self.refresh_button.setEnabled(True)
        self.models_ready = True
        if self.current() != index or self.servers[index]["base_url"] != url:
            return  # the user moved on: this answer is for another server
        if isinstance(found, Exception):
            self._say_models(f"Could not list the models: {found}", error=True)
            return
        assert isinstance(found, list)
        wanted = self.servers[index]["model"]
        self._filling = True
        self.model_combo.clear()
        self.model_combo.addItems(found)
        self._filling = False
        if wanted:
            self.model_combo.setEditText(wanted)
        elif found:
            self.model_combo.setCurrentIndex(0)
            self.servers[index]["model"] = found[0]
        self._say_models(f"The server lists {len(found)} model{'s' if len(found) != 1 else ''}.", error=False)

    def _keyring_checked(self, found: object) -> None:
        if isinstance(found, Exception):
            found = False
        self.persistent = bool(found)
        self.key_note.setText(KEY_KEPT if self.persistent else KEY_SESSION)
