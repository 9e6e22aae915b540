"""``brisk ask|chat|compare --base-url`` through the real CLI against the replay server (support/streams/replay.py).

The server runs in this process; so does the CLI (``tests/support/brisk_cli.py``), which reaches it
over HTTP on 127.0.0.1.  Every fault ends in a JSON error event with a clear
message, the partial reply kept in ``partial_text``, a non-zero exit and no
trace of the API key in anything printed.  (DNS failures are tested in
test_remote.py, where the resolver can be answered without reaching a real one.)
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import brisk_cli
from tests.support.brisk_cli import Run
from tests.support.streams.replay import Handler, ReplayServer, events, models_of

KEY = "sk-brisk-cli-test-0123456789abcdef"
ANSWER = "The capital of France is Paris."


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    s.close()


def brisk(*args: str, stdin: str | None = None, key: str | None = KEY, data_dir: Path | None = None) -> Run:
    """``brisk ARGS`` with the API key in BRISK_API_KEY (``key=None``: unset)."""
    return brisk_cli.brisk(*args, stdin=stdin, data_dir=data_dir, env={"BRISK_API_KEY": key or None}, timeout=120)


def parse(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def no_key(run: Run) -> None:
    for text in (run.stdout, run.stderr):
        assert KEY not in text and KEY[:12] not in text


def test_ask_against_a_server(server: ReplayServer) -> None:
    run = brisk("ask", "What is the capital of France?", "--base-url", server.url, "--json")
    assert run.returncode == 0, run.stderr
    evs = parse(run.stdout)
    assert [e["type"] for e in evs] == ["started"] + ["token"] * 7 + ["done"]
    assert all(isinstance(e["t"], float) for e in evs)
    done = evs[-1]
    assert done["text"] == ANSWER == "".join(e["text"] for e in evs if e["type"] == "token")
    assert done["metrics"]["completion_tokens"] == 7 and done["metrics"]["ttft_s"] <= done["metrics"]["total_s"]
    body = server.requests[-1]
    assert body["messages"] == [{"role": "user", "content": "What is the capital of France?"}]
    assert body["temperature"] == 0, "the CLI is greedy unless told"
    auth = [v for h in server.headers_seen for k, v in h.items() if k.lower() == "authorization"]
    assert auth and set(auth) == {f"Bearer {KEY}"}
    no_key(run)


def test_api_key_flag_and_plain_text_output(server: ReplayServer) -> None:
    run = brisk("ask", "hi", "--base-url", server.url, "--api-key", "sk-from-the-flag", key=None)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ANSWER and "TTFT" in run.stderr
    auth = {v for h in server.headers_seen for k, v in h.items() if k.lower() == "authorization"}
    assert auth == {"Bearer sk-from-the-flag"}


def test_chat_sends_the_history(server: ReplayServer) -> None:
    server.models = models_of("ollama.models.json")
    run = brisk(
        "chat", "--base-url", server.url, "--model", "llama3.2:1b", "--system", "Be brief.", "--json",
        stdin="first question\n\nsecond question\n",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert [e["text"] for e in parse(run.stdout) if e["type"] == "done"] == [ANSWER, ANSWER]
    assert [b["model"] for b in server.requests] == ["llama3.2:1b"] * 2
    assert server.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "second question"},
    ]


def test_compare_against_a_server(server: ReplayServer) -> None:
    run = brisk(
        "compare", "Capital of France?", "--base-url", server.url, "--config", "stream=on", "--config", "stream=off",
        "--runs", "1", "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = parse(run.stdout)
    assert [r["config"]["stream"] for r in rows] == ["on", "off"]
    assert all(r["type"] == "compare" and r["text"] == ANSWER and r["identical"] for r in rows)
    assert len(server.requests) == 4, "a warm-up and one measured run per configuration"
    refused = brisk("compare", "x", "--base-url", server.url, "--config", "quant=int8-cpu", "--json")
    assert refused.returncode == 3 and "only stream=on/off" in parse(refused.stdout)[-1]["message"]


def test_flags_a_server_cannot_honour_are_refused_before_connecting(server: ReplayServer) -> None:
    run = brisk("ask", "hi", "--base-url", server.url, "--quant", "int8-cpu", "--tools", "calculator", "--json")
    assert run.returncode == 3
    message = parse(run.stdout)[-1]["message"]
    assert "--quant, --tools apply to the local engine only" in message
    for bad in ("ftp://127.0.0.1/v1", "127.0.0.1:8080"):
        run = brisk("ask", "hi", "--base-url", bad, "--json")
        assert run.returncode == 3 and "http:// or https://" in parse(run.stdout)[-1]["message"]
    run = brisk("ask", "hi", "--api-key", KEY, "--json")
    assert run.returncode == 3 and "only for a server" in parse(run.stdout)[-1]["message"]
    no_key(run)
    assert server.requests == [] and server.headers_seen == []


# -- faults --------------------------------------------------------------------------------------


def fault(server: ReplayServer, chat: object, *extra: str, code: int = 3) -> dict:
    """Run ``ask`` against a server playing ``chat``; the last event is the error, returned."""
    server.chat = chat  # type: ignore[assignment]
    run = brisk("ask", "What is the capital of France?", "--base-url", server.url, "--json", *extra)
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    no_key(run)
    error = parse(run.stdout)[-1]
    assert error["type"] == "error" and isinstance(error["t"], float) and "partial_text" in error
    return error


def first(n: int) -> list[bytes]:
    return events("llamacpp.sse")[:n]


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nothing listens there
    run = brisk("ask", "hi", "--base-url", f"http://127.0.0.1:{port}/v1", "--json")
    assert run.returncode == 2
    assert re.search("Connection refused.*Is the server running", parse(run.stdout)[-1]["message"])


def test_unknown_model_names_the_ones_there_are(server: ReplayServer) -> None:
    run = brisk("ask", "hi", "--base-url", server.url, "--model", "nope", "--json")
    assert run.returncode == 2
    assert "no model 'nope'" in parse(run.stdout)[-1]["message"] and "SmolLM2" in parse(run.stdout)[-1]["message"]


def test_models_list_refused_with_401(server: ReplayServer) -> None:
    server.models = (401, {"error": {"message": f"Invalid API key {KEY}"}})
    run = brisk("ask", "hi", "--base-url", server.url, "--json")
    assert run.returncode == 2 and "401" in parse(run.stdout)[-1]["message"]
    no_key(run)


@pytest.mark.parametrize(
    ("status", "headers", "expect"),
    [
        (401, {}, r"401 Unauthorized.*API key"),
        (403, {}, r"403 Forbidden.*API key"),
        (404, {}, r"404 Not Found"),
        (429, {"Retry-After": "7"}, r"busy \(429 Too Many Requests\); retry in 7 s"),
        (500, {}, r"failed \(500\).*server's log"),
    ],
)
def test_status_errors(server: ReplayServer, status: int, headers: dict[str, str], expect: str) -> None:
    body = {"error": {"message": f"CUDA out of memory (key {KEY})", "code": status}}
    error = fault(server, lambda h, b: h.json(status, body, headers))
    assert re.search(expect, error["message"]), error["message"]
    assert error["partial_text"] == ""


def test_stream_cut_in_the_middle_keeps_the_partial_reply(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in first(4):
            h.send(chunk)
        h.cut()

    error = fault(server, chat)
    assert error["partial_text"] == "The capital of" and "closed the connection in the middle" in error["message"]


def test_stream_that_ends_without_finishing(server: ReplayServer) -> None:
    error = fault(server, lambda h, b: h.replay(first(3)))
    assert error["partial_text"] == "The capital" and "without finishing the reply" in error["message"]


@pytest.mark.parametrize(
    ("bad", "expect"),
    [
        (b'data: {"choices": [{"delta": {"content": "Par\n\n', "not valid JSON"),
        (b'data: {"error": {"message": "KV cache exhausted"}}\n\n', "KV cache exhausted"),
    ],
)
def test_malformed_chunks(server: ReplayServer, bad: bytes, expect: str) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in first(3):
            h.send(chunk)
        h.send(bad)
        h.end_stream()

    error = fault(server, chat)
    assert error["partial_text"] == "The capital" and expect in error["message"]


def test_server_that_stops_sending(server: ReplayServer) -> None:
    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in first(3):
            h.send(chunk)
        h.hold()

    error = fault(server, chat, "--server-timeout", "0.5")
    assert error["partial_text"] == "The capital" and "stopped sending for 0.5 s" in error["message"]


def test_a_failed_reply_stays_in_the_chat_history(server: ReplayServer) -> None:
    replies = iter([first(4), events("llamacpp.sse")])

    def chat(h: Handler, body: object) -> None:
        chunks = next(replies)
        h.start_stream()
        for chunk in chunks:
            h.send(chunk)
        if len(chunks) == 4:
            h.cut()
        else:
            h.end_stream()

    server.chat = chat
    run = brisk("chat", "--base-url", server.url, "--json", stdin="one\ntwo\n")
    assert run.returncode == 3, "a failed reply makes the exit non-zero, and the chat goes on"
    kinds = [e["type"] for e in parse(run.stdout) if e["type"] in ("error", "done")]
    assert kinds == ["error", "done"]
    assert server.requests[-1]["messages"][1] == {"role": "assistant", "content": "The capital of"}


def test_the_done_line_counts_the_prompt_only_where_the_server_did() -> None:
    from engine.api import Metrics
    from engine.cli.common import summary

    local = summary(Metrics(completion_tokens=4, prompt_tokens=30, cached_tokens=20))
    assert "reused 20 of 30 prompt tokens" in local
    unreported = summary(Metrics(completion_tokens=4, server={"model": "m"}))
    assert not any("prompt" in part for part in unreported), unreported  # not "reused 0 of 0"
    counted = summary(
        Metrics(completion_tokens=4, prompt_tokens=30, server={"model": "m"}, server_reported=("prompt_tokens",))
    )
    assert "30 prompt tokens (server's count)" in counted
