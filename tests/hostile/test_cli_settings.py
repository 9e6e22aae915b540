"""The CLI reads ``settings.json`` as the README says: every flag left out takes the setting, a flag given wins,
and a broken settings file is one warning and the defaults, never a stopped command.

What a request carries is read where it arrives: a replay server at ``--base-url`` records the request body
(system prompt, max_tokens, top_p), and the tiny local model reports its tool calls and token counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.streams.replay import ReplayServer

SETTINGS = {"system_prompt": "Speak like a pirate.", "max_tokens": 7, "top_p": 0.5, "temperature": 0.9}


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    s.close()


def evs(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]


def test_the_settings_shape_a_request_and_flags_override_them(server: ReplayServer, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    (data / "settings.json").write_text(json.dumps(SETTINGS))
    run = cli("ask", "Hi", "--base-url", server.url, "--json", data_dir=data, timeout=60)
    assert run.returncode == 0, run.stderr
    body = server.requests[-1]
    assert body["messages"][0] == {"role": "system", "content": "Speak like a pirate."}
    assert (body["max_tokens"], body["top_p"]) == (7, 0.5)
    assert body["temperature"] == 0, "the CLI stays greedy unless --temperature says otherwise (README)"
    run = cli(
        "ask", "Hi", "--base-url", server.url, "--json", "--system", "Be brief.", "--max-tokens", "5",
        "--top-p", "0.9", data_dir=data, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    body = server.requests[-1]
    assert body["messages"][0]["content"] == "Be brief." and (body["max_tokens"], body["top_p"]) == (5, 0.9)


def test_without_a_settings_file_nothing_changes(server: ReplayServer, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    run = cli("ask", "Hi", "--base-url", server.url, "--json", data_dir=data, timeout=60)
    assert run.returncode == 0, run.stderr
    body = server.requests[-1]
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["max_tokens"] == 512


@pytest.mark.parametrize(
    "content",
    [
        b"{ this is not json",
        b"[" * 100_000 + b"]" * 100_000,  # nested too deep for the parser
        json.dumps({"max_tokens": "seven", "top_p": [1], "system_prompt": 3}).encode(),  # the wrong shapes
        b"\xff\xfe\x00 not utf-8",
    ],
    ids=["not-json", "deep", "wrong-shapes", "binary"],
)
def test_a_broken_settings_file_is_a_warning_and_the_defaults(
    content: bytes,
    server: ReplayServer,
    data: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    (data / "settings.json").write_bytes(content)
    run = cli("ask", "Hi", "--base-url", server.url, data_dir=data, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:") and "settings.json" in line]
    assert warnings, run.stderr
    body = server.requests[-1]
    assert body["max_tokens"] == 512 and body["top_p"] == 1.0
    again = cli("ask", "Hi", "--base-url", server.url, data_dir=data, timeout=60)
    assert again.returncode == 0, again.stderr  # the next run works too


def test_local_settings_enable_tools_and_set_the_length(tiny_dir: Path, tmp_path: Path, data: Path, cli) -> None:  # type: ignore[no-untyped-def]
    settings = {
        "max_tokens": 3,
        "tools_enabled": ["calculator", "no-such-tool"],  # a name nothing lists enables nothing, as in the window
        "granted_dirs": [str(tmp_path / "gone")],  # a folder that no longer exists: left out with a warning
        "speculative": "off",
        "answer_cache": False,
    }
    (data / "settings.json").write_text(json.dumps(settings))
    run = cli("ask", "/calculator 6*7", "--model", str(tiny_dir), "--json", data_dir=data, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    out = evs(run.stdout)
    tool = next(e for e in out if e["type"] == "tool")
    assert (tool["name"], tool["ok"], tool["result"]) == ("calculator", True, "42")
    assert out[-1]["type"] == "done" and out[-1]["metrics"]["completion_tokens"] == 3
    assert any(e["type"] == "warning" and "gone" in e["message"] for e in out)
    run = cli("ask", "hi", "--model", str(tiny_dir), "--json", "--max-tokens", "2", data_dir=data, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert evs(run.stdout)[-1]["metrics"]["completion_tokens"] == 2
