"""Run the API: uvicorn on a thread of its own (the window, the tests) and ``brisk serve`` (the command line).

:class:`ServerThread` binds the socket itself before uvicorn starts, so a port
in use or an address this machine does not have is a clear ``ServeError`` at
once (and port 0 picks a free one, for tests); uvicorn then serves the app on
its own event loop in a daemon thread until :meth:`ServerThread.stop`.
Connections are counted and timed by :mod:`engine.server.guard` (deadlines for
a request's headers and body, room kept for clients that send whole requests).
:func:`serve_problems` refuses a host other than loopback without an API key,
and a key that an HTTP header cannot carry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from typing import Any

from engine.server.app import Service, build_app
from engine.server.guard import LIMITS, Guard, Limits, protocol_for

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
KEEP_ALIVE_S = 30


class ServeError(Exception):
    """The server could not start; the message says why and what to change."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_problems(host: str, port: int, api_key: str | None) -> list[str]:
    problems = []
    if not is_loopback(host) and not api_key:
        problems.append(
            f"--host {host} would let other machines use the model: set --api-key KEY (or BRISK_SERVER_KEY) "
            "to bind anything but 127.0.0.1"
        )
    if not 0 <= port <= 65535:
        problems.append(f"--port must be from 0 to 65535, not {port}")
    if api_key and not key_is_sendable(api_key):
        problems.append(
            "--api-key (or BRISK_SERVER_KEY) must be printable ASCII without spaces (letters, digits, "
            "punctuation): clients send it in an HTTP header, which cannot carry other characters"
        )
    return problems


def key_is_sendable(key: str) -> bool:
    """Whether ``key`` can travel as ``Authorization: Bearer KEY``: visible ASCII, no spaces."""
    return key.isascii() and key.isprintable() and not any(c.isspace() for c in key)


class ServerThread:
    """The app served by uvicorn on a daemon thread; ``url`` once :meth:`start` returned."""

    def __init__(
        self, service: Service, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, limits: Limits = LIMITS
    ) -> None:
        self.service = service
        self.host, self.port = host, port
        self.guard = Guard(limits)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 20.0) -> str:
        """Bind and serve; returns the base URL.  Raises ``ServeError`` when the address cannot be used."""
        import uvicorn

        problems = serve_problems(self.host, self.port, self.service.api_key)
        if problems:
            raise ServeError("; ".join(problems) + ".")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            why = "it is in use (another server?)" if exc.errno == 98 else exc.strerror or str(exc)
            raise ServeError(f"Cannot listen on {self.host}:{self.port}: {why}. Pick another --port.") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.service),
            log_level="warning",
            lifespan="off",
            access_log=False,
            http=protocol_for(self.guard),  # its own connection caps and deadlines, not limit_concurrency
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            except BaseException as exc:  # SystemExit from uvicorn's own start-up failures too
                self._failed = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="brisk-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise ServeError(f"The server did not start ({self._failed!r}).")
            if time.monotonic() > deadline:
                self.stop()
                raise ServeError(f"The server did not start within {timeout:.0f} s.")
            time.sleep(0.02)
        return self.url

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
