"""Runs the real ``brisk`` command line (``python -m app.cli`` from the repository root) in a child process,
and reads its ``--json`` output (one event per line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT

BRISK = [sys.executable, "-m", "app.cli"]


def brisk(
    *args: str, stdin: str | None = None, data_dir: str | None = None, offline: bool = True
) -> subprocess.CompletedProcess[str]:
    """``brisk ARGS`` in a child process; ``offline=False`` lets it reach a hub (HF_ENDPOINT: a test's fake one)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if not offline:
        env.pop("HF_HUB_OFFLINE")
    if data_dir:
        env["BRISK_DATA_DIR"] = data_dir
    return subprocess.run(
        [*BRISK, *args], input=stdin, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, check=False
    )


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]
