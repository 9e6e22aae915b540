"""A disk that fills under the answer cache (issue 48): the reply is given, one line says what failed, no traceback.

The disk is filled for real as far as the process can tell: the child's file-size limit (``RLIMIT_FSIZE``, with
``SIGXFSZ`` ignored) is set just above the largest file in the data folder, so the next write that grows one
fails in the kernel, as it does on a full disk.  Before, that printed a 25-line chained traceback beside the
one good warning; the next run, with room again, must answer and keep answers as before.  Only the run on the
full disk needs a process of its own (the limit is the process's); the run before it and the one after it run
in this process (``tests/support/brisk_cli.py``).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from tests.hostile.conftest import BRISK, integrity
from tests.support import ROOT
from tests.support.brisk_cli import brisk

ARGS = ("ask", "--quant", "none", "--max-tokens", "8", "--model")  # the model and the question follow


def ask(data: Path, model: Path, question: str, file_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    env = dict(os.environ, HF_HUB_OFFLINE="1", BRISK_DATA_DIR=str(data))
    argv = [*BRISK, *ARGS, str(model), question]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=180,
                          preexec_fn=limited, check=False)  # fmt: skip


def test_a_full_disk_under_the_answer_cache_is_one_line_and_the_reply_still_comes(
    tmp_path: Path, tiny_dir: Path
) -> None:
    data = tmp_path / "data"
    first = brisk(*ARGS, str(tiny_dir), "What is the first question?", data_dir=data)
    assert first.returncode == 0, first.stderr[-2000:]
    largest = max(p.stat().st_size for p in data.rglob("*") if p.is_file())
    full = ask(data, tiny_dir, "And what about a second, different question on lighthouses?", largest + 1024)
    assert full.returncode == 0, full.stderr[-2000:]
    assert full.stdout.strip()  # the reply was given
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    cache_lines = [line for line in full.stderr.splitlines() if "answer cache" in line.lower()]
    assert 1 <= len(cache_lines) <= 2, full.stderr  # what failed, said once (and the cache switched off)
    assert any("brisk.db" in line for line in cache_lines)
    again = brisk(*ARGS, str(tiny_dir), "And what about a second, different question on lighthouses?", data_dir=data)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert integrity(data / "brisk.db") == "ok"
    print(f"file limit {largest + 1024:,} bytes: {cache_lines}", file=sys.stderr)
