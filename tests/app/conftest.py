"""GUI fixtures: the harness (``tests/support/gui_harness.py``) over ``brisk_data_dir`` (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def harness(qtbot, brisk_data_dir: Path):  # noqa: ANN001, ANN201
    """Windows on a store in this test's data folder, each with its own FakeEngine (``support/gui_harness.py``)."""
    from tests.support.gui_harness import Harness  # imports Qt: only the GUI tests ask for it

    h = Harness(qtbot, brisk_data_dir)
    yield h
    h.close_all()
