"""Bad input on the real CLI: refused up front with a message naming what to change, a non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.brisk_cli import brisk, events

EXIT_REQUEST = 3


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--stop", ""),
        ("--max-tokens", "0"),
        ("--max-tokens", "-1"),
        ("--repetition-penalty", "0"),
        ("--top-k", "-3"),
        ("--temperature", "nan"),
        ("--temperature", "-1"),
        ("--top-p", "0"),
        ("--seed", str(2**64)),
        ("--seed", "-5"),
        ("--quant", "int3-cpu"),
        ("--draft-quant", "int3-cpu"),
        ("--speculative", "draft"),
    ],
)
def test_bad_values_are_refused_before_loading(flag: str, value: str, tmp_path: Path) -> None:
    # a model that does not exist: had the CLI tried to load it, the message would be "not found"
    run = brisk("ask", "hi", "--model", str(tmp_path / "no-model.gguf"), "--json", flag, value)
    assert run.returncode == EXIT_REQUEST, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    message = events(run.stdout)[-1]["message"]
    assert flag in message and "not found" not in message


def test_every_problem_is_listed_at_once() -> None:
    run = brisk("ask", "hi", "--max-tokens", "0", "--top-k", "-1", "--stop", "")
    assert run.returncode == EXIT_REQUEST
    assert all(f in run.stderr for f in ("--max-tokens", "--top-k", "--stop")), run.stderr
    assert "Traceback" not in run.stderr


def test_chat_stdin_that_is_not_utf8_ends_with_a_message(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "chat", "--model", str(tiny_dir), "--json", "--max-tokens", "3",
        stdin=b"hello\nCaf\xe9 \xff\nnever read\n", data_dir=tmp_path,
    )  # fmt: skip
    assert run.returncode == EXIT_REQUEST
    assert "Traceback" not in run.stderr
    evs = events(run.stdout)
    assert [e["type"] for e in evs].count("done") == 1, "the line before the bad one is answered"
    assert evs[-1]["type"] == "error"
    assert "Line 2 of standard input" in evs[-1]["message"] and "UTF-8" in evs[-1]["message"]


def test_ask_argument_that_is_not_utf8_is_refused() -> None:
    run = brisk("ask", b"Caf\xe9 \xff", child=True)  # the bytes as a real process's argv carries them
    assert run.returncode == EXIT_REQUEST
    assert "prompt argument is not valid UTF-8" in run.stderr and "Traceback" not in run.stderr


def test_system_file_from_dev_zero_or_a_huge_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    run = brisk("ask", "hi", "--system", "@/dev/zero")
    assert run.returncode == EXIT_REQUEST
    assert "character device, not a regular file" in run.stderr and "Traceback" not in run.stderr
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as file:
        file.truncate(10 << 30)  # 10 GB, sparse: costs nothing on disk
    run = brisk("ask", "hi", "--system", f"@{huge}")
    assert run.returncode == EXIT_REQUEST
    assert "larger than 1 MB" in run.stderr and "Traceback" not in run.stderr


def test_system_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Tu es un assistant français.".encode("latin-1"))
    run = brisk("ask", "hi", "--json", "--system", f"@{path}")
    assert run.returncode == EXIT_REQUEST
    message = events(run.stdout)[-1]["message"]
    assert str(path) in message and "not valid UTF-8" in message and "iconv" in message


def test_missing_system_file_is_refused(tmp_path: Path) -> None:
    run = brisk("ask", "hi", "--system", f"@{tmp_path / 'nope.txt'}")
    assert run.returncode == EXIT_REQUEST
    assert "Cannot read the system prompt file" in run.stderr and "Traceback" not in run.stderr
