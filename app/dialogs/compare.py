"""A/B compare in the window: replay one user message under several configurations, side by side.

``CompareDialog(bridge, spec, messages, base)`` lists configurations (two to
start: ``base`` and one with another speculative source), each a row of
lists (prefix cache, speculative source, quantization, streaming); "Run"
replays ``messages`` greedily with the same seed under each, warm or cold, with
:func:`engine.compare.compare` on a worker thread, so the window never waits.
The engine is the bridge's own backend (no second model in memory):
:func:`bridge_client` wraps it in an :class:`~engine.client.Client` whose
queue is fed straight from the bridge's signal on the backend's thread.  A
quantization mode other than the loaded one reloads the model, and the loaded
mode is restored at the end.  The table (``engine.compare.HEADER``), two bar
charts (TTFT and tokens/s) and the outputs' identity to the first
configuration's come back on the GUI thread; ``finished(list | Exception)``
fires then.  "Export CSV…" and "Save charts as PNG…" write the results.

:func:`replay_messages` is the request a user message made: the system prompt
and the history up to and including that message.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
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

from app.background import in_background
from app.bridge import EngineBridge
from app.panels.charts import BarsChart
from app.state.config import ReplyConfig
from app.state.session import chat_messages
from engine.api import ModelSpec
from engine.client import Client, LoadError
from engine.compare import HEADER, SWITCHES, Config, Result, compare, rows
from engine.storage import Store

COLUMNS = ("prefix_cache", "speculative", "quant", "stream", "typing")
TIMEOUT_S = 600.0


def replay_messages(store: Store, conversation_id: str, message_id: int) -> list[dict[str, str]]:
    """The messages the request for user message ``message_id`` carried (system prompt first)."""
    conversation = store.get_conversation(conversation_id)
    history = store.messages(conversation_id)
    found = next((i for i, message in enumerate(history) if message.id == message_id), None)
    if found is None:
        raise ValueError(f"Message {message_id} is not in this conversation.")
    if history[found].role != "user":
        raise ValueError("Only your own messages can be compared.")
    return chat_messages(conversation.system_prompt, history[: found + 1])


def bridge_client(bridge: EngineBridge) -> tuple[Client, object]:
    """A Client over the bridge's running backend, and the sink to disconnect when done."""
    backend = bridge.backend
    if backend is None:
        raise ValueError("The engine is not running yet. Wait for the model to load, then compare.")
    client = Client(lambda _sink: backend, timeout=TIMEOUT_S)
    sink = client.events.put
    bridge.event.connect(sink, Qt.ConnectionType.DirectConnection)
    return client, sink


def second_config(base: Config) -> Config:
    """A sensible other side for an A/B: speculative decoding on if it is off, else off."""
    return dataclasses.replace(base, speculative="lookup" if base.speculative == "off" else "off")


class CompareDialog(QDialog):
    finished_run = Signal(object)  # list[Result] | Exception
    progress = Signal(str)

    def __init__(
        self,
        bridge: EngineBridge,
        spec: ModelSpec,
        messages: Sequence[dict[str, str]],
        base: ReplyConfig,
        parent: QWidget | None = None,
        in_use: str = "",
        documents: Sequence[str] = (),
    ) -> None:
        super().__init__(parent)
        self.in_use = in_use  # the mode the loaded model runs when spec.quant is "auto" (no reload for it)
        self.documents = tuple(documents)  # the chat's attached documents: every replay reads them
        self.setWindowTitle("Compare configurations")
        self.setObjectName("compareDialog")
        self.resize(900, 640)
        self.bridge, self.spec, self.messages = bridge, spec, list(messages)
        self.results: list[Result] = []
        self.running = False
        layout = QVBoxLayout(self)
        question = next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")
        shown = question if len(question) < 160 else question[:157] + "\u2026"
        prompt = QLabel(f"Replaying: <b>{_escape(shown)}</b>")
        prompt.setWordWrap(True)
        layout.addWidget(prompt)

        self.configs = QTableWidget(0, len(COLUMNS))
        self.configs.setHorizontalHeaderLabels(
            ["Prefix cache", "Speculative", "Quantization", "Streaming", "Prefill while typing"]
        )
        self.configs.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.configs.setMaximumHeight(150)
        layout.addWidget(self.configs)
        first = base.compare_config()
        self.add_config(first)
        self.add_config(second_config(first))

        options = QHBoxLayout()
        add = QPushButton("Add configuration")
        add.clicked.connect(lambda: self.add_config(self.config_at(self.configs.rowCount() - 1)))
        remove = QPushButton("Remove last")
        remove.clicked.connect(self.remove_last)
        self.cold = QCheckBox("Cold (empty the prompt cache before each run)")
        self.runs = QSpinBox()
        self.runs.setRange(1, 20)
        self.runs.setValue(1)
        self.runs.setPrefix("runs: ")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(64)
        self.max_tokens.setPrefix("max tokens: ")
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run)
        for widget in (add, remove, self.cold, self.runs, self.max_tokens):
            options.addWidget(widget)
        options.addStretch(1)
        options.addWidget(self.run_button)
        layout.addLayout(options)
        self.status = QLabel("Greedy, same seed; choose the configurations and press Run.")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)

        self.table = QTableWidget(0, len(HEADER))
        self.table.setHorizontalHeaderLabels(list(HEADER))
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        layout.addWidget(self.table, 1)
        self.charts = QWidget()
        charts = QHBoxLayout(self.charts)
        charts.setContentsMargins(0, 0, 0, 0)
        self.ttft_chart = BarsChart("TTFT (s)")
        self.speed_chart = BarsChart("Tokens/s")
        charts.addWidget(self.ttft_chart)
        charts.addWidget(self.speed_chart)
        layout.addWidget(self.charts, 1)
        buttons = QHBoxLayout()
        self.csv_button = QPushButton("Export CSV\u2026")
        self.csv_button.clicked.connect(self._ask_csv)
        self.png_button = QPushButton("Save charts as PNG\u2026")
        self.png_button.clicked.connect(self._ask_png)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        for button in (self.csv_button, self.png_button):
            button.setEnabled(False)
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(close)
        layout.addLayout(buttons)
        self.progress.connect(self.status.setText)

    # -- configurations ----------------------------------------------------------------------
    def add_config(self, config: Config) -> None:
        row = self.configs.rowCount()
        self.configs.insertRow(row)
        values = config.to_dict()
        for column, key in enumerate(COLUMNS):
            box = QComboBox()
            box.addItems(list(SWITCHES[key]))
            box.setCurrentText(values[key])
            self.configs.setCellWidget(row, column, box)

    def remove_last(self) -> None:
        if self.configs.rowCount() > 2:
            self.configs.removeRow(self.configs.rowCount() - 1)

    def config_at(self, row: int) -> Config:
        values = {key: self._box(row, column).currentText() for column, key in enumerate(COLUMNS)}
        return Config(
            prefix_cache=values["prefix_cache"] == "on",
            speculative=values["speculative"],
            quant=values["quant"],
            stream=values["stream"] == "on",
            typing=values["typing"] == "on",
        )

    def set_config(self, row: int, config: Config) -> None:
        for column, key in enumerate(COLUMNS):
            self._box(row, column).setCurrentText(config.to_dict()[key])

    def chosen(self) -> list[Config]:
        return [self.config_at(row) for row in range(self.configs.rowCount())]

    def _box(self, row: int, column: int) -> QComboBox:
        box = self.configs.cellWidget(row, column)
        assert isinstance(box, QComboBox)
        return box

    # -- running -----------------------------------------------------------------------------
    def run(self) -> None:
        if self.running:
            return
        configs = self.chosen()
        if any(c.speculative == "draft" for c in configs) and not self.spec.draft:
            self.status.setText("Speculative \u201cdraft\u201d needs a draft model: pick one in Settings first.")
            return
        self.running = True
        self.run_button.setEnabled(False)
        self.status.setText("Starting\u2026")
        spec, messages, bridge = self.spec, self.messages, self.bridge
        runs, cold, max_tokens, say = self.runs.value(), self.cold.isChecked(), self.max_tokens.value(), self.progress

        in_use, documents = self.in_use, self.documents

        def work() -> list[Result]:
            client, sink = bridge_client(bridge)
            try:
                return compare(
                    client,
                    spec,
                    messages,
                    configs,
                    max_tokens=max_tokens,
                    runs=runs,
                    cold=cold,
                    progress=say.emit,
                    in_use=in_use,
                    documents=documents,
                )
            finally:
                try:
                    if client.loaded is not None and any(c.quant != (in_use or spec.quant) for c in configs):
                        say.emit(f"loading the model with quant={spec.quant} again")
                        client.load(spec)
                except LoadError as exc:
                    say.emit(f"The model could not be loaded again with quant={spec.quant}: {exc}")
                bridge.event.disconnect(sink)

        in_background(self, work, CompareDialog._done)

    def _done(self, outcome: object) -> None:
        self.running = False
        self.run_button.setEnabled(True)
        if isinstance(outcome, Exception):
            self.status.setText(f"The comparison stopped: {outcome}")
            self.finished_run.emit(outcome)
            return
        assert isinstance(outcome, list)
        self.show_results(outcome)
        mode = "cold" if self.cold.isChecked() else "warm"
        same = all(r.identical for r in outcome)
        verdict = "all outputs identical" if same else "outputs differ (see the last column)"
        self.status.setText(f"Done: {mode}, median of {self.runs.value()} run(s), greedy; {verdict}.")
        self.finished_run.emit(outcome)

    def show_results(self, results: list[Result]) -> None:
        self.results = results
        body = rows(results)
        self.table.setRowCount(len(body))
        for r, (result, row) in enumerate(zip(results, body, strict=True)):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                item.setToolTip(result.text)
                self.table.setItem(r, c, item)
        labels = [f"{i + 1}" for i in range(len(results))]
        self.ttft_chart.update_bars(labels, [r.ttft_s for r in results])
        self.speed_chart.update_bars(labels, [r.tokens_per_s for r in results])
        for button in (self.csv_button, self.png_button):
            button.setEnabled(bool(results))

    # -- export ------------------------------------------------------------------------------
    def export_csv(self, path: Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow([*HEADER, "text"])
            for result, row in zip(self.results, rows(self.results), strict=True):
                writer.writerow([*row, result.text])

    def export_png(self, path: Path) -> bool:
        return self.charts.grab().save(str(path), "PNG")

    def _ask_csv(self) -> None:
        name, _ = QFileDialog.getSaveFileName(self, "Export the table", "compare.csv", "CSV (*.csv)")
        if name:
            try:
                self.export_csv(Path(name))
            except OSError as exc:
                self.status.setText(f"The table could not be saved ({exc}). Choose another folder.")

    def _ask_png(self) -> None:
        name, _ = QFileDialog.getSaveFileName(self, "Save the charts", "compare.png", "PNG (*.png)")
        if name and not self.export_png(Path(name)):
            self.status.setText("The charts could not be saved there. Choose another folder.")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
