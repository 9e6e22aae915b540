"""The Server dialog (Tools > Server): the loaded model served to other programs, like LM Studio's developer tab.

A switch turns the OpenAI-compatible server on and off (``Settings.serve``,
kept for the next start) on 127.0.0.1 and a port (``Settings.serve_port``);
the address with a Copy button and a ``curl`` line to try it; the requests in
flight and a log of the last ones (client, endpoint, how it ended, tokens,
TTFT), refreshed twice a second while the dialog is open.  A port that cannot
be used says why in red and leaves the switch off.  The window does the
starting and stopping (``toggled``); the dialog only shows what it is told
(:meth:`show_state`) and what the server's log holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.views.style import current

COLUMNS = ("Time", "Client", "Endpoint", "Result", "Tokens (cached)", "TTFT")
REFRESH_MS = 500


class ServerDialog(QDialog):
    toggled = Signal(bool, int)  # on/off, port: the window starts or stops the server

    def __init__(
        self, port: int, snapshot: Callable[[], Any], model: Callable[[], str], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Server")
        self.setMinimumSize(640, 420)
        self._snapshot = snapshot  # () -> (in flight, recent, served) or None when no server was made
        self._model = model  # () -> the id clients send for the loaded model ("" while none is loaded)
        self._url = ""
        layout = QVBoxLayout(self)
        intro = QLabel(
            "Let other programs (editor plug-ins, scripts, agents, Open WebUI) use the model loaded here, "
            "through the OpenAI API. The window and the server share one engine and its caches; "
            "the window's own messages go first."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        row = QHBoxLayout()
        self.switch = QCheckBox("Serve on 127.0.0.1, port")
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(port)
        self.port.setAccessibleName("Port")
        row.addWidget(self.switch)
        row.addWidget(self.port)
        row.addStretch(1)
        layout.addLayout(row)
        address = QHBoxLayout()
        self.address = QLabel("Off")
        self.address.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy = QPushButton("Copy address")
        self.copy.clicked.connect(self._copy)
        address.addWidget(self.address, 1)
        address.addWidget(self.copy)
        layout.addLayout(address)
        self.example = QLabel()
        self.example.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.example.setWordWrap(True)
        layout.addWidget(self.example)
        self.status = QLabel()
        layout.addWidget(self.status)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        for column in range(len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        layout.addWidget(self.table, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.switch.toggled.connect(lambda on: self.toggled.emit(on, self.port.value()))
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        self.show_state("", "")

    def show_state(self, url: str, error: str) -> None:
        """The server listens at ``url`` ("" when off); ``error`` says why it could not start."""
        self._url = url
        self.switch.blockSignals(True)
        self.switch.setChecked(bool(url))
        self.switch.blockSignals(False)
        self.port.setEnabled(not url)
        self.copy.setEnabled(bool(url))
        self.address.setText(f"Listening at <b>{url}</b>" if url else "Off")
        self._show_example()
        if error:
            self.status.setStyleSheet(f"color: {current().error}")
            self.status.setText(error)
        else:
            self.status.setStyleSheet("")
        self.refresh()

    def _show_example(self) -> None:
        url, model = self._url, self._model() or "none loaded yet"
        self.example.setText(
            f"Model id: {model} (any API key). Try it: curl {url}/chat/completions "
            f"-H 'Content-Type: application/json' "
            f'-d \'{{"messages": [{{"role": "user", "content": "Hello"}}]}}\''
            if url
            else "Programs reach it at http://127.0.0.1:PORT/v1 with any API key."
        )

    def refresh(self) -> None:
        self._show_example()
        found = self._snapshot()
        if found is None:
            running, recent, served = [], [], 0
        else:
            running, recent, served = found
        if self._url and not self.status.styleSheet():
            self.status.setText(f"{len(running)} in flight · {served} served since it started")
        rows = [*running, *recent]
        self.table.setRowCount(len(rows))
        for i, entry in enumerate(rows):
            ttft = f"{entry.ttft_s:.3f} s" if entry.ttft_s is not None else "–"
            result = entry.status if not entry.finish else f"{entry.status} ({entry.finish})"
            if entry.answer_cache:
                result += f" · answer cache ({entry.answer_cache})"
            if entry.message:
                result = f"{entry.status}: {entry.message}"
            tokens = f"{entry.prompt_tokens}+{entry.completion_tokens} ({entry.cached_tokens})"
            cells = (time.strftime("%H:%M:%S", time.localtime(entry.started)), entry.client, entry.endpoint)
            for column, text in enumerate((*cells, result, tokens, ttft)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(i, column, item)

    def _copy(self) -> None:
        if self._url:
            QGuiApplication.clipboard().setText(self._url)
            self.copy.setText("Copied")
            QTimer.singleShot(1500, lambda: self.copy.setText("Copy address"))
