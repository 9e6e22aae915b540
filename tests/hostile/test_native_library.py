"""A damaged native decode step library cannot take Brisk down (issue #22, defect 2).

Each case copies the built extension (``engine.quant.native.built_copy()``) into a private
``TORCH_EXTENSIONS_DIR``, damages it, and runs the real processes: ``python -m
engine.quant.native`` (what ``make`` runs first), ``brisk doctor`` and ``brisk ask``.  Each
must exit normally (never SIGBUS) within a bound, say what happened in a line, and leave
the library rebuilt and verified, or say how to rebuild it; the next run must work.
Rebuilds here relink the copied object files (seconds); the session's copy is rebuilt once
first, and one case builds from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.quant import native
from tests.hostile.conftest import Run, run_cli, run_python
from tests.support import ROOT

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: the eager path runs")

BOUND = 300.0  # a relink takes seconds; past this a run has hung
BUILD_BOUND = 900.0  # a build from scratch takes about 30 s on a quiet machine


def run_native(data: Path, root: Path, *args: str, timeout: float = BOUND, **env: str) -> Run:
    """``python -m engine.quant.native ARGS`` on ``data`` with extensions in ``root``."""
    return run_python(
        ["-m", "engine.quant.native", *args], data, timeout, env={"TORCH_EXTENSIONS_DIR": str(root), **env}
    )


def doctor_line(run: Run) -> str:
    lines = [line for line in run.stdout.splitlines() if "native decode step:" in line]
    assert len(lines) == 1, run.stdout + run.stderr
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_verified(folder: Path, so: Path) -> None:
    """The library on disk is the one whose test load passed."""
    record = json.loads((folder / native.RECORD).read_text())
    assert record["sha256"] == sha256(so), "the record does not describe the library on disk"


@pytest.fixture(scope="session")
def verified_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This machine's built extension, copied to a private extensions folder and verified there once."""
    built = native.built_copy()
    assert built is not None, native.status()
    root = tmp_path_factory.mktemp("extensions")
    folder = root / built.parent.name
    shutil.copytree(built.parent, folder)
    for leftover in (native.RECORD, native.RECORD + ".bad", "lock"):
        (folder / leftover).unlink(missing_ok=True)
    done = run_native(tmp_path_factory.mktemp("data"), root)
    assert done.returncode == 0 and "built and verified" in done.stdout, done.stdout + done.stderr
    assert_verified(folder, built)  # the same bytes: verifying does not rebuild
    # The cases relink (seconds) only where ninja finds the object files newer than this checkout's
    # sources.  The copy may come from another checkout or an older clone (same sources: the folder's name
    # hashes their bytes; other times), and ninja would compile every case from scratch (about a minute
    # each).  Its records are made current; where ninja still wants to compile, the copy is rebuilt once.
    if not make_current(folder):
        truncate_half(folder / built.name)
        done = run_native(tmp_path_factory.mktemp("data"), root, timeout=BUILD_BOUND)
        assert done.returncode == 0 and "rebuilt and verified" in done.stdout, done.stdout + done.stderr
    return folder


def make_current(folder: Path) -> bool:
    """Stamp the copy's outputs and ninja's records of them (``.ninja_log`` v5+, ``.ninja_deps`` v4) with
    the time now; true where ninja then has nothing to compile.  Sound because the folder's name hashes the
    sources' bytes: its objects are these sources' objects, whatever the files' times say (a clone's
    sources are newer than the build ``make native`` made from them).  False for a build made from another
    checkout: torch writes the build file again with this checkout's paths, every command changes, and
    ninja would compile each case from scratch (seven cases of about 45 s on CI).  Any format not known:
    false."""
    now = time.time_ns()
    log, deps = folder / ".ninja_log", folder / ".ninja_deps"
    try:
        if f" {ROOT / 'engine' / 'quant'}{os.sep}" not in (folder / "build.ninja").read_text():
            return False
        lines = log.read_text().splitlines()
        if not lines or not lines[0].startswith("# ninja log v"):
            return False
        stamped = [lines[0]]
        for line in lines[1:]:
            start, end, _mtime, output, command = line.split("\t")
            os.utime(folder / output, ns=(now, now))
            stamped.append("\t".join((start, end, str(now), output, command)))
        log.write_text("\n".join(stamped) + "\n")
        data = bytearray(deps.read_bytes())
        if data[:16] != b"# ninjadeps\n\x04\x00\x00\x00":
            return False
        at = 16
        while at < len(data):
            (head,) = struct.unpack_from("<I", data, at)
            size = head & 0x7FFFFFFF
            if head & 0x80000000:  # a deps record: output id, mtime (64 bits), input ids
                struct.pack_into("<q", data, at + 8, now)
            at += 4 + size
        deps.write_bytes(bytes(data))
    except (OSError, ValueError, struct.error):
        return False
    plan = subprocess.run(
        [str(Path(sys.executable).parent / "ninja"), "-n", "-C", str(folder)], capture_output=True, text=True
    )
    return plan.returncode == 0 and "no work to do" in plan.stdout


@pytest.fixture
def ext(tmp_path: Path, verified_copy: Path) -> tuple[Path, Path, Path]:
    """(extensions root, build folder, library) for one case: a verified copy to damage."""
    root = tmp_path / "extensions"
    folder = root / verified_copy.name
    shutil.copytree(verified_copy, folder)
    return root, folder, folder / f"{verified_copy.name}.so"


def truncate_half(so: Path) -> None:
    os.truncate(so, so.stat().st_size // 2)


def truncate_empty(so: Path) -> None:
    os.truncate(so, 0)


def random_bytes(so: Path) -> None:
    so.write_bytes(random.Random(22).randbytes(so.stat().st_size))


def foreign_library(so: Path) -> None:
    shutil.copyfile(torch._C.__file__, so)  # a valid shared library, but not this one


Damage = Callable[[Path], None]


@pytest.mark.parametrize(
    ("damage", "keep_record", "first"),
    [
        (truncate_half, True, "native"),
        (truncate_empty, False, "doctor"),
        (random_bytes, True, "doctor"),
        (foreign_library, False, "native"),
    ],
    ids=["half-recorded-native", "empty-unrecorded-doctor", "random-recorded-doctor", "foreign-unrecorded-native"],
)
def test_a_damaged_library_is_rebuilt_not_loaded(
    data: Path, ext: tuple[Path, Path, Path], damage: Damage, keep_record: bool, first: str
) -> None:
    root, folder, so = ext
    damage(so)
    if not keep_record:  # a copy built before records were kept: it is test-loaded in a child first
        (folder / native.RECORD).unlink()
    env = {"TORCH_EXTENSIONS_DIR": str(root)}
    if first == "native":
        done = run_native(data, root)
        assert done.returncode == 0, done.stdout + done.stderr  # not -7/135: no SIGBUS
        line = done.stdout
    else:
        done = run_cli("doctor", data_dir=data, timeout=BOUND, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        line = doctor_line(done)
    assert "rebuilt and verified" in line, done.stdout + done.stderr
    assert ("checksum" in line) if keep_record else ("test load" in line), line
    assert_verified(folder, so)
    # the next run (the other command) loads it at once
    if first == "native":
        doctor = run_cli("doctor", data_dir=data, timeout=BOUND, env=env)
        assert doctor.returncode == 0 and "built and verified (" in doctor_line(doctor), doctor.stderr
    else:
        again = run_native(data, root)
        assert again.returncode == 0 and "native decode step: built and verified (" in again.stdout, again.stderr


def test_brisk_ask_answers_over_a_truncated_library(data: Path, ext: tuple[Path, Path, Path], tiny_dir: Path) -> None:
    root, folder, so = ext
    truncate_half(so)
    env = {"TORCH_EXTENSIONS_DIR": str(root)}
    done = run_cli(
        "ask", "hi", "--model", str(tiny_dir), "--quant", "fp16-cpu", "--max-tokens", "4", "--json",
        data_dir=data, timeout=BOUND, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"type": "done"' in done.stdout
    assert "does not match the checksum" in done.stderr and "rebuilding" in done.stderr
    # the rebuild it started (in the background) finishes or is finished by the next run
    again = run_native(data, root)
    assert again.returncode == 0 and "verified" in again.stdout, again.stdout + again.stderr
    assert_verified(folder, so)


@pytest.mark.parametrize("record", ["[1, 2]", "junk{{{", '{"name": "x", "sha256": "../../etc"}', "{" * 100_000])
def test_a_damaged_record_is_moved_aside_and_the_library_verified_again(
    data: Path, ext: tuple[Path, Path, Path], record: str
) -> None:
    root, folder, so = ext
    before = sha256(so)
    (folder / native.RECORD).write_text(record)
    done = run_native(data, root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "built and verified (test-loaded now" in done.stdout, done.stdout + done.stderr
    assert (folder / (native.RECORD + ".bad")).read_text() == record
    assert sha256(so) == before  # verified again, not rebuilt
    assert_verified(folder, so)


def test_without_a_compiler_a_damaged_library_is_removed_and_the_message_says_how_to_rebuild(
    data: Path, ext: tuple[Path, Path, Path]
) -> None:
    root, folder, so = ext
    truncate_half(so)
    done = run_native(data, root, CXX="/nonexistent/c++")
    assert done.returncode == 0, done.stdout + done.stderr  # make run goes on: the eager path runs
    assert "no C++ compiler" in done.stderr and "python -m engine.quant.native" in done.stderr, done.stderr
    assert not so.exists()  # nobody can load the damaged copy
    doctor = run_cli("doctor", data_dir=data, timeout=BOUND, env={"TORCH_EXTENSIONS_DIR": str(root), "CXX": "/no/c++"})
    assert doctor.returncode == 0 and "unavailable (no C++ compiler" in doctor_line(doctor), doctor.stderr
    fixed = run_native(data, root)  # with the compiler back, as the message says
    assert fixed.returncode == 0 and "built now and verified" in fixed.stdout, fixed.stdout + fixed.stderr
    assert_verified(folder, so)


def test_a_build_that_fails_with_a_compiler_stops_make_with_one_line(data: Path, ext: tuple[Path, Path, Path]) -> None:
    root, folder, so = ext
    truncate_half(so)
    done = run_native(data, root, CXX=shutil.which("false") or "/bin/false")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unavailable (" in lines[0] and "To retry: python -m engine.quant.native" in lines[0]
    assert not so.exists() or not (folder / native.RECORD).exists()  # never loadable unverified
    doctor = run_cli("doctor", data_dir=data, timeout=BOUND, env={"TORCH_EXTENSIONS_DIR": str(root), "CXX": "false"})
    assert doctor.returncode == 0 and "unavailable (" in doctor_line(doctor), doctor.stderr


def test_two_processes_repair_one_library_once(data: Path, ext: tuple[Path, Path, Path]) -> None:
    root, folder, so = ext
    random_bytes(so)
    env = dict(os.environ, BRISK_DATA_DIR=str(data), TORCH_EXTENSIONS_DIR=str(root))
    command = [sys.executable, "-m", "engine.quant.native"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)]
    runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    outputs = [run.communicate(timeout=BOUND) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    statuses = [out for out, _ in outputs]
    assert all("verified" in status for status in statuses), outputs
    assert sum("rebuilt" in status for status in statuses) == 1, outputs  # the second waited, then loaded it
    assert_verified(folder, so)


def test_a_damaged_object_file_and_a_stale_baton_lead_to_a_build_from_scratch(
    data: Path, ext: tuple[Path, Path, Path]
) -> None:
    root, folder, so = ext
    truncate_half(so)
    (folder / "native_step.o").write_bytes(b"\0" * 64)  # relinking cannot repair it
    (folder / "lock").touch()  # torch's build baton, left by a killed build: it waited on this for ever
    done = run_native(data, root, timeout=BUILD_BOUND)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rebuilt and verified" in done.stdout and not (folder / "lock").exists()
    assert_verified(folder, so)
    again = run_native(data, root)
    assert again.returncode == 0 and "built and verified (" in again.stdout
