"""The hostile suite's set-up: each case runs the real ``brisk`` command line on a data folder of its own, and
checks a clear message, a bounded time, nothing lost and a next run that works.

``cli(...)`` (``run_cli``) runs ``brisk ARGS`` with ``BRISK_DATA_DIR`` set, in this process unless
``child=True`` (``tests/support/brisk_cli.py`` says when a run needs a child), and returns the completed run
with ``elapsed`` seconds added; ``run_python`` runs ``python ARGV`` in a child; ``integrity(path)`` is
``PRAGMA integrity_check`` on a database file.  Cases and results: ``tests/hostile/README.md``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import brisk_cli
from tests.support.brisk_cli import BRISK, Run, brisk

__all__ = ["BRISK", "Run", "integrity", "run_cli", "run_python"]


def run_python(
    argv: list[str],
    data_dir: Path,
    timeout: float = 180,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``python ARGV`` in a child on ``data_dir``; a run past ``timeout`` fails the test."""
    changes = {"HF_HUB_OFFLINE": "1", "BRISK_DATA_DIR": str(data_dir), **(env or {})}  # env wins
    return brisk_cli.run_python(list(argv), changes, stdin.encode() if stdin is not None else None, timeout)


def run_cli(
    *args: str,
    data_dir: Path,
    timeout: float = 180,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    child: bool = False,
) -> Run:
    """Run ``brisk ARGS`` on ``data_dir``, bounded by ``timeout`` (``child``: as ``python -m app.cli``)."""
    return brisk(*args, data_dir=data_dir, timeout=timeout, stdin=stdin, env=env, child=child)


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` of a database file: "ok" when it is whole."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """An empty data folder for one case."""
    folder = tmp_path / "data"
    folder.mkdir()
    return folder


@pytest.fixture
def cli() -> Callable[..., Run]:
    return run_cli
