"""A project's dialog: "New project…" (name, system prompt) and its settings (name, prompt, values, documents).

:class:`ProjectDialog` holds no store: the owner (``app.window.projects``)
fills it and reads back :meth:`~ProjectDialog.name`,
:meth:`~ProjectDialog.system_prompt`, :meth:`~ProjectDialog.params` (only the
values set for the project, as a chat keeps its own: ``engine.storage.params``)
and :meth:`~ProjectDialog.documents`.  New chats in the project start with
these; chats already in it keep their own.  Documents are attached to a chat
first (the paperclip) and taken into the project from the open chat ("Use the
open chat's documents"), so they are in the document index already.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

DEFAULT = "default"  # a value box at its lowest shows this: the value is not set for the project


class ProjectDialog(QDialog):
    """``settings=False``: the small "New project…" form (name, system prompt); ``True``: all of it."""

    def __init__(
        self,
        parent: QWidget | None,
        *,
        name: str = "",
        system_prompt: str = "",
        params: dict[str, Any] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_documents: list[dict[str, Any]] | None = None,
        settings: bool = False,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Project settings" if settings else "New project")
        self._params = dict(params or {})
        self._documents = [dict(d) for d in documents or []]
        self._chat_documents = [dict(d) for d in chat_documents or []]
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.name_edit = QLineEdit(name)
        self.name_edit.setPlaceholderText("Project name")
        form.addRow("Name", self.name_edit)
        self.prompt_edit = QPlainTextEdit(system_prompt)
        self.prompt_edit.setPlaceholderText("The system prompt every new chat in this project starts with")
        form.addRow("System prompt", self.prompt_edit)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(-0.05, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setSpecialValueText(DEFAULT)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(-0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setSpecialValueText(DEFAULT)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(0, 1_000_000)
        self.max_tokens.setSpecialValueText(DEFAULT)
        self.docs_label = QLabel()
        self.docs_label.setWordWrap(True)
        self.temperature.setValue(float(self._params.get("temperature", -0.05)))
        self.top_p.setValue(float(self._params.get("top_p", -0.05)))
        self.max_tokens.setValue(int(self._params.get("max_tokens", 0)))
        if settings:
            form.addRow("Temperature", self.temperature)
            form.addRow("Top p", self.top_p)
            form.addRow("Reply length (tokens)", self.max_tokens)
            docs_row = QWidget()
            docs_layout = QHBoxLayout(docs_row)
            docs_layout.setContentsMargins(0, 0, 0, 0)
            self.take_docs = QPushButton("Use the open chat's documents")
            self.take_docs.setToolTip("Attach files to a chat with the paperclip, then take them into the project here")
            self.take_docs.setEnabled(bool(self._chat_documents))
            self.take_docs.clicked.connect(self._take_documents)
            self.clear_docs = QPushButton("Clear")
            self.clear_docs.clicked.connect(self._clear_documents)
            docs_layout.addWidget(self.take_docs)
            docs_layout.addWidget(self.clear_docs)
            form.addRow("Documents", self.docs_label)
            form.addRow("", docs_row)
            self._show_documents()
        layout.addLayout(form)
        note = QLabel("New chats in this project start with these; chats already in it keep their own.")
        note.setObjectName("hint")
        note.setWordWrap(True)
        layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.name_edit.textChanged.connect(lambda text: self.ok_button.setEnabled(bool(text.strip())))
        self.ok_button.setEnabled(bool(name.strip()))
        layout.addWidget(buttons)
        self.resize(460, 420 if settings else 300)

    def name(self) -> str:
        return " ".join(self.name_edit.text().split())

    def system_prompt(self) -> str:
        return self.prompt_edit.toPlainText()

    def params(self) -> dict[str, Any]:
        """The values set for the project: those the dialog shows, kept or changed; the rest as they were."""
        own = {k: v for k, v in self._params.items() if k not in ("temperature", "top_p", "max_tokens")}
        if self.temperature.value() >= 0:
            own["temperature"] = round(self.temperature.value(), 4)
        if self.top_p.value() > 0:
            own["top_p"] = round(self.top_p.value(), 4)
        if self.max_tokens.value() > 0:
            own["max_tokens"] = self.max_tokens.value()
        return own

    def documents(self) -> list[dict[str, Any]]:
        return [dict(d) for d in self._documents]

    def _take_documents(self) -> None:
        known = {d["id"] for d in self._documents}
        self._documents += [d for d in self._chat_documents if d["id"] not in known]
        self._show_documents()

    def _clear_documents(self) -> None:
        self._documents = []
        self._show_documents()

    def _show_documents(self) -> None:
        names = ", ".join(str(d.get("name", "")) for d in self._documents)
        self.docs_label.setText(names or "None. New chats in the project start with these attached.")
