"""Hostile remote servers through the real ``brisk ask --base-url``: each case ends with one clear error event,
the text so far kept, a bounded time, no trace of the API key, and a next run against a good server that works.

The servers run in this process on loopback (127.0.0.1; 127.0.0.2 stands for "another host") and stop with
the test.  Deadlines and caps are shortened through ``BRISK_REMOTE_*`` so a case takes seconds; the
defaults are checked on their own.  A non-loopback host is only ever a name under ``.invalid``, answered
by a ``sitecustomize`` in the child that records every lookup of it and maps it to 127.0.0.1, so nothing
leaves this machine and "no connection was attempted" can be seen.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.remote import Limits, RemoteError
from engine.remote.errors import KeyFilter
from engine.remote.guard import check_key, is_loopback
from tests.hostile.conftest import Run
from tests.support.streams.replay import Handler, ReplayServer, events, models_of

KEY = "sk-brisk-hostile-0123456789abcdef"
ANSWER = "The capital of France is Paris."
HANG = 60.0  # a case still running after this long would have hung a user
Cli = Callable[..., Run]


def chunk(text: str, finish: str | None = None) -> bytes:
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    if finish:
        body["choices"][0]["finish_reason"] = finish  # type: ignore[index]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def gone(h: Handler, wait: float) -> bool:
    """Wait up to ``wait`` s for the client to close the connection; True when it has (the server then stops)."""
    readable, _, _ = select.select([h.connection], [], [], wait)
    return bool(readable) and not h.connection.recv(1, socket.MSG_PEEK)


class Hostile:
    """A replay server whose chat reply the case sets; it records what it sent and whether the client left."""

    def __init__(self) -> None:
        self.replay = ReplayServer()
        self.sent = 0
        self.left = threading.Event()

    @property
    def url(self) -> str:
        return self.replay.url

    def plays(self, chat: Callable[[Handler, dict[str, Any]], None]) -> None:
        def wrapped(h: Handler, body: dict[str, Any]) -> None:
            try:
                chat(h, body)
            except OSError:  # the client closed the connection: what a bounded client does
                self.left.set()

        self.replay.chat = wrapped

    def send(self, h: Handler, data: bytes) -> None:
        h.send(data)
        self.sent += len(data)

    def good(self) -> None:
        self.replay.chat = lambda h, body: h.replay(events("llamacpp.sse"))


@pytest.fixture
def server() -> Iterator[Hostile]:
    s = Hostile()
    yield s
    s.replay.close()


def ask(cli: Cli, data: Path, url: str, *extra: str, env: dict[str, str] | None = None) -> Run:
    return cli(
        "ask", "What is the capital of France?", "--base-url", url, "--json", *extra,
        data_dir=data, timeout=HANG, env={"BRISK_API_KEY": KEY, **(env or {})},
    )  # fmt: skip


def events_of(run: Run) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def no_key(run: Run, data: Path | None = None) -> None:
    """Not the key, nor any 8 characters of it, on screen, in errors or in any file of the data folder."""
    texts = [run.stdout, run.stderr]
    if data is not None:
        texts += [p.read_bytes().decode("latin-1") for p in data.rglob("*") if p.is_file()]
    for text in texts:
        assert not any(KEY[i : i + 8] in text for i in range(len(KEY) - 7)), "the key leaked"


def failed(run: Run, code: int = 3) -> dict[str, Any]:
    """The run ended with exactly one error event, last, a sensible exit code and no traceback; returns it."""
    assert run.returncode == code, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    evs = events_of(run)
    assert [e["type"] for e in evs].count("error") == 1 and evs[-1]["type"] == "error", evs[-3:]
    assert "done" not in [e["type"] for e in evs]
    no_key(run)
    return evs[-1]


def next_run_works(cli: Cli, data: Path, server: Hostile) -> None:
    server.good()
    run = ask(cli, data, server.url)
    assert run.returncode == 0, run.stderr[-2000:]
    assert events_of(run)[-1]["text"] == ANSWER


# -- deadlines: between events, not bytes ---------------------------------------------------------


def drip(server: Hostile, good_events: int, unit: bytes, every: float) -> Callable[[Handler, dict[str, Any]], None]:
    """A reply of ``good_events`` events, then ``unit`` every ``every`` s until the client leaves (or 60 s)."""

    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        for data in events("llamacpp.sse")[1 : 1 + good_events]:
            server.send(h, data)
        end = time.monotonic() + HANG
        while time.monotonic() < end:
            server.send(h, unit)
            if gone(h, every):
                server.left.set()
                return

    return chat


@pytest.mark.parametrize(
    ("good", "unit", "env", "expect", "partial"),
    [
        (0, b"d", {"BRISK_REMOTE_FIRST_EVENT_S": "2"}, "sent nothing of a reply for 2 s", ""),
        (2, b"d", {"BRISK_REMOTE_EVENT_GAP_S": "1.5"}, "stopped sending for 1.5 s", "The capital"),
        (2, b": keep-alive\n\n", {"BRISK_REMOTE_EVENT_GAP_S": "1.5"}, "stopped sending for 1.5 s", "The capital"),
    ],
    ids=["drip-before-first-event", "drip-mid-reply", "keep-alive-comments-only"],
)
def test_a_dripping_server_is_given_up_between_events(
    cli: Cli, data: Path, server: Hostile, good: int, unit: bytes, env: dict[str, str], expect: str, partial: str
) -> None:
    server.plays(drip(server, good, unit, every=0.5))  # each piece well inside any per-read timeout
    run = ask(cli, data, server.url, env=env)
    error = failed(run)
    assert expect in error["message"] and "try again" in error["message"]
    assert error["partial_text"] == partial
    assert server.left.wait(10), "the client never closed the connection"
    next_run_works(cli, data, server)


def test_a_server_that_stalls_between_events(cli: Cli, data: Path, server: Hostile) -> None:
    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        for data in events("llamacpp.sse")[1:4]:
            server.send(h, data)
        h.hold()

    server.plays(chat)
    error = failed(ask(cli, data, server.url, "--server-timeout", "1"))
    assert "stopped sending for 1 s" in error["message"] and error["partial_text"] == "The capital of"
    assert server.replay.disconnected.wait(10)
    next_run_works(cli, data, server)


def test_a_reply_that_never_ends_meets_the_whole_reply_deadline(cli: Cli, data: Path, server: Hostile) -> None:
    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        end = time.monotonic() + HANG
        while time.monotonic() < end and not gone(h, 0.2):  # an event every 0.2 s: no gap deadline ever fires
            server.send(h, chunk("la "))
        server.left.set()

    server.plays(chat)
    run = ask(cli, data, server.url, env={"BRISK_REMOTE_REPLY_S": "2"})
    error = failed(run)
    assert "ran past 2 s" in error["message"] and error["partial_text"].startswith("la la ")
    assert server.left.wait(10)
    next_run_works(cli, data, server)


# -- sizes -------------------------------------------------------------------------------------------


def test_a_huge_single_event_is_refused_while_it_arrives(cli: Cli, data: Path, server: Hostile) -> None:
    size = 64 << 20  # one 64 MB line, made as it is sent so the server holds little of it either

    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        server.send(h, events("llamacpp.sse")[1])
        server.send(h, b'data: {"choices": [{"index": 0, "delta": {"content": "')
        piece = b"A" * (1 << 20)
        while server.sent < size:
            server.send(h, piece)
        server.send(h, b'"}}]}\n\n')
        h.end_stream()

    server.plays(chat)
    run = ask(cli, data, server.url)
    error = failed(run)
    assert "one event of more than 1 MB" in error["message"] and error["partial_text"] == "The"
    assert len(run.stdout) < 10_000, "the huge event reached the screen"
    assert server.left.wait(10) and server.sent < size // 4, f"the client read {server.sent} bytes of it"
    next_run_works(cli, data, server)


def test_a_reply_that_grows_past_the_cap(cli: Cli, data: Path, server: Hostile) -> None:
    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        for _ in range(200_000):  # some 20 MB of ordinary events unless the client stops reading
            server.send(h, chunk("word "))
        h.end_stream()

    server.plays(chat)
    run = ask(cli, data, server.url, env={"BRISK_REMOTE_MAX_REPLY_MB": "0.05"})
    error = failed(run)
    assert "passed 0.05 MB" in error["message"] and "text so far is kept" in error["message"]
    kept = error["partial_text"]
    assert kept.startswith("word word ") and set(kept.split()) == {"word"} and len(kept) < 52_429
    assert server.left.wait(10)
    next_run_works(cli, data, server)


# -- the key ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 3, 7, 100], ids=lambda n: f"{n}-char-deltas")
def test_a_server_that_echoes_the_key_never_shows_it(cli: Cli, data: Path, server: Hostile, piece: int) -> None:
    def chat(h: Handler, body: dict[str, Any]) -> None:
        text = f"Your header was {h.headers['Authorization']}, so your key is {KEY}. Bye."
        h.start_stream()
        for i in range(0, len(text), piece):
            server.send(h, chunk(text[i : i + piece]))
        server.send(h, chunk("", finish="stop"))
        h.end_stream()

    server.plays(chat)
    run = ask(cli, data, server.url)
    assert run.returncode == 0, run.stderr[-2000:]
    no_key(run, data)
    evs = events_of(run)
    done = evs[-1]
    hidden = r"(?:s|sk|sk-)?\*\*\*"  # at most the key's first three characters show, never eight
    assert re.fullmatch(f"Your header was Bearer {hidden}, so your key is {hidden}\\. Bye\\.", done["text"]), done
    assert "".join(e["text"] for e in evs if e["type"] == "token") == done["text"]


def test_a_server_that_echoes_the_key_in_an_error(cli: Cli, data: Path, server: Hostile) -> None:
    def chat(h: Handler, body: dict[str, Any]) -> None:
        h.start_stream()
        server.send(h, events("llamacpp.sse")[1])
        server.send(h, b'data: {"error": {"message": "bad key ' + KEY.encode() + b'"}}\n\n')
        h.end_stream()

    server.plays(chat)
    run = ask(cli, data, server.url)
    error = failed(run)
    assert "bad key ***" in error["message"] and error["partial_text"] == "The"
    no_key(run, data)


@pytest.fixture
def resolver(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Env for the child: ``*.invalid`` names are recorded in a log and answered with 127.0.0.1."""
    folder = tmp_path / "resolver"
    folder.mkdir()
    log = tmp_path / "lookups.log"
    (folder / "sitecustomize.py").write_text(
        "import os, socket\n"
        "_real = socket.getaddrinfo\n"
        "def _lookup(host, *args, **kwargs):\n"
        "    if isinstance(host, (str, bytes)) and str(host).rstrip(\"'\").endswith('.invalid'):\n"
        "        with open(os.environ['BRISK_TEST_LOOKUPS'], 'a') as f:\n"
        "            f.write(str(host) + '\\n')\n"
        "        host = '127.0.0.1'\n"
        "    return _real(host, *args, **kwargs)\n"
        "socket.getaddrinfo = _lookup\n"
    )
    no_proxy = {
        name: "" for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    }
    return {"PYTHONPATH": str(folder), "BRISK_TEST_LOOKUPS": str(log), **no_proxy}, log


def test_a_key_over_plain_http_to_another_host_is_refused_before_connecting(
    cli: Cli, data: Path, server: Hostile, resolver: tuple[dict[str, str], Path]
) -> None:
    env, log = resolver
    port = server.url.split(":")[2].split("/")[0]
    url = f"http://brisk-remote.invalid:{port}/v1"
    run = ask(cli, data, url, env=env)
    error = failed(run, code=2)
    assert "did not send the API key to brisk-remote.invalid" in error["message"]
    assert "https://" in error["message"] and "--allow-insecure-key" in error["message"]
    assert not log.exists(), "the host was looked up"
    assert server.replay.headers_seen == [], "a connection was made"
    opted_in = ask(cli, data, url, "--allow-insecure-key", env=env)  # the user's explicit choice: it goes
    assert opted_in.returncode == 0, opted_in.stderr[-2000:]
    assert events_of(opted_in)[-1]["text"] == ANSWER
    assert set(log.read_text().split()) == {"brisk-remote.invalid"}
    no_key(opted_in)
    no_key_run = cli("ask", "hi", "--base-url", url, "--json", data_dir=data, timeout=HANG, env=env)
    assert no_key_run.returncode == 0, "without a key, plain http elsewhere is the user's call"


def test_the_key_rule_unit() -> None:
    for host in ("127.0.0.1", "127.9.8.7", "[::1]", "localhost", "LOCALHOST.", "brisk.localhost"):
        assert is_loopback(host.strip("[]")), host
        check_key(f"http://{host}:8080/v1", KEY)
    for host in ("10.0.0.1", "192.168.1.5", "example.invalid", "localhost.example.test", "[::ffff:10.0.0.1]"):
        assert not is_loopback(host.strip("[]")), host
        with pytest.raises(RemoteError, match="did not send the API key"):
            check_key(f"http://{host}:8080/v1", KEY)
        check_key(f"https://{host}/v1", KEY)
        check_key(f"http://{host}/v1", None)
        check_key(f"http://{host}/v1", KEY, allow=True)


# -- redirects ------------------------------------------------------------------------------------


class Trap:
    """A listener on another loopback address that never answers; ``connections()`` counts who reached it."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"

    def connections(self) -> int:
        """Every connection that was made waits in the backlog: take them all, without waiting."""
        self.sock.setblocking(False)
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("host", ["127.0.0.2", "127.0.0.1"], ids=["another-host", "another-port"])
@pytest.mark.parametrize("status", [307, 308])
def test_a_redirect_to_another_server_is_refused(cli: Cli, data: Path, server: Hostile, host: str, status: int) -> None:
    trap = Trap(host)
    target = f"{trap.url}/v1/chat/completions"
    quick = {"BRISK_REMOTE_FIRST_EVENT_S": "5"}  # were the trap reached, the case would fail in seconds
    try:
        server.plays(lambda h, body: h.json(status, {}, {"Location": target}))
        error = failed(ask(cli, data, server.url, env=quick))
        assert f"redirected the request to {trap.url}, another server" in error["message"]
        assert "the conversation was not sent there" in error["message"]
        assert trap.connections() == 0, "the conversation went to the other server"
        server.replay.models = (status, {}, {"Location": f"{trap.url}/v1/models"})
        listing = failed(ask(cli, data, server.url, env=quick), code=2)
        assert "another server" in listing["message"] and trap.connections() == 0
    finally:
        trap.close()
    server.replay.models = models_of("llamacpp.models.json")
    next_run_works(cli, data, server)


def test_a_redirect_on_the_same_server_is_followed(cli: Cli, data: Path, server: Hostile) -> None:
    class Moved(Handler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if "moved" in self.path:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.replay(events("llamacpp.sse"))
            else:
                super().do_POST()

    server.replay.httpd.RequestHandlerClass = Moved
    server.plays(lambda h, body: h.json(307, {}, {"Location": "/v1/chat/completions/moved"}))
    run = ask(cli, data, server.url)
    assert run.returncode == 0, run.stderr[-2000:]
    assert events_of(run)[-1]["text"] == ANSWER


# -- the defaults, and bad settings ---------------------------------------------------------------


def test_the_default_limits() -> None:
    limits = Limits.from_env({})
    assert limits == Limits()
    assert limits.first_event_s == 300 and limits.event_gap_s == 60 and limits.reply_s == 1800
    assert limits.max_event_bytes == 1 << 20 and limits.max_reply_bytes == 64 << 20
    assert limits.allow_insecure_key is False
    env = {"BRISK_REMOTE_EVENT_GAP_S": "5", "BRISK_REMOTE_MAX_REPLY_MB": "2", "BRISK_ALLOW_INSECURE_KEY": "1"}
    changed = Limits.from_env(env)
    assert (changed.event_gap_s, changed.max_reply_bytes, changed.allow_insecure_key) == (5, 2 << 20, True)
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(RemoteError, match="BRISK_REMOTE_REPLY_S must be a number above 0"):
            Limits.from_env({"BRISK_REMOTE_REPLY_S": bad})


def test_a_bad_limit_in_the_environment_is_said_before_connecting(cli: Cli, data: Path, server: Hostile) -> None:
    run = ask(cli, data, server.url, env={"BRISK_REMOTE_EVENT_GAP_S": "soon"})
    error = failed(run, code=2)
    assert "BRISK_REMOTE_EVENT_GAP_S must be a number above 0, not 'soon'" in error["message"]
    assert server.replay.headers_seen == []


def test_the_key_filter_holds_back_only_what_could_start_the_key() -> None:
    shown = KeyFilter(KEY)
    assert [shown.feed(t) for t in ["The", " capital", " is", " ask", " sk"]] == [
        "The",
        " capital",
        " is",
        " ask",
        " sk",
    ]
    assert shown.feed("-brisk") == ""  # "sk-brisk" could be the key: held
    assert shown.feed("y day") == "-brisky day"  # it was not
    assert KeyFilter(None).feed(KEY) == KEY


def test_the_window_path_refuses_the_key_at_load_without_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.api import ModelSpec
    from engine.client import Client, LoadError
    from engine.remote import RemoteBackend

    def no_lookup(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"looked up {args[0]!r}")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    monkeypatch.delenv("BRISK_ALLOW_INSECURE_KEY", raising=False)

    def make(on_event: Any) -> RemoteBackend:  # as app.engines builds it, on the bridge's worker: must not raise
        return RemoteBackend(on_event, "http://lan-box.invalid/v1", None, KEY)

    client = Client(make, timeout=20)
    with pytest.raises(LoadError, match="did not send the API key to lan-box.invalid"):
        client.load(ModelSpec())
    client.close()
