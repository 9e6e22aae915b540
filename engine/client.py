"""One synchronous client over a :class:`~engine.api.Backend`: the CLI, the benchmarks and the tests share it.

``Client(backend_factory)`` builds the backend with a queue as its event sink.
``load(spec)`` blocks until ``Loaded`` (warnings seen on the way are kept in
``warnings``) and raises :class:`LoadError` on ``LoadFailed``; ``stream(request)``
yields that request's events up to and including its ``Done`` or ``Error``;
``ask(messages, ...)`` returns the ``Done`` or raises :class:`RequestError`.
The default backend is the local engine thread (imported only then: it needs torch).
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from engine.api import Backend, Done, Error, Event, Loaded, LoadFailed, ModelSpec, OnEvent, Request, Sampling, Warning

BackendFactory = Callable[[OnEvent], Backend]


class LoadError(Exception):
    """The model could not be loaded; the message is meant for the user."""


class RequestError(Exception):
    """A request ended with an ``Error`` event."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


def local_backend(prefix_cache_bytes: int | None = None, **options: Any) -> BackendFactory:
    """A factory for the local engine thread with these ``EngineOptions``."""

    def make(on_event: OnEvent) -> Backend:
        from engine.runtime.engine import Engine, EngineOptions

        if prefix_cache_bytes is not None:
            options["prefix_cache_bytes"] = prefix_cache_bytes
        return Engine(on_event, EngineOptions(**options))

    return make


class Client:
    def __init__(self, factory: BackendFactory | None = None, timeout: float | None = None) -> None:
        self.events: queue.Queue[object] = queue.Queue()
        self.backend = (factory or local_backend())(self.events.put)
        self.timeout = timeout  # seconds to wait for any one event (None: forever)
        self.loaded: Loaded | None = None
        self.warnings: list[Warning] = []

    def _next(self) -> object:
        return self.events.get(timeout=self.timeout)

    def load(self, spec: ModelSpec) -> Loaded:
        self.backend.load(spec)
        while True:
            event = self._next()
            if isinstance(event, Warning):
                self.warnings.append(event)
            elif isinstance(event, Loaded):
                self.loaded = event
                self._drain_warnings()
                return event
            elif isinstance(event, LoadFailed):
                raise LoadError(event.message)

    def _drain_warnings(self) -> None:
        """Take the warnings a load sends right after ``Loaded`` (the engine thread sends them in order)."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, Warning):
                self.warnings.append(event)

    def stream(self, request: Request, cancel_after: int | None = None) -> Iterator[Event]:
        """Yield ``request``'s events through its ``Done`` or ``Error``; cancel after ``cancel_after`` events."""
        self.backend.submit(request)
        seen = 0
        while True:
            event = self._next()
            if isinstance(event, Warning):
                self.warnings.append(event)
            if isinstance(event, Event) and event.request_id == request.id:
                seen += 1
                yield event
                if isinstance(event, Done | Error):
                    return
                if cancel_after is not None and seen == cancel_after:
                    self.backend.cancel(request.id)

    def ask(
        self,
        messages: list[dict[str, str]] | tuple[dict[str, str], ...],
        sampling: Sampling | None = None,
        **request_fields: Any,
    ) -> Done:
        request = Request(
            id=uuid.uuid4().hex, messages=tuple(messages), sampling=sampling or Sampling(), **request_fields
        )
        last: Event | None = None
        for event in self.stream(request):
            last = event
        if isinstance(last, Error):
            raise RequestError(last)
        assert isinstance(last, Done)
        return last

    def close(self) -> None:
        self.backend.shutdown()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
