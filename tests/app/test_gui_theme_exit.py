"""Brisk exits cleanly after Settings changed the theme (issue 50: exit 139 and "shared QObject was deleted").

The cause was in the Settings dialog: widgets put into a bare ``QHBoxLayout`` that then went into
``QFormLayout.addRow`` stayed owned by Python although Qt had parented them, so PySide deleted them a
second time on exit.  The child-process test runs the real ``run_gui`` on the fake engine, changes the
theme with the dialog's own widgets and closes the window; the crash came in most runs, not all, so it
runs five times.  The in-process test checks the cause directly: no widget Qt has parented is owned by
Python.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shiboken6
from PySide6.QtCore import QObject
from pytestqt.qtbot import QtBot

from app.version import ROOT

RUNS = 5

THEME_SCRIPT = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox
import app.launch
from app.dialogs.settings import SettingsDialog
from app.views import style
from app.window import MainWindow
from tests.support.fake_engine import FakeEngine

app.launch.backend_factory_for = lambda settings: FakeEngine
app.launch.prepare_model = lambda settings, model=None: None
tries = [0]


def save_dark() -> None:
    dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, SettingsDialog) and w.isVisible())
    dialog.theme_combo.setCurrentIndex(dialog.theme_combo.findData("dark"))
    buttons = dialog.findChild(QDialogButtonBox)
    buttons.button(QDialogButtonBox.StandardButton.Save).click()


def check() -> None:
    tries[0] += 1
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if tries[0] > 500:
        print("NOT READY", flush=True)
        QApplication.quit()
    elif windows and windows[0].isVisible() and windows[0].model_ready:
        QTimer.singleShot(50, save_dark)
        windows[0].open_settings()  # runs until Save
        print("THEME", style.current().name, windows[0].settings.theme, flush=True)
        QTimer.singleShot(100, windows[0].close)  # the last window: the app quits
    else:
        QTimer.singleShot(20, check)


QApplication(sys.argv)
QTimer.singleShot(0, check)
sys.exit(app.launch.run_gui())
"""


def _run_once(data_dir: Path) -> subprocess.CompletedProcess[str]:
    data_dir.mkdir()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-c", THEME_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )


@pytest.mark.cli
def test_exit_is_clean_after_the_theme_changes_in_settings(tmp_path: Path) -> None:
    for run in range(RUNS):
        data_dir = tmp_path / f"run{run}"
        done = _run_once(data_dir)
        said = f"run {run + 1} of {RUNS}: exit {done.returncode}\n{done.stderr[-3000:]}"
        assert "THEME dark dark" in done.stdout, said
        assert "shared QObject was deleted" not in done.stderr, said
        assert done.returncode == 0, said
        wal = data_dir / "brisk.db-wal"  # a clean close merges the write-ahead log into the database
        assert not wal.exists() or wal.stat().st_size == 0, said


def _parented_but_python_owned() -> list[str]:
    """Widgets Qt has given a parent (which deletes them) that Python also owns (and would delete again)."""
    return [
        f"{type(o).__name__} in {type(o.parent()).__name__}"
        for o in gc.get_objects()
        if isinstance(o, QObject) and shiboken6.isValid(o) and shiboken6.ownedByPython(o) and o.parent() is not None
    ]


def test_settings_dialog_leaves_qt_to_delete_its_widgets(harness, qtbot: QtBot) -> None:  # noqa: ANN001
    from app.dialogs.settings import SettingsDialog

    window = harness.open()
    dialog = SettingsDialog(window.settings, window)
    assert _parented_but_python_owned() == []
    dialog.deleteLater()
    window.reset_layout()  # the docks are taken out and put back
    assert _parented_but_python_owned() == []
