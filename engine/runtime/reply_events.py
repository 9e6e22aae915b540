"""One request's events as they are sent: the text streamed so far, and whether the request has ended.

:class:`ReplyEvents` sends events to ``on_event``; after a ``Done`` or ``Error``
it sends nothing more, and :meth:`ReplyEvents.fail` ends the request with an
``Error`` that carries the text streamed so far.  Times are seconds since
``t0``, the request's submission (``time.perf_counter()``).

A request the answer cache answers after the model began it (a semantic hit
that came back before the model's first token, ``engine.runtime.scheduler``)
is *muted*: whatever the model's side sends for it afterwards is dropped, and
the cached reply leaves out the ``Started`` the model already sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.api import Done, Error, Event, Started, Token, Warning


class ReplyEvents:
    """Sends one request's events, remembering the text streamed so far and whether it has ended."""

    def __init__(self, request_id: str, t0: float, on_event: Callable[[object], None]) -> None:
        self.request_id = request_id
        self.t0 = t0
        self.on_event = on_event
        self.text: list[str] = []
        self.ended = False
        self.started_sent = False  # a Started went out (a cached reply that takes over then sends none)
        self.answered = False  # a Token, Done or Error went out: the reply is the model's for good
        self.muted = False  # the answer cache answered it: nothing more is sent, the decode may stop

    def since(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, event: Event | Warning) -> None:
        if self.ended or self.muted:
            return
        if isinstance(event, Started):
            self.started_sent = True
        elif isinstance(event, Token | Done | Error):
            self.answered = True
        if isinstance(event, Token):
            self.text.append(event.text)
        self.ended = isinstance(event, Done | Error)
        self.on_event(event)

    def fail(self, message: str) -> None:
        self.emit(Error(self.request_id, self.since(), message, "".join(self.text)))
