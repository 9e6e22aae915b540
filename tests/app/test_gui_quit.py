"""File > Quit (Ctrl+Q) closes Brisk as the window's close button does (issue 50: there was no Quit item).

In process: the item is in the File menu with its shortcut, Ctrl+Q closes the window, and a reply still
streaming keeps its text, saved as cancelled.  In a child process: the real ``run_gui`` on the fake
engine, Ctrl+Q pressed once the model is ready, ends with exit code 0 and nothing on stderr about Qt
objects.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from pytestqt.qtbot import QtBot

from app.version import ROOT
from tests.support.gui_harness import Harness, send_and_hold, stored


def test_quit_in_the_file_menu_closes_the_window_and_keeps_a_streaming_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    files = next(a.menu() for a in window.menuBar().actions() if a.text() == "&File")
    quit_item = next(a for a in files.actions() if a.text() == "Quit")
    assert quit_item.shortcut() == QKeySequence("Ctrl+Q")
    send_and_hold(qtbot, window, "A long story")
    conversation = window.session.conversation_id
    assert conversation is not None
    qtbot.waitUntil(lambda: getattr(window.session.active, "text", "") == "Hello there")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible())
    assert [(m.content, m.status) for m in stored(window, conversation)][-1] == ("Hello there", "cancelled")


QUIT_SCRIPT = """
import sys
from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
import app.launch
from app.window import MainWindow
from tests.support.fake_engine import FakeEngine

app.launch.backend_factory_for = lambda settings: FakeEngine
app.launch.prepare_model = lambda settings, model=None: None
tries = [0]


def check() -> None:
    tries[0] += 1
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if tries[0] > 500:
        print("NOT READY", flush=True)
        QApplication.quit()
    elif windows and windows[0].isVisible() and windows[0].model_ready:
        windows[0].activateWindow()
        QTest.keyClick(windows[0].composer.editor, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
        print("QUIT", windows[0].isVisible(), flush=True)
        QTimer.singleShot(3000, lambda: (print("STILL OPEN", flush=True), QApplication.quit()))
    else:
        QTimer.singleShot(20, check)


QApplication(sys.argv)
QTimer.singleShot(0, check)
sys.exit(app.launch.run_gui())
"""


@pytest.mark.cli
def test_ctrl_q_quits_the_app_cleanly(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", QUIT_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "QUIT False" in done.stdout and "STILL OPEN" not in done.stdout, done.stdout
    assert "QObject" not in done.stderr, done.stderr[-2000:]
