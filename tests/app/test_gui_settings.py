"""GUI: the Settings dialog, About this machine, the bridge, and the app's start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

import app.bridge
from app.bridge import EngineBridge
from app.dialogs.about import NO_MODEL, AboutDialog
from app.dialogs.settings import SettingsDialog
from engine.api import Loaded, LoadFailed, ModelSpec
from engine.storage import Settings
from tests.support import ROOT
from tests.support.fake_engine import FakeEngine
from tests.support.gui_harness import Harness, chat, fake

# -- settings and the bridge -------------------------------------------------------------------------


def test_settings_dialog_round_trip(qtbot: QtBot) -> None:
    original = Settings(seed=7, speculative="off")
    dialog = SettingsDialog(original)
    qtbot.addWidget(dialog)
    dialog.model_edit.setText("  /models/qwen.gguf ")
    dialog.device_combo.setCurrentText("cuda")
    dialog.dtype_combo.setCurrentText("bfloat16")
    dialog.system_edit.setPlainText("Be brief.")
    dialog.temperature.setValue(0.7)
    dialog.top_k.setValue(40)
    dialog.seed_edit.setText("")
    dialog.max_tokens.setValue(1024)
    dialog.prefix_cache.setChecked(False)
    result = dialog.result_settings()
    assert (result.model, result.device, result.dtype) == ("/models/qwen.gguf", "cuda", "bfloat16")
    assert (result.system_prompt, result.temperature, result.top_k) == ("Be brief.", 0.7, 40)
    assert result.seed is None and result.max_tokens == 1024 and result.prefix_cache is False
    assert result.speculative == "off"  # fields the dialog does not show are kept
    dialog.seed_edit.setText("42")
    assert dialog.result_settings().seed == 42


def test_applying_settings_saves_and_reloads_only_when_needed(
    qtbot: QtBot, harness: Harness, brisk_data_dir: Path
) -> None:
    window = harness.open()
    engine = fake(window)
    window.apply_settings(replace(window.settings, temperature=0.8, max_tokens=64))
    assert len(engine.loads) == 1
    assert Settings.load(brisk_data_dir / "settings.json").temperature == 0.8
    chat(qtbot, window, "Hi")
    sampling = engine.requests[-1].sampling
    assert (sampling.temperature, sampling.max_tokens) == (0.8, 64)

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, device="cpu", dtype="float32"))
    quant = window.settings.quant  # the default mode, whichever it is: only device and dtype changed
    assert engine.loads[-1] == ModelSpec(source="", device="cpu", dtype="float32", quant=quant)

    window.apply_settings(replace(window.settings, system_prompt="Answer in French."))
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assert window.store.get_conversation(conversation_id).system_prompt == "Answer in French."
    chat(qtbot, window, "Bonjour")
    assert engine.requests[-1].messages[0] == {"role": "system", "content": "Answer in French."}


def test_about_this_machine_from_f1_and_from_settings(
    qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = {"python": "3.12.1", "torch": "2.5.0", "cuda": False, "cpu_threads": 16, "memory_gb": 62.5}
    monkeypatch.setattr(app.bridge, "machine_report", lambda: facts)
    window = harness.open()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_F1)
    about = window.about
    assert about is not None and about.isVisible()
    qtbot.waitUntil(lambda: about.machine_facts().get("PyTorch") == "2.5.0")
    shown = about.machine_facts()
    assert shown["CUDA available"] == "no" and shown["Memory"] == "62.5 GB" and shown["CPU threads"] == "16"
    rows = about.model_rows()
    assert rows["Model"] == "fake-model" and rows["Device"] == "cpu" and rows["Precision"] == "float32"
    assert rows["Parameters"] == "135.0 M" and rows["Weights in memory"] == "257.5 MB"
    assert rows["Warm prompt caches from disk"] == "1"

    dialog = SettingsDialog(window.settings, window, loaded=window.loaded)
    qtbot.addWidget(dialog)
    qtbot.mouseClick(dialog.about_button, Qt.MouseButton.LeftButton)
    from_settings = dialog.about
    assert from_settings is not None and from_settings.isVisible()
    assert from_settings.model_rows()["Model"] == "fake-model"
    qtbot.waitUntil(lambda: from_settings.machine_facts().get("Python") == "3.12.1")


def test_about_dialog_reports_a_failing_check(qtbot: QtBot) -> None:
    def broken() -> dict[str, object]:
        raise ImportError("No module named 'torch'")

    dialog = AboutDialog(None, report=broken)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: "torch" in " ".join(dialog.machine_facts().values()))
    assert "Could not check this machine" in " ".join(dialog.machine_facts().values())
    assert list(dialog.model_rows().values()) == [NO_MODEL]


def test_bridge_delivers_events_on_the_gui_thread(qtbot: QtBot) -> None:
    bridge = EngineBridge(FakeEngine)
    seen: list[int] = []
    bridge.event.connect(lambda _event: seen.append(threading.get_ident()))
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        bridge.load(ModelSpec(source="tiny"))
    engine = bridge.backend
    assert isinstance(engine, FakeEngine)
    assert engine._thread.ident != threading.get_ident()
    assert seen and set(seen) == {threading.get_ident()}
    bridge.shutdown()


def test_bridge_reports_an_engine_that_cannot_start(qtbot: QtBot) -> None:
    def broken(_on_event: object) -> FakeEngine:
        raise ImportError("No module named 'torch'")

    bridge = EngineBridge(broken)
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, LoadFailed)) as blocker:
        bridge.load(ModelSpec())
    assert "Could not start the engine" in blocker.args[0].message
    assert "torch" in blocker.args[0].message
    bridge.shutdown()


RUN_GUI_SCRIPT = """
import sys
from tests.support.fake_engine import FakeEngine
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.launch
from app.window import MainWindow

app.launch.backend_factory_for = lambda settings: FakeEngine

tries = [0]

def check():
    tries[0] += 1
    if tries[0] > 500:
        print("NOT READY", flush=True)
        QApplication.quit()
        return
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if windows and windows[0].isVisible() and windows[0].model_ready:
        engine = windows[0].bridge.backend
        print("READY", engine.loads[-1].source, windows[0].windowIcon().isNull(), flush=True)
        QApplication.quit()
    else:
        QTimer.singleShot(20, check)

QTimer.singleShot(0, check)
sys.exit(app.launch.run_gui(sys.argv[1], None))
"""


def test_run_gui_opens_loads_and_quits(brisk_data_dir: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(brisk_data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", RUN_GUI_SCRIPT, "/models/cli-choice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "READY /models/cli-choice False" in done.stdout
    assert (brisk_data_dir / "brisk.db").exists()


def test_about_says_which_brisk_this_is(qtbot: QtBot) -> None:
    import importlib.metadata
    import subprocess

    from app.version import ROOT

    dialog = AboutDialog(None, report=lambda: {})
    qtbot.addWidget(dialog)
    text = dialog.version_label.text()
    assert text.startswith(f"Brisk {importlib.metadata.version('brisk')}")
    if (ROOT / ".git").exists():  # a checkout (the tests run in one): its commit, as git says it
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        assert f"commit {head.stdout.strip()}" in text
