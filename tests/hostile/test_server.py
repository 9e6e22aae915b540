"""The OpenAI-compatible server under hostile clients: connections that drip bytes, bodies that nest or
overflow, keys no header can carry, prompts and embedding batches far over what the model can read.

Two real servers: the server's own pieces (``ServerThread``, uvicorn, the guard) in process with small
limits and no model, for the connection cases (raw sockets from other loopback addresses, 127.0.0.2 and
up, as other machines), and ``brisk serve`` in a child process on the tiny model with its default limits,
for the rest (raw HTTP, the ``openai`` SDK).  Every case checks that a real client is still served.
Cases and results are tabled in ``tests/hostile/README.md``.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from engine.server.app import Service
from engine.server.guard import Limits
from engine.server.hub import Hub
from engine.server.run import ServerThread
from tests.support import ROOT

KEY = "s3cret-key"


# -- the connection guard, in process ----------------------------------------------------------------------


def start(limits: Limits) -> ServerThread:
    """The server's pieces on a free port with ``limits`` and no engine (``/v1/models`` needs none)."""
    service = Service(hub=Hub(lambda r: None, lambda i: None), model="tiny")
    thread = ServerThread(service, "127.0.0.1", 0, limits)
    thread.start()
    return thread


def drippers(count: int, source: str, port: int) -> list[socket.socket]:
    """``count`` connections from ``source`` that send part of a request's headers and then wait."""
    out = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        out.append(s)
    return out


def answers(socks: list[socket.socket], wait: float = 0.5) -> list[tuple[int, dict]]:
    """(status, JSON body) of each socket the server answered and closed within ``wait`` seconds ((0, {}):
    closed, its answer lost to a reset)."""
    got = []
    deadline = time.monotonic() + wait
    pending = list(socks)
    while pending and time.monotonic() < deadline:
        ready, _, _ = select.select(pending, [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            pending.remove(s)
            data = b""
            s.settimeout(2)
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except ConnectionResetError:  # closed with our request bytes unread: the kernel's reset
                got.append((0, {}))  # may overtake the answer
                continue
            head, _, body = data.partition(b"\r\n\r\n")
            got.append((int(head.split()[1]), json.loads(body)))
    return got


def served_promptly(url: str) -> float:
    """Seconds the ``openai`` SDK took to list the models (fails if it could not)."""
    began = time.perf_counter()
    models = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=10).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    return time.perf_counter() - began


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_drippers_from_one_address_push_out_only_their_own() -> None:
    server = start(Limits(max_connections=4096, per_client=40, header_s=60, body_s=60))
    socks = drippers(150, "127.0.0.2", server.port)
    try:
        refused = answers(socks)
        assert len(refused) == 110  # past its 40, each new one closed that address's oldest waiting one
        assert {status for status, _ in refused} <= {503, 0}
        assert all(body["error"]["code"] == "connection_evicted" for status, body in refused if status)
        assert served_promptly(server.url) < 2.0  # another address is served at once
        assert server.guard.evicted == 110
    finally:
        close_all(socks)
        server.stop()


def test_a_full_pool_of_drippers_still_serves_a_whole_request() -> None:
    server = start(Limits(max_connections=100, per_client=60, header_s=60, body_s=60))
    socks = [s for n in range(2, 6) for s in drippers(50, f"127.0.0.{n}", server.port)]  # 200 > 100
    try:
        assert len(answers(socks)) == 100
        assert served_promptly(server.url) < 2.0  # from 127.0.0.1, with the pool full of drippers
        # a client on a dripper's own address too: it pushes out that address's oldest dripper
        began = time.perf_counter()
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.5")) as client:
            reply = client.get(server.url + "/models")
        assert reply.status_code == 200 and time.perf_counter() - began < 2.0
    finally:
        close_all(socks)
        server.stop()


def test_requests_whose_headers_or_body_drip_are_closed_at_their_deadline() -> None:
    server = start(Limits(header_s=1.5, body_s=1.5))
    try:
        headers = socket.create_connection(("127.0.0.1", server.port))
        body = socket.create_connection(("127.0.0.1", server.port))
        body.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"messages": '
        )
        began = time.perf_counter()
        for byte in b"GET /v1/models HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.25 s: 9 s in all
            if select.select([headers], [], [], 0.25)[0]:
                break
            headers.sendall(bytes([byte]))
        got = dict(answers([headers, body], wait=3.0))
        took = time.perf_counter() - began
        assert got.keys() == {408}
        assert 1.5 <= took < 3.5, took
        assert "did not arrive within 1.5 s" in got[408]["error"]["message"]
        assert server.guard.expired == 2
        assert served_promptly(server.url) < 2.0
    finally:
        server.stop()


def test_a_request_that_is_not_http_gets_openais_shape() -> None:
    server = start(Limits())
    try:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        ((status, body),) = answers([s], wait=2.0)
        assert status == 400 and body["error"]["code"] == "invalid_http"
    finally:
        server.stop()


# -- brisk serve, in a child process -----------------------------------------------------------------------


class Child:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url
        self.root = url.removesuffix("/v1")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM back to VmRSS

    def rss(self, field: str = "VmRSS") -> int:
        """The child's resident memory (``VmHWM``: its peak since :meth:`reset_peak`) in MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) >> 10  # type: ignore[union-attr]

    def post(self, path: str, body: object, key: str = KEY, timeout: float = 60, **kw: object) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        return httpx.post(self.root + path, content=content, headers=headers, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def child(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    data = tmp_path_factory.mktemp("serve-data")
    env = dict(os.environ, HF_HUB_OFFLINE="1", BRISK_DATA_DIR=str(data))
    argv = [sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_dir), "--port", "0", "--api-key", KEY]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    assert process.stdout is not None
    url = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("Serving "):
            url = line.split(" at ")[1].split()[0]
            break
        assert line or process.poll() is None, "brisk serve ended before it served"
    assert url, "brisk serve did not load the tiny model within 120 s"
    yield Child(process, url)
    process.terminate()
    process.wait(30)


def error_of(reply: httpx.Response) -> dict:
    body = reply.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def still_serves(child: Child) -> None:
    api = openai.OpenAI(base_url=child.url, api_key=KEY, max_retries=0, timeout=60)
    model = api.models.list().data[0].id
    reply = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None


def test_a_non_ascii_key_is_refused_at_start(tmp_path: Path) -> None:
    from tests.hostile.conftest import run_cli

    done = run_cli("serve", "--port", "0", "--api-key", "clé-secrète", data_dir=tmp_path, timeout=60)
    assert done.returncode == 3, done.stderr  # a refused value, as README's exit codes say
    assert "--api-key" in done.stderr and "ASCII" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("serve", "--port", "0", data_dir=tmp_path, timeout=60, env={"BRISK_SERVER_KEY": "a key"})
    assert done.returncode == 3 and "ASCII" in done.stderr


def test_a_non_ascii_bearer_is_a_401(child: Child) -> None:
    for token in ("clé".encode(), b"\xff\xfe", KEY.encode() + b"\xc3\xa9"):
        reply = httpx.get(child.url + "/models", headers={"Authorization": b"Bearer " + token})
        assert reply.status_code == 401 and error_of(reply)["code"] == "invalid_api_key"
    assert httpx.get(child.url + "/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.mark.parametrize(
    ("case", "body", "needle"),
    [
        (
            "5,000-digit max_tokens",
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}",
            "over 4,300 digits",
        ),
        ("100,000-deep body", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests more than"),
        ("150-deep body that parses", b'{"messages": ' + b"[" * 150 + b"]" * 150 + b"}", "nests more than"),
    ],
)
def test_bodies_that_break_the_parser_are_400s(child: Child, case: str, body: bytes, needle: str) -> None:
    reply = child.post("/v1/chat/completions", body)
    assert reply.status_code == 400, (case, reply.text[:300])
    assert needle in error_of(reply)["message"]


def test_a_conversation_far_over_the_context_is_refused_at_once(child: Child) -> None:
    began = time.perf_counter()
    reply = child.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 50_000})
    took = time.perf_counter() - began
    error = error_of(reply)
    assert reply.status_code == 400 and error["param"] == "messages", error
    assert error["code"] == "context_length_exceeded" and "template" not in error["message"]
    assert took < 10, took
    prompt = "hello world " * 600_000  # 7.2 MB
    for path, body, param in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}, "messages"),
        ("/v1/completions", {"prompt": prompt}, "prompt"),
    ]:
        began = time.perf_counter()
        reply = child.post(path, body)
        assert reply.status_code == 400 and error_of(reply)["param"] == param, reply.text[:300]
        assert time.perf_counter() - began < 10
    still_serves(child)


def test_a_long_conversation_within_bounds_is_fitted_in_a_few_renders(child: Child) -> None:
    # 500 turns (under the tiny model's 512-token context in count) render to far over it: the oldest go
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(499)]
    began = time.perf_counter()
    reply = child.post("/v1/chat/completions", {"messages": turns, "max_tokens": 2})
    assert reply.status_code == 200, reply.text[:300]
    assert time.perf_counter() - began < 20


def test_embedding_batches_are_bounded_and_stop_when_the_client_leaves(child: Child) -> None:
    text = "word " * 700  # 3.5 KB
    began = time.perf_counter()
    reply = child.post("/v1/embeddings", {"input": [text] * 2048})
    assert reply.status_code == 400 and error_of(reply)["param"] == "input", reply.text[:300]
    assert time.perf_counter() - began < 10
    assert child.post("/v1/embeddings", {"input": "warm up"}).status_code == 200  # the embedder's load

    # a 5 MB text is cut before the tokenizer reads it
    began = time.perf_counter()
    reply = child.post("/v1/embeddings", {"input": "word " * 1_000_000})
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == 256
    assert time.perf_counter() - began < 15

    # 250 long texts (under the caps), then the client leaves: the work stops within a batch
    child.reset_peak()
    before = child.rss()
    with pytest.raises(httpx.TimeoutException):
        child.post("/v1/embeddings", {"input": [f"{i} {text}" for i in range(250)]}, timeout=2)
    began = time.perf_counter()
    reply = child.post("/v1/embeddings", {"input": "a question"})
    assert reply.status_code == 200
    assert time.perf_counter() - began < 20  # one batch of 16, not the 250 texts the client left
    assert child.rss("VmHWM") - before < 400  # batches of 16: the whole 250 at once took far more
    still_serves(child)


def test_drippers_on_the_default_limits_leave_room_for_a_real_client(child: Child) -> None:
    port = int(child.url.rsplit(":", 1)[1].split("/")[0])
    socks = drippers(300, "127.0.0.7", port)
    try:
        refused = answers(socks)
        assert len(refused) == 300 - 256 and {s for s, _ in refused} <= {503, 0}
        still_serves(child)
    finally:
        close_all(socks)
