"""Several Brisk processes starting at once on one empty data folder (issue 22, defect 3).

Each converter or quantizer writes under a private name and publishes by rename, under a file lock:
every process answers (exit 0), there is one converted folder and one copy per mode, no temporary
folder is left, and the processes that waited said that another Brisk is preparing the model.  A
process killed in the middle of a conversion leaves nothing that breaks the next start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.hostile.conftest import BRISK
from tests.support import ROOT
from tests.support.brisk_cli import brisk
from tests.support.tiny import make_tiny_model

HANG_S = 600  # three real first starts share two cores: minutes, never this long
STARTS = 3  # one takes the lock and the other two wait on it: the sharing shows with three as with more
WAITED = "another brisk is preparing the model"


def start(data: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", BRISK_DATA_DIR=str(data), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [*BRISK, "ask", "hi", "--json", "--max-tokens", "2", "--no-answer-cache", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    deadline = time.monotonic() + HANG_S
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"{len(procs)} Brisk processes started together did not finish in {HANG_S} s")
        results.append((proc.returncode, out, err))
    return results


def answered(out: str) -> bool:
    return any(json.loads(line).get("type") == "done" for line in out.splitlines() if line.startswith("{"))


def leftovers(data: Path) -> list[str]:
    return sorted(str(p.relative_to(data)) for p in data.rglob("*") if ".tmp" in p.name)


def test_first_starts_at_once_share_one_conversion(data: Path) -> None:
    """The bundled GGUF converted once, and its fp16-cpu copy built once, for three processes.

    The mode is named: with ``auto`` each process would also time every mode on its own (about a minute of
    CPU each, nothing shared by it); the conversion and the copy are the steps the processes share."""
    results = finish([start(data, "--quant", "fp16-cpu") for _ in range(STARTS)])
    for code, out, err in results:
        assert code == 0 and answered(out), f"exit {code}: {err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
    models = data / "cache" / "models"
    assert len([p for p in models.iterdir() if p.is_dir()]) == 1, sorted(p.name for p in models.iterdir())
    copies = [p for p in models.rglob("fp16-cpu*") if p.is_dir()]  # <digest>/quant/fp16-cpu-float32
    assert len(copies) == 1 and (copies[0] / "quant.json").is_file(), copies
    assert leftovers(data) == []
    assert any(WAITED in err.lower() for _, _, err in results), "no process said it waited for another"
    assert sum(err.lower().count(WAITED) for _, _, err in results) <= 3 * len(results)  # once per lock at most


@pytest.mark.parametrize("quant", ["int8-cpu", "fp16-cpu"])
def test_first_starts_at_once_share_one_quantized_copy(data: Path, tmp_path: Path, quant: str) -> None:
    tiny = make_tiny_model(tmp_path / "tiny")
    results = finish([start(data, "--model", str(tiny), "--quant", quant) for _ in range(STARTS)])
    for code, out, err in results:
        assert code == 0 and answered(out), f"exit {code}: {err[-3000:]}"
    copies = [p for p in (data / "cache" / "quant").rglob("*") if p.is_dir() and p.name.startswith(quant)]
    assert len(copies) == 1 and (copies[0] / "quant.json").is_file() and (copies[0] / "model.safetensors").is_file()
    assert leftovers(data) == []


def dead_pid() -> int:
    """The pid of a process that has ended (as a killed Brisk's is)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_temporary_folders_of_killed_processes_are_removed(data: Path, tmp_path: Path) -> None:
    tiny = make_tiny_model(tmp_path / "tiny")
    first = brisk("ask", "hi", "--max-tokens", "2", "--no-answer-cache", "--model", str(tiny), "--quant", "int8-cpu",
                  data_dir=data)  # fmt: skip  # builds the copy (in this process: only the second run is the case)
    assert first.returncode == 0, first.stderr[-3000:]
    copy = next(p for p in (data / "cache" / "quant").rglob("int8-cpu-*") if p.is_dir())
    (copy / "quant.json").unlink()  # the copy must be built again, as after a kill before publishing
    stale = copy.with_name(f"{copy.name}.tmp-{dead_pid()}-0badc0de")
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a copy")
    code, out, err = finish([start(data, "--model", str(tiny), "--quant", "int8-cpu")])[0]
    assert code == 0 and answered(out), f"exit {code}: {err[-3000:]}"
    assert leftovers(data) == [] and (copy / "quant.json").is_file()


def start_and_kill(data: Path, after: str) -> None:
    """Start Brisk on ``data`` and kill -9 it once its stage has begun: something new appears under ``data/after``
    (not what an earlier, killed start left there)."""
    before = set((data / after).glob("*"))
    proc = start(data)
    deadline = time.monotonic() + HANG_S
    while set((data / after).glob("*")) <= before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # polling for the stage to begin, not waiting a fixed time
    assert proc.poll() is None, f"the start ended before it could be killed: {proc.communicate()[1][-3000:]}"
    assert set((data / after).glob("*")) - before, f"the start never reached {after} in {HANG_S} s"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_first_starts_killed_midway_leave_nothing_that_breaks_the_next(data: Path) -> None:
    """kill -9 once the conversion has begun (lock taken), then kill the next start once its folder is being
    written: that start got past the dead one's lock, and the start after both converts again and answers
    (``--quant none``: the auto probe's timing of every mode is no part of it).  One folder for both kills:
    each case alone would pay a whole conversion for its next start."""
    start_and_kill(data, "locks")
    start_and_kill(data, "cache/models")
    code, out, err = finish([start(data, "--quant", "none")])[0]
    assert code == 0 and answered(out), f"exit {code}: {err[-3000:]}"
    assert "Traceback" not in err and leftovers(data) == []
