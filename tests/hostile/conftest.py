"""The hostile suite's set-up: each case runs the real ``brisk`` command line in a child process on a
data folder of its own, and checks a clear message, a bounded time, nothing lost and a next run that works.

``cli(...)`` runs ``python -m app.cli`` with ``BRISK_DATA_DIR`` set (and returns the completed process with
``elapsed`` seconds added); ``integrity(path)`` is ``PRAGMA integrity_check`` on a database file.
Cases and results are tabled in ``docs/RELIABILITY.md``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import ROOT

BRISK = [sys.executable, "-m", "app.cli"]


class Run(subprocess.CompletedProcess[str]):
    elapsed: float


def run_python(
    argv: list[str],
    data_dir: Path,
    timeout: float = 180,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``python ARGV`` on ``data_dir``; a run past ``timeout`` fails the test (it would have hung a user)."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "BRISK_DATA_DIR": str(data_dir), **(env or {})}  # env wins
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"python {' '.join(argv)} ran past {timeout} s: {exc.stderr!r}"[-2000:])
    result = Run(done.args, done.returncode, done.stdout, done.stderr)
    result.elapsed = time.perf_counter() - start
    return result


def run_cli(
    *args: str,
    data_dir: Path,
    timeout: float = 180,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``brisk ARGS`` on ``data_dir`` (``python -m app.cli``), bounded by ``timeout``."""
    return run_python([*BRISK[1:], *args], data_dir, timeout, stdin, env)


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
