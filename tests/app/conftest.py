"""GUI fixtures: a private data folder per test and the harness over it (``tests/support/gui_harness.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def brisk_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder for one test (settings.json, brisk.db); GUI tests use it."""
    data = tmp_path / "brisk-data"
    data.mkdir()
    monkeypatch.setenv("BRISK_DATA_DIR", str(data))
    return data


@pytest.fixture
def harness(qtbot, brisk_data_dir: Path):  # noqa: ANN001, ANN201
    """Windows on a store in this test's data folder, each with its own FakeEngine (``support/gui_harness.py``)."""
    from tests.support.gui_harness import Harness  # imports Qt: only the GUI tests ask for it

    h = Harness(qtbot, brisk_data_dir)
    yield h
    h.close_all()
