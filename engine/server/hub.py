"""One backend, many HTTP requests: each request's events go to the asyncio queue of the handler that sent it.

The engine calls ``on_event`` from its own thread with every event of every
request (the window's too, when the window shares its engine with the
server).  :meth:`Hub.dispatch` takes the events of the requests the server
submitted (True) and leaves the rest to the caller (False): it hands each to
the handler's event loop with ``call_soon_threadsafe`` and never blocks, so a
client that reads its stream slowly holds up nobody, the engine included (its
unread events wait in its own queue, at most ``max_tokens`` of them).

:meth:`Hub.close` ends a request the handler no longer waits for (its client
went away): the engine is told to cancel it at once, and its remaining events,
up to its ``Done``/``Error``, are swallowed here.  :class:`Log` keeps what the
Server panel shows: the requests in flight and the last few that ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.api import Done, Error, Event, Metrics, Request

RECENT = 50  # finished requests the log keeps


@dataclass(frozen=True)
class Entry:
    """One request as the Server panel lists it."""

    request_id: str
    client: str  # the peer address and, when sent, the User-Agent's first word
    endpoint: str
    started: float  # time.time()
    status: str = "running"  # running | done | error | cancelled | refused
    finish: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    total_s: float | None = None
    message: str = ""  # an error's text
    answer_cache: str = ""  # "exact" or "semantic" when the answer cache answered it


@dataclass
class Log:
    """Requests in flight and the last ``RECENT`` that ended (thread-safe)."""

    running: dict[str, Entry] = field(default_factory=dict)
    recent: deque[Entry] = field(default_factory=lambda: deque(maxlen=RECENT))
    served: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    listeners: list[Callable[[Entry, Metrics | None], None]] = field(default_factory=list)

    def begin(self, entry: Entry) -> None:
        with self._lock:
            self.running[entry.request_id] = entry

    def end(
        self, request_id: str, status: str, metrics: Metrics | None = None, finish: str = "", message: str = ""
    ) -> None:
        with self._lock:
            entry = self.running.pop(request_id, None)
            if entry is None:
                return
            m = metrics or Metrics()
            entry = replace(
                entry,
                status=status,
                finish=finish,
                prompt_tokens=m.prompt_tokens,
                completion_tokens=m.completion_tokens,
                cached_tokens=m.cached_tokens,
                ttft_s=m.ttft_s,
                total_s=m.total_s if m.total_s is not None else time.time() - entry.started,
                message=message,
                answer_cache=m.answer_cache or "",
            )
            self.recent.append(entry)
            self.served += 1
            listeners = list(self.listeners)
        for listener in listeners:
            try:
                listener(entry, metrics)
            except Exception:  # a listener (the window) must not break the server
                import traceback

                traceback.print_exc()

    def refused(self, entry: Entry, message: str) -> None:
        with self._lock:
            self.recent.append(replace(entry, status="refused", message=message, total_s=0.0))

    def snapshot(self) -> tuple[list[Entry], list[Entry], int]:
        """(in flight, recent newest first, served so far)."""
        with self._lock:
            return list(self.running.values()), list(reversed(self.recent)), self.served


class Hub:
    """Routes a backend's events to the server's handlers; ``submit``/``cancel`` are the backend's."""

    def __init__(self, submit: Callable[[Request], None], cancel: Callable[[str], None]) -> None:
        self._submit = submit
        self._cancel = cancel
        self._lock = threading.Lock()
        # request id -> (loop, queue) while a handler waits; (None, None) once it stopped waiting
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop | None, asyncio.Queue[Any] | None]] = {}
        self.log = Log()

    def open(self, request: Request, entry: Entry) -> asyncio.Queue[Any]:
        """Submit ``request`` (call on the handler's loop); its events arrive in the returned queue."""
        events: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            self._streams[request.id] = (asyncio.get_running_loop(), events)
        self.log.begin(entry)
        try:
            self._submit(request)
        except BaseException:
            with self._lock:
                self._streams.pop(request.id, None)
            self.log.end(request.id, "error", message="the engine did not take the request")
            raise
        return events

    def dispatch(self, event: object) -> bool:
        """Called with every backend event; True when it was one of the server's requests (handled here)."""
        if not isinstance(event, Event):
            return False
        with self._lock:
            target = self._streams.get(event.request_id)
            if target is None:
                return False
            ended = isinstance(event, Done | Error)
            if ended:
                del self._streams[event.request_id]
        if isinstance(event, Done):
            status = "cancelled" if event.finish_reason == "cancelled" or target[1] is None else "done"
            self.log.end(event.request_id, status, event.metrics, event.finish_reason)
        elif isinstance(event, Error):
            self.log.end(event.request_id, "cancelled" if target[1] is None else "error", message=event.message)
        loop, events = target
        if loop is not None and events is not None:
            with contextlib.suppress(RuntimeError):  # the server's loop has closed: nobody waits for it
                loop.call_soon_threadsafe(events.put_nowait, event)
        return True

    def close(self, request_id: str) -> None:
        """The handler stops waiting (its client left, or it has all it needs): cancel what still runs."""
        with self._lock:
            if self._streams.get(request_id, (None, None))[1] is None:
                return
            self._streams[request_id] = (None, None)
        self._cancel(request_id)

    def pending(self) -> int:
        with self._lock:
            return len(self._streams)
