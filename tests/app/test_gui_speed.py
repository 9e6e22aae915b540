"""GUI tests for the speed features: Settings' Speed group, reply metrics, answer seeding.

The quantization list is mostly tested against a stand-in for ``engine.quant``
(a module written to ``tmp_path``), so these tests do not depend on which
quantization back-ends this machine has; one test asks the real module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QComboBox, QWidget
from pytestqt.qtbot import QtBot

import engine.storage.store
from app import quant_probe
from app.background import POLL_MS, in_background
from app.bridge import EngineBridge
from app.dialogs import speed as speed_section
from app.dialogs.settings import SettingsDialog, needs_reload
from app.dialogs.speed import DRAFT_HINT, QUANT_HELP
from app.quant_probe import QUANT_UNAVAILABLE
from app.state.answer_seed import answer_pairs
from app.state.reply import ReplyState
from engine.api import Done, Metrics, ModelSpec, Started, Token
from engine.storage import Settings, Store
from tests.support import ROOT
from tests.support.fake_engine import FakeEngine

MODES = ("none", "int8-cpu", "int4-cpu", "bnb-int8", "bnb-nf4", "bnb-fp4")
FAKE_QUANT = f"""
MODES = {MODES!r}


def availability(device):
    gpu_only = "needs a CUDA GPU and bitsandbytes" if device.type != "cuda" else None
    cpu_only = "runs on the CPU only" if device.type == "cuda" else None
    return {{"none": None, "int8-cpu": cpu_only, "int4-cpu": "needs torchao",
            "bnb-int8": gpu_only, "bnb-nf4": gpu_only, "bnb-fp4": gpu_only}}
"""
PROBE_MS = 60_000  # the check runs in a child Python that imports torch


def items(box: QComboBox) -> list[tuple[str, bool, str]]:
    """(mode, enabled, tooltip) for each entry of a combo box."""
    model = box.model()
    assert isinstance(model, QStandardItemModel)
    return [
        (
            box.itemData(row),
            bool(model.item(row).flags() & Qt.ItemFlag.ItemIsEnabled),
            box.itemData(row, Qt.ItemDataRole.ToolTipRole) or "",
        )
        for row in range(box.count())
    ]


@pytest.fixture
def fake_quant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantization check asks a stand-in for ``engine.quant`` (which modes exist depends on the machine)."""
    (tmp_path / "fake_quant.py").write_text(FAKE_QUANT, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(quant_probe, "QUANT_MODULE", "fake_quant")
    monkeypatch.setattr(quant_probe, "_cache", {})


# -- Settings: Speed ---------------------------------------------------------------------


def test_speed_settings_round_trip(qtbot: QtBot, fake_quant: None) -> None:
    original = Settings(prefix_cache_mb=512, speculative="auto", draft_model="", quant="none")
    dialog = SettingsDialog(original)
    qtbot.addWidget(dialog)
    speed = dialog.speed
    assert speed.prefix_cache_mb.value() == 512 and speed.speculative.currentData() == "auto"
    labels = [speed.speculative.itemText(i) for i in range(speed.speculative.count())]
    assert labels == ["Off", "Auto", "Prompt lookup", "Earlier answers", "Draft model"]

    speed.prefix_cache_mb.setValue(1024)
    speed.speculative.setCurrentIndex(speed.speculative.findData("answers"))
    speed.draft_edit.setText("  /models/draft.gguf ")
    qtbot.waitUntil(lambda: speed.quant_ready, timeout=PROBE_MS)
    speed.quant.setCurrentIndex(speed.quant.findData("int8-cpu"))
    result = dialog.result_settings()
    assert (result.prefix_cache_mb, result.speculative) == (1024, "answers")
    assert (result.draft_model, result.quant) == ("/models/draft.gguf", "int8-cpu")
    assert needs_reload(original, result)
    assert not needs_reload(original, Settings(prefix_cache_mb=1024, speculative="lookup", quant=original.quant))

    speed.prefix_cache.setChecked(False)
    assert not speed.prefix_cache_mb.isEnabled()
    assert dialog.result_settings().prefix_cache is False


def test_choosing_draft_model_without_a_path_shows_a_hint(
    qtbot: QtBot, fake_quant: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialog = SettingsDialog(Settings(speculative="off"))
    qtbot.addWidget(dialog)
    dialog.show()
    speed = dialog.speed
    assert not speed.draft_hint.isVisible()
    speed.speculative.setCurrentIndex(speed.speculative.findData("draft"))
    assert speed.draft_hint.isVisible() and speed.draft_hint.text() == DRAFT_HINT

    monkeypatch.setattr(
        speed_section.QFileDialog, "getOpenFileName", lambda *args, **kwargs: ("/models/small.gguf", "")
    )
    monkeypatch.setattr(speed_section.QFileDialog, "getExistingDirectory", lambda *args, **kwargs: "/models/small")
    menu = speed.draft_browse.menu()
    assert menu is not None
    folder, gguf = menu.actions()
    gguf.trigger()
    assert speed.draft_edit.text() == "/models/small.gguf"
    assert not speed.draft_hint.isVisible()
    folder.trigger()
    assert dialog.result_settings().draft_model == "/models/small"
    speed.draft_edit.clear()
    assert speed.draft_hint.isVisible()
    speed.speculative.setCurrentIndex(speed.speculative.findData("lookup"))
    assert not speed.draft_hint.isVisible()


def test_unavailable_quantization_modes_are_greyed_with_the_reason(qtbot: QtBot, fake_quant: None) -> None:
    dialog = SettingsDialog(Settings(device="cpu", quant="int8-cpu"))
    qtbot.addWidget(dialog)
    quant = dialog.speed.quant
    assert [mode for mode, _, _ in items(quant)] == ["int8-cpu"]  # until the check answers
    qtbot.waitUntil(lambda: dialog.speed.quant_ready, timeout=PROBE_MS)
    shown = items(quant)
    assert [mode for mode, _, _ in shown] == ["auto", *MODES]  # auto first: it measures at the first load
    assert [mode for mode, enabled, _ in shown if enabled] == ["auto", "none", "int8-cpu"]
    tips = dict((mode, tip) for mode, _, tip in shown)
    assert tips["bnb-nf4"] == "needs a CUDA GPU and bitsandbytes"  # greyed: the reason
    assert tips["int8-cpu"] == QUANT_HELP["int8-cpu"] and "8-bit" in tips["int8-cpu"]  # usable: what it does
    assert quant.currentData() == "int8-cpu"

    dialog.device_combo.setCurrentText("cuda")
    qtbot.waitUntil(lambda: dialog.speed.quant_ready, timeout=PROBE_MS)
    enabled = [mode for mode, ok, _ in items(quant) if ok]
    assert enabled == ["auto", "none", "bnb-int8", "bnb-nf4", "bnb-fp4"]
    assert quant.currentData() == "int8-cpu"  # kept (now greyed) until the user picks another


def test_the_draft_model_has_its_own_quantization_choice(qtbot: QtBot, fake_quant: None) -> None:
    original = Settings(device="cpu", draft_model="/models/draft", draft_quant="int8-cpu")
    dialog = SettingsDialog(original)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.speed.quant_ready, timeout=PROBE_MS)
    draft = dialog.speed.draft_quant
    assert items(draft) == items(dialog.speed.quant)[1:]  # the same modes, greyed alike, but no auto
    assert (draft.currentData(), dialog.speed.quant.currentData()) == ("int8-cpu", "auto")
    draft.setCurrentIndex(draft.findData("none"))
    result = dialog.result_settings()
    assert (result.draft_quant, result.quant) == ("none", "auto")
    assert needs_reload(original, result)  # a new draft quantization reloads the models
    assert not needs_reload(Settings(), Settings(draft_quant="fp16-cpu"))  # no draft model: nothing to reload


def test_quantization_without_the_engine_module_offers_only_none(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant_probe, "QUANT_MODULE", "no_such_quant_module")
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.speed.quant_ready, timeout=PROBE_MS)
    [auto, (mode, enabled, tip)] = items(dialog.speed.quant)
    assert auto[0] == "auto" and auto[1]  # auto still measures, and keeps none when nothing else runs
    assert mode == "none" and enabled and tip.startswith(QUANT_UNAVAILABLE)
    assert "no_such_quant_module" in tip
    assert dialog.result_settings().quant == "auto"


STARTUP_SCRIPT = """
import sys
from tests.support.fake_engine import FakeEngine
from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication
from app.bridge import EngineBridge
from app.window import MainWindow
from engine.storage import Settings
from engine.storage import Store

app = QApplication([])
window = MainWindow(Store(None), EngineBridge(FakeEngine), Settings())
window.show()
app.processEvents()
print("torch at start-up:", "torch" in sys.modules)
from app.dialogs.settings import SettingsDialog
dialog = SettingsDialog(Settings(), window)
loop = QEventLoop()
poll = QTimer()
poll.timeout.connect(lambda: dialog.speed.quant_ready and loop.quit())
poll.start(20)
loop.exec()
print("quantization modes:", [dialog.speed.quant.itemData(i) for i in range(dialog.speed.quant.count())])
print("torch with the dialog:", "torch" in sys.modules)
"""


def test_window_and_settings_never_import_torch(brisk_data_dir: Path) -> None:
    from engine.quant import MODES as real_modes

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(brisk_data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", STARTUP_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "torch at start-up: False" in done.stdout
    assert "torch with the dialog: False" in done.stdout  # the quantization check runs in a child process
    assert f"quantization modes: {['auto', *real_modes]}" in done.stdout  # the real engine.quant answered


# -- the live line under a reply -------------------------------------------------------------------


@dataclass(frozen=True)
class StartedWithCache(Started):
    """A Started event from an engine that knows the prompt-cache hit before the first token."""

    cached_tokens: int = 0


def test_live_line_shows_reuse_once_it_is_known() -> None:
    reply = ReplyState("r1", 1, "c1")
    reply.apply(Started("r1", 0.01, prompt_tokens=35))
    reply.apply(Token("r1", 0.2, "Hi", (7,)))
    assert reply.status_line() == "TTFT 0.20 s \u00b7 1 tokens \u00b7 reused 0 of 35 prompt tokens"
    reply.apply(Done("r1", 0.3, "Hi", "stop", Metrics(prompt_tokens=35, cached_tokens=0, completion_tokens=1)))
    assert "reused 0 of 35 prompt tokens" in reply.status_line()

    early = ReplyState("r2", 2, "c1")
    early.apply(StartedWithCache("r2", 0.01, prompt_tokens=1200, cached_tokens=1180))
    early.apply(Token("r2", 0.05, "Hi", (7,)))
    assert "reused 1180 of 1200 prompt tokens" in early.status_line()


def test_real_token_shape_keeps_drafted_spans() -> None:
    """Token.text is a delta that may cover several ids; draft marks the whole delta."""
    reply = ReplyState("r", 1, "c")
    reply.apply(Started("r", 0.0, prompt_tokens=10))
    reply.apply(Token("r", 0.1, "The", (1,), False))
    reply.apply(Token("r", 0.2, " cat sat", (2, 3, 4), True))
    reply.apply(Token("r", 0.3, " on", (5,), True))
    reply.apply(Token("r", 0.4, " the mat", (6, 7), False))
    assert reply.segments == [("The", False), (" cat sat on", True), (" the mat", False)]
    assert reply.tokens == 7


# -- seeding the answer memory ---------------------------------------------------------------------------


def test_answer_pairs_are_the_newest_finished_ones_oldest_first() -> None:
    store = Store(None)
    first = store.create_conversation("First")
    second = store.create_conversation("Second")
    for n in range(6):  # interleaved, so recency is not conversation order
        conversation = first if n % 2 == 0 else second
        store.add_message(conversation, "user", f"question {n}")
        store.add_message(conversation, "assistant", f"answer {n}")
    store.add_message(first, "user", "unanswered")
    store.add_message(second, "user", "stopped one")
    store.add_message(second, "assistant", "partial", status="cancelled")
    empty = store.create_conversation("Empty")
    store.add_message(empty, "assistant", "a reply with no question")

    assert answer_pairs(store) == [(f"question {n}", f"answer {n}") for n in range(6)]
    assert answer_pairs(store, limit=2) == [("question 4", "answer 4"), ("question 5", "answer 5")]
    assert answer_pairs(store, limit=0) == []


class Recorder(FakeEngine):
    """An engine whose answer memory only records."""

    def __init__(self, on_event) -> None:  # noqa: ANN001
        super().__init__(on_event)
        self.calls: list[tuple[str, str]] = []

    def remember_answer(self, question: str, answer: str) -> bool:
        self.calls.append((question, answer))
        return True


class NoMemory(FakeEngine):
    def remember_answer(self, question: str, answer: str) -> bool:
        return False  # a backend without answer memory (a remote one)


def test_the_bridge_seeds_the_answer_memory_from_the_history(qtbot: QtBot) -> None:
    store = Store(None)
    conversation = store.create_conversation("Q")
    for n in range(6):
        store.add_message(conversation, "user", f"question {n}")
        store.add_message(conversation, "assistant", f"answer {n}")
    bridge = EngineBridge(Recorder)
    assert bridge.seed_answers(answer_pairs(store)) == 0  # no engine yet
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        bridge.load(ModelSpec())
    recorder = bridge.backend
    assert isinstance(recorder, Recorder)
    assert bridge.seed_answers(answer_pairs(store, limit=3)) == 3
    assert recorder.calls == [(f"question {n}", f"answer {n}") for n in (3, 4, 5)]
    bridge.shutdown()

    other = EngineBridge(NoMemory)
    with qtbot.waitSignal(other.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        other.load(ModelSpec())
    assert other.seed_answers(answer_pairs(store)) == 0  # an engine without answer memory
    other.shutdown()


def test_answer_pairs_stop_reading_old_conversations(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(minute * 60) for minute in range(1, 1000))  # one message a minute
    monkeypatch.setattr(
        engine.storage.store, "time", types.SimpleNamespace(time=lambda: next(clock), monotonic=time.monotonic)
    )
    store = Store(None)
    old = store.create_conversation("Old")
    store.add_message(old, "user", "old question")
    store.add_message(old, "assistant", "old answer")
    new = store.create_conversation("New")
    for n in range(3):
        store.add_message(new, "user", f"question {n}")
        store.add_message(new, "assistant", f"answer {n}")
    read: list[str] = []
    original = store.messages
    monkeypatch.setattr(store, "messages", lambda cid: read.append(cid) or original(cid))
    assert answer_pairs(store, limit=2) == [("question 1", "answer 1"), ("question 2", "answer 2")]
    assert read == [new]
    assert answer_pairs(store, limit=4)[0] == ("old question", "old answer")


# -- background work for dialogs ------------------------------------------------------------------------


def test_background_answer_reaches_its_owner_and_never_keeps_it_alive(qtbot: QtBot) -> None:
    answers: list[object] = []
    owner = QWidget()
    future = in_background(owner, lambda: 42, lambda widget, result: answers.append((widget, result)))
    qtbot.waitUntil(lambda: bool(answers))
    assert answers == [(owner, 42)] and future.result() == 42
    answers.clear()
    failing = in_background(owner, lambda: 1 / 0, lambda widget, result: answers.append(result))
    qtbot.waitUntil(lambda: bool(answers))
    assert isinstance(answers[0], ZeroDivisionError) and failing.done()

    alive = weakref.ref(owner)
    del owner
    assert alive() is None  # nothing pending held the widget: it went when its last user let go


def test_background_answer_for_a_closed_owner_is_dropped(qtbot: QtBot) -> None:
    answers: list[object] = []
    release = threading.Event()
    owner = QWidget()
    future = in_background(owner, lambda: release.wait(10), lambda widget, result: answers.append(result))
    del owner
    release.set()
    qtbot.waitUntil(future.done)
    qtbot.wait(4 * POLL_MS)  # a poll would have run by now
    assert answers == []


def test_new_prefix_budget_reaches_the_engine(qtbot, tmp_path) -> None:  # noqa: ANN001
    from dataclasses import replace

    from app.bridge import EngineBridge
    from app.window.main_window import MainWindow
    from engine.storage import Settings, Store
    from tests.support.fake_engine import FakeEngine

    budgets: list[int] = []

    class BudgetEngine(FakeEngine):
        def set_prefix_budget(self, budget_bytes: int) -> bool:
            budgets.append(budget_bytes)
            return True

    bridge = EngineBridge(lambda on_event: BudgetEngine(on_event))
    window = MainWindow(Store(None), bridge, Settings(), settings_path=tmp_path / "s.json")
    qtbot.addWidget(window)
    window.load_model()
    qtbot.waitUntil(lambda: bridge.backend is not None, timeout=5000)
    window.apply_settings(replace(window.settings, prefix_cache_mb=64))
    assert budgets == [64 << 20]
    window.apply_settings(replace(window.settings, prefix_cache_mb=64))
    assert budgets == [64 << 20]  # an unchanged budget is not sent again
    bridge.shutdown()


def test_a_backend_without_a_prefix_budget_takes_it_at_the_next_start(qtbot: QtBot) -> None:
    bridge = EngineBridge(FakeEngine)
    assert not bridge.set_prefix_budget(1 << 20)  # no backend yet
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        bridge.load(ModelSpec())
    assert not bridge.set_prefix_budget(1 << 20)  # FakeEngine has no prefix cache
    bridge.shutdown()


def test_every_quantization_mode_has_help_text() -> None:
    from engine.quant import MODES as real_modes

    assert set(QUANT_HELP) == {"auto", *real_modes}
