"""A tiny OpenAI-compatible server on 127.0.0.1 that replays recorded streams and plays faults, for the tests.

``ReplayServer()`` listens on a free port of 127.0.0.1 in a thread (HTTP/1.1,
chunked transfer like the real servers).  ``url`` is its base URL
(``http://127.0.0.1:PORT/v1``).  Set ``models`` (the ``/v1/models`` body, or
``(status, body, headers)``) and ``chat`` (a callable ``(handler, body)``
that writes the ``/v1/chat/completions`` response with the helpers below).
``requests`` keeps each chat body and its headers; ``disconnected`` is set
when the client closes a stream the server was holding open; ``release``
lets a held stream go on (``close()`` sets it).
"""

from __future__ import annotations

import json
import select
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STREAMS = Path(__file__).parent


def events(name: str) -> list[bytes]:
    """The SSE events of a recorded stream in tests/streams/, each with its blank line."""
    text = (STREAMS / name).read_text()
    return [(part.strip("\n") + "\n\n").encode() for part in text.split("\n\n") if part.strip()]


def models_of(name: str) -> dict[str, Any]:
    return json.loads((STREAMS / name).read_text())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        owner = self.server.owner
        owner.headers_seen.append(dict(self.headers))
        if self.path.rstrip("/") != "/v1/models":
            self.json(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        spec = owner.models
        if isinstance(spec, tuple):
            self.json(*spec)
        else:
            self.json(200, spec)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        owner = self.server.owner
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        owner.headers_seen.append(dict(self.headers))
        owner.requests.append(body)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.json(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        owner.chat(self, body)

    # -- helpers for the chat callables ------------------------------------------------------------

    def json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def cut(self) -> None:
        """Drop the connection in the middle of the body (no last chunk), as a crashing server does."""
        self.close_connection = True
        self.connection.shutdown(2)

    def hold(self) -> None:
        """Send nothing more until the client closes the connection (then set ``disconnected``) or ``release``."""
        owner = self.server.owner
        while not owner.release.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable and not self.connection.recv(1):
                owner.disconnected.set()
                self.close_connection = True
                return

    def replay(self, chunks: list[bytes]) -> None:
        self.start_stream()
        for chunk in chunks:
            self.send(chunk)
        self.end_stream()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ReplayServer


class ReplayServer:
    def __init__(self) -> None:
        self.models: Any = models_of("llamacpp.models.json")
        self.chat: Callable[[Handler, dict[str, Any]], None] = lambda h, body: h.replay(events("llamacpp.sse"))
        self.requests: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.disconnected = threading.Event()
        self.release = threading.Event()
        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.owner = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
