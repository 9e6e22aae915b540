"""``brisk bench peer-suite``'s reading of the suite's JUnit report and its comparison of the two servers."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.bench import peer_suite

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="unit.test_tokenize" name="test_tokenize_detokenize" time="0.1"/>
<testcase classname="unit.test_tokenize" name="test_tokenize_with_bos" time="0.1">
  <failure message="assert 1780 == 1&#10;second line">trace</failure></testcase>
<testcase classname="unit.test_completion" name="test_stream[a]" time="0.1"><error message="boom">x</error></testcase>
<testcase classname="unit.test_completion" name="test_lora" time="0.0"><skipped message="no lora"/></testcase>
</testsuite></testsuites>"""


def test_the_report_lists_what_passes_on_the_peer_and_fails_on_brisk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    brisk = peer_suite.read_junit(path)
    assert brisk == {
        "test_tokenize.py::test_tokenize_detokenize": ("passed", ""),
        "test_tokenize.py::test_tokenize_with_bos": ("failed", "assert 1780 == 1"),
        "test_completion.py::test_stream[a]": ("error", "boom"),
        "test_completion.py::test_lora": ("skipped", "no lora"),
    }
    peer = dict(brisk) | {"test_completion.py::test_stream[a]": ("passed", "")}
    args = argparse.Namespace(model=None, out=str(tmp_path / "out.json"))
    data = peer_suite.report(["test_tokenize.py", "test_completion.py"], {"peer": peer, "brisk": brisk}, args)
    out = capsys.readouterr().out
    assert "| test_completion.py | 2     | 1                    | 0             | 1" in out
    assert data["missed"] == ["test_completion.py::test_stream[a]"]
    assert "- test_completion.py::test_stream[a]: error: boom" in out
    assert data["totals"]["pass on llama-server only"] == 1 and (tmp_path / "out.json").is_file()


def test_it_says_what_it_needs(tmp_path: Path) -> None:
    args = argparse.Namespace(scenario="peer-suite", suite=str(tmp_path), peer=None, suite_python=None, only="")
    with pytest.raises(SystemExit, match="tools/server/tests"):
        peer_suite.run(args)
    skipped = peer_suite.run(argparse.Namespace(**{**vars(args), "scenario": "all"}))
    assert skipped == {"skipped": "no --suite or --peer"}


def test_a_file_stopped_at_its_time_limit_keeps_the_results_of_the_tests_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp test file that runs past FILE_TIMEOUT_S (its completion tests took over 10 minutes on the
    peer) is stopped as by Ctrl+C: the tests that finished are counted, not lost with the file."""
    (tmp_path / "unit").mkdir()
    (tmp_path / "utils.py").write_text("")
    started = tmp_path / "forever-started"
    (tmp_path / "unit" / "test_completion.py").write_text(
        "import pathlib, time\n\ndef test_quick():\n    assert True\n\n"
        f"def test_forever():\n    pathlib.Path({str(started)!r}).touch()\n    time.sleep(600)\n"
    )

    class LimitReached(subprocess.Popen):  # type: ignore[type-arg]
        """The file's time limit comes once its endless test has started (not after a fixed time)."""

        def wait(self, timeout: float | None = None) -> int:
            if timeout == peer_suite.FILE_TIMEOUT_S:
                for _ in range(600):
                    if started.exists():
                        break
                    time.sleep(0.05)
                raise subprocess.TimeoutExpired(self.args, timeout)
            return super().wait(timeout)

    monkeypatch.setattr(peer_suite.subprocess, "Popen", LimitReached)
    monkeypatch.setattr(peer_suite, "TEST_TIMEOUT_S", 600)
    got = peer_suite.outcomes(sys.executable, tmp_path, ["test_completion.py"], 1)
    assert got["test_completion.py::test_quick"] == ("passed", "")
