"""One request's events as they are sent: the text streamed so far, and whether the request has ended.

:class:`ReplyEvents` sends events to ``on_event``; after a ``Done`` or ``Error``
it sends nothing more, and :meth:`ReplyEvents.fail` ends the request with an
``Error`` that carries the text streamed so far.  Times are seconds since
``t0``, the request's submission (``time.perf_counter()``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.api import Done, Error, Event, Token


class ReplyEvents:
    """Sends one request's events, remembering the text streamed so far and whether it has ended."""

    def __init__(self, request_id: str, t0: float, on_event: Callable[[object], None]) -> None:
        self.request_id = request_id
        self.t0 = t0
        self.on_event = on_event
        self.text: list[str] = []
        self.ended = False

    def since(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, event: Event) -> None:
        if self.ended:
            return
        if isinstance(event, Token):
            self.text.append(event.text)
        self.ended = isinstance(event, Done | Error)
        self.on_event(event)

    def fail(self, message: str) -> None:
        self.emit(Error(self.request_id, self.since(), message, "".join(self.text)))
