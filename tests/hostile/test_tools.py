"""Hostile tools: special files, misbehaving MCP servers, huge results and arguments, through the real CLI.

Special files (a FIFO, a symlink to one, a socket, a character device) are
refused before they are opened, by the files tool and by ``--system @FILE``;
no thread is left blocked.  An MCP server that prints garbage gives one
summary line, a 50 MB reply fails its call at once, and a long result is cut
in tokens to a quarter of the context.  A 1 MB argument is cut in the printed
``[tool ...]`` line.  Each run is bounded (``cli``'s timeout catches a hang).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.runtime.tool_turns import RESULT_SHARE, fit_results
from engine.tools import Call, Registry, run_calls
from engine.tools.files import files_tool
from engine.tools.run import CallResult, TurnResult
from tests.support import mcp_servers

HOSTILE = Path(mcp_servers.__file__).with_name("hostile.py")
HANG_S = 120  # a run past this has hung


def evs(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]


def tools_of(out: str) -> list[dict]:
    return [e for e in evs(out) if e["type"] == "tool"]


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[Path]:
    """A granted folder with a FIFO, a symlink to it, a socket and one text file."""
    folder = tmp_path / "granted"
    folder.mkdir()
    os.mkfifo(folder / "pipe")
    (folder / "link-to-pipe").symlink_to(folder / "pipe")
    (folder / "notes.txt").write_text("the secret word is marmalade\n")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock"))
    try:
        yield folder
    finally:
        sock.close()


def test_files_tool_refuses_special_files_at_once_and_leaves_no_thread(specials: Path) -> None:
    registry = Registry([files_tool([specials], timeout_s=30.0)])
    registry.enable("files")
    names = ["pipe", "link-to-pipe", "sock"]
    turn = run_calls([Call("files", {"path": n}) for n in names], registry)
    for name, result in zip(names, turn.results, strict=True):
        assert not result.ok, f"{name} was read: {result.text!r}"
        assert "not a regular file" in result.text, result.text
    assert "named pipe (FIFO)" in turn.results[0].text and "socket" in turn.results[2].text
    assert turn.wall_s < 30.0, "a call waited out its timeout: the FIFO was opened"
    for thread in [t for t in threading.enumerate() if t.name == "tool:files"]:
        thread.join(timeout=5.0)  # a refused call's thread ends at once; one blocked in open() would not
        assert not thread.is_alive(), "a files call is still blocked"
    listing, found = run_calls(
        [Call("files", {"path": ""}), Call("files", {"search": "marmalade"})], registry
    ).results  # a listing names what each entry is; a search skips the specials and finds the text
    assert "pipe (a named pipe (FIFO), not readable)" in listing.text and "sock (a socket" in listing.text
    assert found.ok and "notes.txt:1:" in found.text


def test_files_tool_refuses_a_character_device_in_a_granted_folder() -> None:
    registry = Registry([files_tool(["/dev"], timeout_s=30.0)])  # /dev is full of devices nobody should read
    registry.enable("files")
    (result,) = run_calls([Call("files", {"path": "zero"})], registry).results
    assert not result.ok and "character device, not a regular file" in result.text


def test_files_tool_through_the_cli(specials: Path, tiny_dir: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    lines = "\n".join(f'/files {{"path": "{n}"}}' for n in ("pipe", "link-to-pipe", "sock", "notes.txt"))
    run = cli(
        "ask", lines, "--model", str(tiny_dir), "--tools", "files", "--grant", str(specials),
        "--json", "--max-tokens", "1", data_dir=data, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    by_path = {e["arguments"]["path"]: e for e in tools_of(run.stdout)}
    pipe, link, sock, notes = (by_path[n] for n in ("pipe", "link-to-pipe", "sock", "notes.txt"))
    for refused in (pipe, link, sock):
        assert not refused["ok"] and "not a regular file" in refused["result"]
        assert refused["end"] - refused["start"] < 5.0, "refused before it was opened, not after a timeout"
    assert notes["ok"] and "marmalade" in notes["result"]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "socket", "huge"])
def test_system_file_that_is_special_or_huge_is_refused_at_once(kind: str, tmp_path: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "system.txt"
    sock = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        with path.open("wb") as file:
            file.truncate(10 << 30)  # sparse: 10 GB that costs nothing
    try:
        run = cli("ask", "hi", "--model", str(tmp_path / "no-model"), "--system", f"@{path}", data_dir=data, timeout=60)
    finally:
        if sock is not None:
            sock.close()
    assert run.returncode == 3, run.stderr
    expected = "larger than 1 MB" if kind == "huge" else "not a regular file"
    assert expected in run.stderr and str(path) in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("flags", [["--garbage", "500"], ["--garbage", "300", "--binary"], ["--flood", "20"]])
def test_a_garbage_printing_mcp_server_gives_one_summary_line(
    flags: list[str],
    tiny_dir: Path,
    data: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    server = " ".join([sys.executable, str(HOSTILE), *flags])
    run = cli(
        "ask", '/words {"count": 3}', "--model", str(tiny_dir), "--mcp", server, "--tools", "all",
        "--json", "--max-tokens", "1", data_dir=data, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (words,) = tools_of(run.stdout)
    assert words["ok"] and words["result"] == "word0 word1 word2", "the server still works"
    summaries = [line for line in run.stderr.splitlines() if "MCP server" in line and "dropped" in line]
    assert len(summaries) == 1, run.stderr[-3000:]
    assert "hostile" in summaries[0]
    assert ("lines on stdout" in summaries[0]) if "--garbage" in flags else ("over 4 MB" in summaries[0])
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) < 60


def test_a_50_mb_mcp_result_fails_its_call_at_once_and_the_reply_goes_on(tiny_dir: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    server = f"{sys.executable} {HOSTILE}"
    run = cli(
        "ask", '/big {"megabytes": 50}\nWhat did it say?', "--model", str(tiny_dir), "--mcp", server,
        "--tools", "all", "--json", "--max-tokens", "4", data_dir=data, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (big,) = tools_of(run.stdout)
    assert not big["ok"] and "more than the 4 MB" in big["result"], big["result"][:500]
    assert big["end"] - big["start"] < 25.0, "failed when the line ended, not at the call's 30 s timeout"
    done = evs(run.stdout)[-1]
    assert done["type"] == "done" and done["metrics"]["completion_tokens"] == 4


def test_a_long_result_is_cut_in_tokens_to_a_share_of_the_context(tiny_dir: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    server = f"{sys.executable} {HOSTILE}"
    run = cli(
        "ask", '/words {"count": 20000}\nWhat did it say?', "--model", str(tiny_dir), "--mcp", server,
        "--tools", "all", "--json", "--max-tokens", "4", data_dir=data, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (words,) = tools_of(run.stdout)
    assert words["ok"] and len(words["result"]) > 30_000  # what the tool sent (cut to 32,000 characters)
    done = evs(run.stdout)[-1]
    context = 512  # the tiny model's
    # the question, the template and a quarter of the context; uncut, the result fills the prompt's whole budget
    assert done["metrics"]["prompt_tokens"] < context // 2, done["metrics"]


def test_fit_results_cuts_each_result_to_its_share_of_the_context(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    long, short = " ".join(f"w{i}" for i in range(5000)), "fine"
    results = tuple(CallResult(n, {}, 0.0, 0.1, True, t) for n, t in (("a", long), ("b", short), ("c", long)))
    turn = fit_results(TurnResult(results, 0.0, 0.1, True), tokenizer, 2400)
    a, b, c = turn.results
    share = 2400 // RESULT_SHARE // 3
    for cut in (a, c):
        ids = tokenizer(cut.text, add_special_tokens=False)["input_ids"]
        assert len(ids) <= share + 2 and "[cut from" in cut.text and cut.text.startswith("w0 w1")
    assert b.text == short
    assert fit_results(turn, None, 2400) is turn


def test_a_1_mb_argument_is_cut_in_the_printed_line(tiny_dir: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    expression = "+".join(["1"] * 500_000)  # 1 MB: through standard input (one argv string is capped at 128 kB)
    run = cli(
        "chat", "--model", str(tiny_dir), "--tools", "calculator", "--max-tokens", "1",
        stdin=f"/calculator {expression}\n", data_dir=data, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("[tool calculator")]
    assert len(line) < 3000 and "more characters]" in line
    assert f"{len(json.dumps({'expression': expression})) - 300:,} more characters" in line
