"""Frozen request and event types: the engine's whole public surface.

A :class:`Request` goes in; a stream of events comes out, always in this order:
``Started``, zero or more ``PrefillProgress``, zero or more ``Token``, then
exactly one of ``Done`` or ``Error``.  Every event carries ``t``: seconds since
the request was submitted, measured with ``time.perf_counter()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    """One reply to produce.

    ``messages`` are chat messages (``{"role": ..., "content": ...}``) ending
    with the user's turn.  ``conversation_id`` lets the engine keep that
    conversation's KV cache between turns.
    """

    id: str
    messages: tuple[dict[str, str], ...]
    sampling: Sampling = field(default_factory=Sampling)
    conversation_id: str | None = None
    prefix_cache: bool = True
    speculative: str = "off"
    submitted_at: float = 0.0  # perf_counter() at submission; set by the engine if 0


@dataclass(frozen=True)
class Event:
    request_id: str
    t: float

    @property
    def type(self) -> str:
        return _TYPE_NAMES[type(self)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("request_id")
        return {"type": self.type, **data}


@dataclass(frozen=True)
class Started(Event):
    prompt_tokens: int = 0
    truncated: bool = False  # older turns were dropped to fit the context
    cached_tokens: int = 0  # prompt tokens whose KV is reused from a cache


@dataclass(frozen=True)
class PrefillProgress(Event):
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class Token(Event):
    text: str = ""
    ids: tuple[int, ...] = ()
    draft: bool = False  # True when the tokens were drafted and accepted


@dataclass(frozen=True)
class Done(Event):
    text: str = ""
    finish_reason: str = "stop"  # "stop" | "length" | "cancelled"
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Error(Event):
    message: str = ""
    partial_text: str = ""


@dataclass(frozen=True)
class LoadProgress:
    """Model-loading progress; not tied to a request."""

    fraction: float
    message: str


@dataclass(frozen=True)
class Loaded:
    model_name: str
    device: str
    dtype: str
    load_s: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadFailed:
    message: str


_TYPE_NAMES = {
    Started: "started",
    PrefillProgress: "prefill",
    Token: "token",
    Done: "done",
    Error: "error",
}
