"""Runs the real ``brisk`` command line and reads its ``--json`` output (one event per line).

``brisk(*args)`` calls the entry point ``app.cli.main(args)`` in this process, as simonw/llm tests its CLI:
standard input, output and error are its own for the call, the data folder and the variables in ``env`` are
set for the call only, a ``SystemExit`` (argparse's refusals) becomes the exit code, and an exception that
escapes ``main`` is printed as a traceback with exit code 1, as the interpreter would.  ``child=True`` runs
``python -m app.cli`` in a child process instead: for what needs a whole process (start-up, its exit, signals,
several at once); a variable in :data:`IMPORT_TIME` (read once per process) or a ``PYTHON*`` one (read by
the interpreter as it starts: ``PYTHONPATH`` for a ``sitecustomize``) also makes the run a child.
Either way the result is a ``Run`` (a ``CompletedProcess`` with ``elapsed`` seconds), and a run past
``timeout`` fails the test (it would have hung a user).
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support import ROOT

BRISK = [sys.executable, "-m", "app.cli"]
# Read once per process (at import, or cached at the first call): a run that sets one needs a fresh interpreter.
IMPORT_TIME = frozenset(
    {
        "BRISK_NATIVE",
        "BRISK_NATIVE_PREBUILT",
        "BRISK_NATIVE_VARIANT",
        "BRISK_FASTPATH",
        "BRISK_ADAPT_THREADS",
        "BRISK_MALLOC_TUNING",
        "BRISK_PACKED_LINEAR",
        "TORCH_EXTENSIONS_DIR",
        "OMP_NUM_THREADS",
        "CXX",
    }
)
Env = Mapping[str, str | None]  # None: the variable is unset for the run


class Run(subprocess.CompletedProcess[str]):
    elapsed: float


def brisk(
    *args: str | bytes,
    stdin: str | bytes | None = None,
    data_dir: str | Path | None = None,
    offline: bool = True,
    env: Env | None = None,
    timeout: float = 300,
    child: bool = False,
) -> Run:
    """``brisk ARGS``; ``offline=False`` lets it reach a hub (HF_ENDPOINT: a test's fake one)."""
    changes: dict[str, str | None] = {"HF_HUB_OFFLINE": "1" if offline else None}
    if data_dir:
        changes["BRISK_DATA_DIR"] = str(data_dir)
    changes.update(env or {})
    data = stdin.encode() if isinstance(stdin, str) else stdin
    if child or any(name in IMPORT_TIME or name.startswith("PYTHON") for name in changes):  # PYTHONPATH: site
        return run_python([*BRISK[1:], *args], changes, data, timeout)
    offline = (changes["HF_HUB_OFFLINE"] or "").upper() in {"1", "ON", "YES", "TRUE"}  # as huggingface_hub reads it
    return _in_process([os.fsdecode(a) for a in args], changes, data or b"", offline, timeout)


def run_python(argv: list[str | bytes], env: Env, stdin: bytes | None, timeout: float) -> Run:
    """``python ARGV`` in a child process from the repository root, with ``env`` over this process's."""
    full_env = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *argv], input=stdin, capture_output=True, timeout=timeout, env=full_env, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"python {' '.join(map(os.fsdecode, argv))} ran past {timeout} s: {exc.stderr!r}"[-2000:])
    result = Run(done.args, done.returncode, _text(done.stdout), _text(done.stderr))
    result.elapsed = time.perf_counter() - start
    return result


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


_one_at_a_time = threading.Lock()  # sys.std* and os.environ are the process's


def _in_process(argv: list[str], env: Env, stdin: bytes, offline: bool, timeout: float) -> Run:
    import torch
    from huggingface_hub import constants

    out, err = io.BytesIO(), io.BytesIO()
    # as a child's: standard output refuses what is not UTF-8, standard error escapes it
    streams = (
        io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"),
        io.TextIOWrapper(out, encoding="utf-8", write_through=True),
        io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True),
    )
    code: list[int] = []
    worker = threading.Thread(target=_main, args=(argv, streams[2], code), name="brisk-cli", daemon=True)
    with _one_at_a_time:
        saved_env, saved_std, threads = dict(os.environ), (sys.stdin, sys.stdout, sys.stderr), torch.get_num_threads()
        saved_offline = constants.HF_HUB_OFFLINE
        handler = logging.StreamHandler(streams[2])  # what Python's last-resort handler prints in a child
        handler.setLevel(logging.WARNING)
        logging.getLogger().addHandler(handler)
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        constants.HF_HUB_OFFLINE = offline
        sys.stdin, sys.stdout, sys.stderr = streams
        start = time.perf_counter()
        try:
            worker.start()
            worker.join(timeout)
            elapsed = time.perf_counter() - start
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved_std
            logging.getLogger().removeHandler(handler)
            constants.HF_HUB_OFFLINE = saved_offline
            os.environ.clear()
            os.environ.update(saved_env)
            torch.set_num_threads(threads)
            _forget_process_state()
    if worker.is_alive():
        pytest.fail(f"brisk {' '.join(argv)} ran past {timeout} s: {_text(err.getvalue())!r}"[-2000:])
    result = Run(["brisk", *argv], code[0], _text(out.getvalue()), _text(err.getvalue()))
    result.elapsed = elapsed
    return result


def _main(argv: list[str], stderr: io.TextIOBase, code: list[int]) -> None:
    from app.cli import main
    from engine.client import finish_writes

    try:
        code.append(main(argv))
    except SystemExit as exc:  # argparse's refusals and --help
        if exc.code is None or isinstance(exc.code, int):
            code.append(exc.code or 0)
        else:
            print(exc.code, file=stderr)
            code.append(1)
    except BaseException:  # noqa: BLE001 (what the interpreter would print and exit 1 for)
        traceback.print_exc(file=stderr)
        code.append(1)
    finally:
        finish_writes()  # as the `brisk` process does before it leaves
        stderr.flush()


def _forget_process_state() -> None:
    """What a child would not carry to the next run: the document library opened on this run's data folder."""
    from engine import client

    client._library = None


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]
