"""One request's events as they are sent: the text streamed so far, and whether the request has ended.

:class:`ReplyEvents` sends events to ``on_event``; after a ``Done`` or ``Error``
it sends nothing more, and :meth:`ReplyEvents.fail` ends the request with an
``Error`` that carries the text streamed so far.  Times are seconds since
``t0``, the request's submission (``time.perf_counter()``).

:class:`Race` settles who answers a request that two sources may answer: the
model, whose reply is already under way, and the answer cache's semantic
lookup, which runs beside the prefill.  The first to send a ``Token``,
``Done`` or ``Error`` owns the reply; a ``Started`` claims nothing.  Once the
cache owns it, the model's events are dropped (its decode is cancelled);
once the model owns it, a late hit is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.api import Done, Error, Event, Started, Token, Warning


class Race:
    """Who answers one request: ``"open"`` until the model or the cache sends its first answering event."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while either side sends, so their events never interleave
        self.owner = "open"  # then "model" or "cache"
        self.started_sent = False  # the model already said Started (the cache's reply then does not)

    def claim(self, side: str) -> bool:
        """Call with :attr:`lock` held: true when ``side`` owns (or now takes) the reply."""
        if self.owner == "open":
            self.owner = side
        return self.owner == side


class ReplyEvents:
    """Sends one request's events, remembering the text streamed so far and whether it has ended."""

    def __init__(
        self, request_id: str, t0: float, on_event: Callable[[object], None], race: Race | None = None
    ) -> None:
        self.request_id = request_id
        self.t0 = t0
        self.on_event = on_event
        self.race = race  # the model's side of a race with the answer cache (None: no race)
        self.text: list[str] = []
        self.ended = False

    @property
    def lost(self) -> bool:
        """The answer cache answered this request: nothing more is sent, the decode may stop."""
        return self.race is not None and self.race.owner == "cache"

    def since(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, event: Event | Warning) -> None:
        if self.ended:
            return
        if self.race is not None:
            with self.race.lock:
                if isinstance(event, Started):
                    if self.race.owner == "cache":
                        return
                    self.race.started_sent = True
                elif not self.race.claim("model"):
                    self.ended = isinstance(event, Done | Error)
                    return
                self._send(event)
            return
        self._send(event)

    def _send(self, event: Event | Warning) -> None:
        if isinstance(event, Token):
            self.text.append(event.text)
        self.ended = isinstance(event, Done | Error)
        self.on_event(event)

    def fail(self, message: str) -> None:
        self.emit(Error(self.request_id, self.since(), message, "".join(self.text)))
