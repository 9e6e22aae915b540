"""``brisk bench peer-suite``: llama.cpp's own server tests, run against its ``llama-server`` and against Brisk.

A drop-in server is judged by the clients and tests written for the server it replaces.  llama.cpp keeps
its server's test suite in ``tools/server/tests`` (pytest, ``requests`` and the ``openai`` SDK; in the
``vendor/llama.cpp`` tree of llama-cpp-python's source distribution).  Its ``DEBUG_EXTERNAL`` mode runs
every test against a server already listening on ``127.0.0.1:$PORT`` instead of starting one, so the same
tests run unchanged against both servers, each started once on the same model file:

* the peer: ``--peer URL`` (a ``llama-server -m FILE`` the user started; its port is taken from the URL);
* Brisk: ``brisk serve`` on ``--model`` (default: the bundled model), started here in a child process on
  a free port with a fresh data folder, greedy defaults as a user gets them.

``--suite DIR`` is the suite's folder (the one holding ``unit/`` and ``utils.py``) and ``--suite-python``
a Python with its requirements (``pip install -r DIR/requirements.txt pytest-timeout`` in a virtual
environment of its own: they pin versions Brisk's do not).  ``--only`` keeps the test files whose name contains it.

Tests written for llama.cpp's tiny story model (``stories260K``) check words that model writes, and some
start servers with options (slots, context shift, LoRA) that an external server cannot take: those fail
on both.  What counts is the table's last column and the list after it: the tests that **pass on the
peer and fail on Brisk**, each with the first line of its failure.  Each test ends after
``TEST_TIMEOUT_S`` (with ``pytest-timeout``) and each file's run after ``FILE_TIMEOUT_S`` (stopped as by
Ctrl+C, so the tests it ran keep their results); JSON in ``bench/results/peer-suite.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.bench.common import markdown_table, save, stop

FILES = (
    "test_basic.py",
    "test_tokenize.py",
    "test_completion.py",
    "test_chat_completion.py",
    "test_infill.py",
    "test_compat_anthropic.py",
    "test_tool_call.py",
    "test_template.py",
)
FILE_TIMEOUT_S = 600  # one test file's run on one server
TEST_TIMEOUT_S = 60  # one test (with pytest-timeout)
READY_TIMEOUT_S = 600  # brisk serve's first start on an empty data folder converts nothing for a GGUF it runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.scenario == "all" and not (args.suite and args.peer):
        print("peer-suite: skipped (it needs --suite DIR and --peer URL)")
        return {"skipped": "no --suite or --peer"}
    suite = Path(args.suite or "").expanduser()
    if not (suite / "unit").is_dir() or not (suite / "utils.py").is_file():
        raise SystemExit("--suite must be llama.cpp's tools/server/tests folder (with unit/ and utils.py)")
    if not args.peer:
        raise SystemExit("--peer URL: a running llama-server on the same model file (llama-server -m FILE)")
    python = args.suite_python or sys.executable
    files = [f for f in FILES if (suite / "unit" / f).is_file() and (not args.only or args.only in f)]
    if not files:
        raise SystemExit(f"no test file of {', '.join(FILES)} in {suite / 'unit'} matches --only {args.only!r}")
    peer_port = urlparse(args.peer).port or 80
    results = {"peer": outcomes(python, suite, files, peer_port)}
    with brisk_server(args) as port:
        results["brisk"] = outcomes(python, suite, files, port)
    return report(files, results, args)


def outcomes(python: str, suite: Path, files: list[str], port: int) -> dict[str, tuple[str, str]]:
    """Each test's outcome ("passed", "failed", "error", "skipped") and first line of failure, on the server
    at ``port``, by the suite's own pytest in its external mode: one run a file (a file that passes
    FILE_TIMEOUT_S loses only its own results), each test at most TEST_TIMEOUT_S where ``pytest-timeout``
    is installed beside the suite (some tests wait on a server's behaviour up to 10 minutes)."""
    timed = subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True, check=False).returncode == 0
    if not timed:
        print(f"{python} has no pytest-timeout: a test that waits stops only with its file", flush=True)
    out: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="brisk-peer-suite-") as scratch:
        env = {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": str(port), "LLAMA_CACHE": scratch}
        for name in files:
            report_file = Path(scratch) / f"{name}.xml"
            command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report_file}"]
            command += [f"--timeout={TEST_TIMEOUT_S}"] if timed else []
            child = subprocess.Popen(
                [*command, f"unit/{name}"], cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                child.wait(timeout=FILE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # pytest stops on SIGINT as on Ctrl+C and still writes the report of the tests it ran
                print(f"{name} on port {port} passed {FILE_TIMEOUT_S} s and was stopped", flush=True)
                stop(child, signal.SIGINT, 30)
            if report_file.is_file():
                out |= read_junit(report_file)
    return out


def read_junit(path: Path) -> dict[str, tuple[str, str]]:
    """pytest's JUnit XML as {``file::test``: (outcome, first line of the failure)}."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = "failed" if kind == "failure" else kind
                lines = (found.get("message") or found.text or "").strip().splitlines()
                message = lines[0][:160] if lines else ""
                break
        out[name] = (outcome, message)
    return out


class brisk_server:  # noqa: N801 (a context manager used as a function)
    """``brisk serve`` on the model of ``args`` in a child process with a fresh data folder; the port."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch = tempfile.TemporaryDirectory(prefix="brisk-peer-suite-data-")
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> int:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--quiet"]
        if self.args.model:
            command += ["--model", self.args.model]
        if getattr(self.args, "quant", None):
            command += ["--quant", self.args.quant]
        env = {**os.environ, "BRISK_DATA_DIR": self.scratch.name, "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"brisk serve ended with status {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return port
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"brisk serve was not ready after {READY_TIMEOUT_S} s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop(self.process, signal.SIGTERM, 30)
        self.scratch.cleanup()


def report(files: list[str], results: dict[str, dict[str, tuple[str, str]]], args: argparse.Namespace) -> dict:
    peer, brisk = results["peer"], results["brisk"]
    rows = []
    for f in files:
        names = sorted(n for n in set(peer) | set(brisk) if n.startswith(f + "::"))
        passed_peer = {n for n in names if peer.get(n, ("",))[0] == "passed"}
        passed_brisk = {n for n in names if brisk.get(n, ("",))[0] == "passed"}
        rows.append(
            [f, str(len(names)), str(len(passed_peer)), str(len(passed_brisk)), str(len(passed_peer - passed_brisk))]
        )
    total = [sum(int(r[i]) for r in rows) for i in range(1, 5)]
    rows.append(["all", *map(str, total)])
    head = ["test file", "tests", "pass on llama-server", "pass on Brisk", "pass on llama-server only"]
    print(f"\nllama.cpp's server tests (external mode), both servers on {args.model or 'the bundled model'}\n")
    print(markdown_table(head, rows))
    missed = sorted(n for n in peer if peer[n][0] == "passed" and brisk.get(n, ("",))[0] != "passed")
    if missed:
        print("\nPass on llama-server, fail on Brisk:")
        for name in missed:
            outcome, message = brisk.get(name, ("missing", ""))
            print(f"- {name}: {outcome}: {message}")
    data = {
        "files": files,
        "peer": {k: list(v) for k, v in peer.items()},
        "brisk": {k: list(v) for k, v in brisk.items()},
        "missed": missed,
        "totals": dict(zip(head[1:], total, strict=True)),
    }
    save("peer-suite", data, args.out)
    return data
