"""Connection limits: deadlines for a request's headers and body, and room kept for clients that send whole requests.

uvicorn's own limit (``limit_concurrency``) counts open connections and answers
a plain-text 503 past it, so connections that drip a header byte every few
seconds (before any key is checked) could hold every slot for as long as they
liked.  :class:`GuardedH11` is uvicorn's h11 protocol with three additions,
all decided on the connection's h11 state, so they hold before any of the
app's code runs:

* **Deadlines.**  A request's headers must arrive within ``Limits.header_s``
  of the connection opening (or of the first byte of a request on a kept-alive
  connection), and its body within ``Limits.body_s`` of its headers.  Past
  either, the client gets a 408 and the connection is closed.
* **Room for whole requests.**  A connection that is waiting on its client
  (headers or body still arriving, or kept alive between requests) is
  *waiting*; one whose request the app is answering is *busy*.  When an
  address opens more than ``Limits.per_client`` connections, or the server
  holds more than ``Limits.max_connections``, the oldest waiting connection (of
  that address, then of all) is closed with a 503 to make room: a client that
  drips bytes pushes out its own connections, never another client's request.
  Only when every counted connection is busy is the new one refused, with a
  429 (per address) or a 503 (all), in OpenAI's error shape.
* **OpenAI's error shape** for every refusal made here, and for a request that
  is not valid HTTP (uvicorn sends plain text).

It relies on ``H11Protocol``'s attributes (``conn``, ``transport``, ``client``,
``app``) as uvicorn 0.30 to 0.55 have them; the hostile tests check the
behaviour end to end.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.server.shapes import ApiError

SWEEP_S = 0.5  # how often the deadlines are checked


@dataclass(frozen=True)
class Limits:
    max_connections: int = 4096  # open connections of all clients
    per_client: int = 256  # open connections of one address (every local program shares 127.0.0.1)
    header_s: float = 10.0  # a request's headers, from the connection's (or the request's) first byte
    body_s: float = 60.0  # its body, from its headers (8 MiB at 140 KB/s)


LIMITS = Limits()


@dataclass
class Guard:
    """The connections of one server, oldest first: all of them and by address."""

    limits: Limits = LIMITS
    all: dict[GuardedH11, None] = field(default_factory=dict)
    by_address: dict[str, dict[GuardedH11, None]] = field(default_factory=dict)
    evicted: int = 0  # connections closed to make room
    expired: int = 0  # connections closed at a deadline
    _sweeping: bool = False

    def admit(self, conn: GuardedH11) -> ApiError | None:
        """Count a new connection, closing a waiting one where a cap is reached; an error when none can go."""
        same = self.by_address.setdefault(conn.address, {})
        same[conn] = None
        self.all[conn] = None
        self._sweep_soon(conn)
        n = self.limits.per_client
        if len(same) > n and not self._evict(same, conn):
            return ApiError(
                429,
                f"{conn.address} already has {n} requests in flight here; wait for one to finish.",
                code="too_many_connections",
            )
        n = self.limits.max_connections
        if len(self.all) > n and not self._evict(self.all, conn):
            return ApiError(503, f"The server has {n} requests in flight; try again shortly.", code="server_busy")
        return None

    def remove(self, conn: GuardedH11) -> None:
        self.all.pop(conn, None)
        same = self.by_address.get(conn.address)
        if same is not None:
            same.pop(conn, None)
            if not same:
                del self.by_address[conn.address]

    def _evict(self, among: dict[GuardedH11, None], newcomer: GuardedH11) -> bool:
        for conn in among:
            if conn is not newcomer and conn.waiting:
                self.evicted += 1
                conn.close_with(
                    ApiError(
                        503,
                        "Closed to make room for other requests: this connection sent no whole request "
                        "while the server was full.",
                        code="connection_evicted",
                    )
                )
                return True
        return False

    def _sweep_soon(self, conn: GuardedH11) -> None:
        if not self._sweeping:
            self._sweeping = True
            conn.loop.call_later(SWEEP_S, self._sweep, conn.loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections past a deadline; runs every ``SWEEP_S`` while any connection is open."""
        now = time.monotonic()
        for conn in list(self.all):
            limit = {"headers": self.limits.header_s, "body": self.limits.body_s}.get(conn.phase)
            if limit is not None and now - conn.since > limit:
                self.expired += 1
                part = "headers" if conn.phase == "headers" else "body"
                conn.close_with(
                    ApiError(
                        408,
                        f"The request's {part} did not arrive within {limit:g} s; send each request whole.",
                        code="request_timeout",
                    )
                )
        if self.all:
            loop.call_later(SWEEP_S, self._sweep, loop)
        else:
            self._sweeping = False


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol under a :class:`Guard` (``guard`` is set by :func:`protocol_for`)."""

    guard: Guard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else "?"
        self.phase = "headers"  # headers | body | busy | idle (kept alive: uvicorn's own timer closes it)
        self.since = time.monotonic()
        self.closed = False
        refusal = self.guard.admit(self)
        if refusal is not None:
            self.app = _refusal_app(refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.remove(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == "idle":  # the first byte of the next request on a kept-alive connection
            self.phase, self.since = "headers", time.monotonic()
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    @property
    def waiting(self) -> bool:
        """Whether the connection waits on its client (no request of it is being answered)."""
        return self.phase != "busy" and not self.closed

    def _track(self) -> None:
        their = self.conn.their_state
        if their is h11.SEND_BODY:
            phase = "body"
        elif their is h11.IDLE:
            phase = "headers" if self.phase == "headers" else "idle"
        else:
            phase = "busy"
        if phase != self.phase:
            self.phase, self.since = phase, time.monotonic()

    def close_with(self, error: ApiError) -> None:
        """Answer ``error`` (when no response has started) and close; the app, if running, sees a disconnect."""
        if self.closed:
            return
        self.closed = True
        self.guard.remove(self)
        if self.transport.is_closing():
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no response of ours has begun
            self.transport.write(_raw_response(error))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = ApiError(400, "The request is not valid HTTP/1.1, or its headers are too long.", code="invalid_http")
        self.closed = True
        self.transport.write(_raw_response(error))
        self.transport.close()


def protocol_for(guard: Guard) -> type[GuardedH11]:
    """A protocol class for uvicorn's ``Config(http=...)`` whose connections are counted by ``guard``."""
    return type("GuardedH11", (GuardedH11,), {"guard": guard})


def _body(error: ApiError) -> bytes:
    return json.dumps(error.body()).encode("utf-8")


def _raw_response(error: ApiError) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written outside h11 (the request may be half read)."""
    body = _body(error)
    phrase = HTTPStatus(error.status).phrase
    head = (
        f"HTTP/1.1 {error.status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _refusal_app(error: ApiError) -> Any:
    """An ASGI app that answers every request with ``error`` and closes the connection."""
    body = _body(error)

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse
