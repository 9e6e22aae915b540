"""A/B compare from the window: the dialog replays a user message under two configurations.

On the FakeEngine (fast, every request checked) and on the real engine with
the tiny model (greedy outputs really identical across prefix cache and
speculative decoding).  The window's event loop keeps running throughout:
the dialog waits on its ``finished_run`` signal, never on a sleep.
"""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.dialogs.compare import CompareDialog, replay_messages
from app.window.main_window import MainWindow
from engine.api import Done, Loaded, LoadFailed
from engine.client import local_backend
from engine.compare import Config
from engine.storage import Settings, Store
from tests.support.gui_harness import Harness, chat, fake

# Screenshots go to the README's docs/ only when asked (BRISK_SHOTS=docs); a plain test run leaves the tree alone.
DOCS = Path(os.environ.get("BRISK_SHOTS") or tempfile.mkdtemp(prefix="brisk-shots-"))


def run(qtbot: QtBot, dialog: CompareDialog, timeout: int = 10_000) -> object:
    with qtbot.waitSignal(dialog.finished_run, timeout=timeout) as blocker:
        dialog.run_button.click()
    return blocker.args[0]


def test_compare_from_the_panel_button(qtbot: QtBot, harness: Harness, tmp_path: Path) -> None:
    window = harness.open(settings=Settings(speculative="off", system_prompt="Be brief."))
    engine = fake(window)
    conversation = chat(qtbot, window, "First question")
    chat(qtbot, window, "Second question")
    window.latency.panel.compare_button.click()
    dialog = window.latency.dialog
    assert dialog is not None and dialog.isVisible()
    assert [m["content"] for m in dialog.messages] == [
        "Be brief.",
        "First question",
        "Hello there, friend.",
        "Second question",
    ]
    # the configuration in use (prefill while typing is on by default), and speculation on beside it
    assert dialog.chosen() == [Config(speculative="off", typing=True), Config(speculative="lookup", typing=True)]
    before = len(engine.requests)
    results = run(qtbot, dialog)
    assert isinstance(results, list) and len(results) == 2
    replayed = engine.requests[before:]
    assert len(replayed) == 4  # a warm-up and one measured run per configuration
    assert all(r.sampling.temperature == 0 and r.sampling.seed == 0 and not r.answer_cache for r in replayed)
    assert [r.speculative for r in replayed] == ["off", "off", "lookup", "lookup"]
    assert dialog.table.rowCount() == 2
    assert [dialog.table.item(r, 7).text() for r in range(2)] == ["yes", "yes"]
    assert "all outputs identical" in dialog.status.text()
    dialog.export_csv(tmp_path / "compare.csv")
    rows = list(csv.reader((tmp_path / "compare.csv").open(encoding="utf-8")))
    assert rows[0][0] == "configuration" and rows[1][-1] == "Hello there, friend." and len(rows) == 3
    assert dialog.export_png(tmp_path / "charts.png") and (tmp_path / "charts.png").stat().st_size > 1000
    # the compare requests never touched the conversation or the panel's history
    assert len(window.store.messages(conversation)) == 4
    assert window.latency.panel.history_chart.count == 2


def test_compare_a_chosen_message_and_a_quant_reload(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    conversation = chat(qtbot, window, "First question")
    chat(qtbot, window, "Second question")
    first = next(m.id for m in window.store.messages(conversation) if m.role == "user")
    dialog = window.latency.compare_message(first)
    assert dialog is not None and [m["content"] for m in dialog.messages][-1] == "First question"
    dialog.set_config(1, Config(speculative="auto", quant="int8-cpu", stream=False))
    results = run(qtbot, dialog)
    assert isinstance(results, list) and results[1].config.quant == "int8-cpu"
    # and back to the mode the settings ask for
    assert [spec.quant for spec in engine.loads[-2:]] == ["int8-cpu", "auto"]
    qtbot.waitUntil(lambda: window.model_ready)


def test_compare_starts_from_the_mode_auto_loaded_and_reloads_nothing_for_it(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()  # quant "auto" in the settings; the engine says which mode it loaded
    engine = fake(window)
    engine.load_info = {**engine.load_info, "quant": "q8-cpu"}
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()
    chat(qtbot, window, "First question")
    dialog = window.latency.compare_message()
    assert dialog is not None and [c.quant for c in dialog.chosen()] == ["q8-cpu", "q8-cpu"]
    loads = len(engine.loads)
    results = run(qtbot, dialog)
    assert isinstance(results, list) and len(engine.loads) == loads, "the mode in use needs no reload"


def test_compare_needs_a_message(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    assert window.latency.compare_message() is None
    assert "Send a message first" in window.composer.hint.text()


def test_replay_messages_refuses_a_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation = chat(qtbot, window, "Hi")
    reply = window.store.messages(conversation)[-1]
    try:
        replay_messages(window.store, conversation, reply.id)
    except ValueError as exc:
        assert "your own messages" in str(exc)
    else:
        raise AssertionError("a reply was accepted")


def test_compare_on_the_tiny_model_gives_identical_greedy_outputs(
    qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path
) -> None:
    settings = Settings(model=str(tiny_dir), device="cpu", dtype="float32", max_tokens=24, speculative="off")
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(Store(brisk_data_dir / "brisk.db"), bridge, settings)
    qtbot.addWidget(window)
    window.resize(1280, 820)
    window.show()
    try:
        with qtbot.waitSignal(
            bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=120_000
        ):
            window.load_model()
        assert window.model_ready
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000):
            window.composer.editor.setPlainText("List three colours of the sea, one per line.")
            window.composer.send_requested.emit(window.composer.editor.toPlainText())
        qtbot.waitUntil(lambda: window.session.active is None)
        dialog = window.latency.compare_message()
        assert dialog is not None
        dialog.set_config(1, Config(prefix_cache=False, speculative="lookup"))
        dialog.add_config(Config(prefix_cache=True, speculative="lookup", stream=False))
        dialog.runs.setValue(2)
        results = run(qtbot, dialog, timeout=180_000)
        assert isinstance(results, list) and len(results) == 3
        assert all(r.identical for r in results), [r.text for r in results]
        assert results[0].text and results[0].cached_tokens > 0  # warm: the prompt came from the cache
        assert results[1].cached_tokens == 0  # prefix cache off
        assert [dialog.table.item(r, 7).text() for r in range(3)] == ["yes", "yes", "yes"]
        dialog.resize(980, 620)
        qtbot.waitUntil(lambda: dialog.table.item(2, 7) is not None)
        DOCS.mkdir(exist_ok=True)
        assert dialog.grab().save(str(DOCS / "screenshot-compare.png"))
        dialog.close()
    finally:
        window.close()
        bridge.shutdown()
        window.store.close()
