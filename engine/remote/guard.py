"""What may leave for a server and how much is taken back: the key's transport, redirects, and byte caps.

``check_key(base_url, api_key, allow)`` raises :class:`RemoteError` before any
connection when a key would go over plain ``http://`` to a host that is not
this machine (``localhost``, ``*.localhost``, 127.0.0.0/8, ``::1``; decided
from the URL alone, never by a DNS lookup).  Refused rather than warned:
once sent, a key cannot be unsent, and a warning line is easily missed in the
window; the opt-in (``--allow-insecure-key`` or ``BRISK_ALLOW_INSECURE_KEY=1``)
is one flag for a network the user trusts.

``Guard(base_url, limits)`` gives the ``httpx`` event hooks of one client:

- every request, the redirected ones included, must go to the server the user
  named: the same host and port and scheme, or the same host upgraded from
  http to https.  A redirect anywhere else raises :class:`Refused` before
  that request is sent, so the conversation never reaches a host the user
  did not name (the ``openai`` SDK follows redirects by itself);
- every request asks for an uncompressed body (``Accept-Encoding:
  identity``) and a compressed answer is refused, so the bytes counted are
  the bytes decoded;
- every response body is counted while it streams: past ``max_reply_bytes``,
  or (for ``text/event-stream``) past ``max_event_bytes`` since the last blank
  line, it raises :class:`Refused` at once, so a 100 MB line is never held
  whole.  ``shutdown_all()`` closes the sockets of the bodies still open.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx2

from .errors import Refused, RemoteError
from .limits import ALLOW_INSECURE_ENV, Limits

_BLANK_LINE = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r)")  # two line ends in a row: an event ends
_MB = 1 << 20


def is_loopback(host: str) -> bool:
    """True for a name or address of this machine, judged from the text alone (no lookup)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
        return address.is_loopback or address.is_unspecified  # 0.0.0.0 and :: reach this machine (vLLM prints them)
    except ValueError:
        return False


def check_key(base_url: str, api_key: str | None, allow: bool = False) -> None:
    """RemoteError when ``api_key`` would travel unencrypted to a host that is not this machine."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if not api_key or allow or parts.scheme.lower() != "http" or is_loopback(host):
        return
    raise RemoteError(
        f"Brisk did not send the API key to {host}: the URL is plain http://, so the key would cross the network "
        "unencrypted and anyone on the way could read it. Use https:// for this server, drop the key if it needs "
        f"none, or on a network you trust allow it with --allow-insecure-key (or {ALLOW_INSECURE_ENV}=1)."
    )


def same_server(base: httpx2.URL, url: httpx2.URL) -> bool:
    """True when ``url`` is on the server ``base`` names: same host and port, or the same host over https."""
    if url.host != base.host:
        return False
    if url.scheme == base.scheme:
        return url.port == base.port
    return base.scheme == "http" and url.scheme == "https"


def shutdown_socket(response: httpx2.Response | None) -> None:
    """Close the response's TCP connection now, waking a thread blocked reading it."""
    if response is None:
        return
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
    else:
        with contextlib.suppress(Exception):
            response.close()


def _origin(url: httpx2.URL) -> str:
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}"


def _size(n: int) -> str:
    return f"{n / _MB:.3g} MB"


class Guard:
    """The request and response hooks of one ``httpx`` client; see the module docstring."""

    def __init__(self, base_url: str, limits: Limits) -> None:
        self.where = base_url
        self.base = httpx2.URL(base_url)
        self.limits = limits
        self._open: weakref.WeakSet[httpx2.Response] = weakref.WeakSet()
        self._lock = threading.Lock()

    def hooks(self) -> dict[str, list[Callable[..., Any]]]:
        return {"request": [self.on_request], "response": [self.on_response]}

    def on_request(self, request: httpx2.Request) -> None:
        if not same_server(self.base, request.url):
            raise Refused(
                f"The server at {self.where} redirected the request to {_origin(request.url)}, another server; "
                "Brisk did not follow, so the conversation was not sent there. If that server is the right one, "
                "use its URL as the server URL."
            )
        request.headers["Accept-Encoding"] = "identity"

    def on_response(self, response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise Refused(
                f"The server at {self.where} sent a compressed reply (Content-Encoding: {encoding[:40]}) although "
                "Brisk asked for none; Brisk reads only uncompressed replies, so that their size stays bounded. "
                "Turn compression off for this server (or the proxy in front of it)."
            )
        events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        response.stream = _Bounded(response.stream, self, events)
        with self._lock:
            self._open.add(response)

    def shutdown_all(self) -> None:
        """Close the connection of every response body still being read, waking the threads that read them."""
        with self._lock:
            responses = list(self._open)
        for response in responses:
            shutdown_socket(response)

    def too_big(self, what: str) -> Refused:
        if what == "event":
            return Refused(
                f"The server at {self.where} sent one event of more than {_size(self.limits.max_event_bytes)} "
                "(a normal one is a few KB); Brisk stopped reading there and did not keep it. Check that the URL "
                "points at a chat server; raise BRISK_REMOTE_MAX_EVENT_MB if such events are expected."
            )
        return Refused(
            f"The reply from {self.where} passed {_size(self.limits.max_reply_bytes)}, the most Brisk takes for "
            "one reply; it stopped there and the text so far is kept. Ask for a shorter reply (max tokens), "
            "or raise BRISK_REMOTE_MAX_REPLY_MB."
        )


class _Bounded(httpx2.SyncByteStream):
    """A response body that refuses to grow past the guard's caps while it streams."""

    def __init__(self, inner: Any, guard: Guard, events: bool) -> None:
        self.inner = inner
        self.guard = guard
        self.events = events

    def __iter__(self) -> Iterator[bytes]:
        limits = self.guard.limits
        total = pending = 0  # bytes of the body; bytes since the last blank line
        tail = b""
        for chunk in self.inner:
            total += len(chunk)
            if total > limits.max_reply_bytes:
                raise self.guard.too_big("reply")
            if self.events:
                data = tail + chunk
                end = -1
                for match in _BLANK_LINE.finditer(data):
                    end = match.end()
                pending = len(data) - end if end >= 0 else pending + len(chunk)
                if pending > limits.max_event_bytes:
                    raise self.guard.too_big("event")
                tail = data[-3:]
            yield chunk

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.inner.close()
