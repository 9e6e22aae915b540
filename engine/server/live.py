"""A streamed reply's figures while it streams, as llama-server sends them: ``prompt_progress`` and per-token
``timings``.  No I/O.

A client that sends ``return_progress: true`` (``/completion``, ``/infill``, and the streamed
``/v1/chat/completions`` and ``/v1/completions``) gets, before the first token, one chunk when the prompt's
reading starts and one after each prefill chunk the engine computed (``engine.runtime.steps``:
``PREFILL_CHUNK`` tokens; the engine's ``PrefillProgress`` events), each with::

    "prompt_progress": {"total": 300, "cache": 44, "processed": 300, "time_ms": 41}

``total`` is the prompt's tokens, ``cache`` those whose KV came from the prefix cache (no prefill for them),
``processed`` the cached ones plus those computed so far (``processed == total`` on the last), ``time_ms``
the milliseconds since the reading started (the cache lookup's end).  The overall progress is
``processed / total``; the computed part's is ``(processed - cache) / (total - cache)``: llama.cpp's fields
and meaning.  A reply the answer cache gave reads no prompt and sends none.  The engine sends its
``PrefillProgress`` events for every request (the window's panel draws them); the server turns them into
chunks only for a client that asked.

``timings_per_token: true`` puts llama.cpp's ``timings`` (:func:`timings`) on every streamed chunk: so far
at each chunk, the reply's measured ``Metrics`` on the last.
"""

from __future__ import annotations

from typing import Any

from engine.api import Metrics, PrefillProgress, Started, Thinking, Token


def timings(m: Metrics) -> dict[str, float | int]:
    """Brisk's measured times of one reply in llama.cpp's ``timings`` fields (milliseconds)."""
    prompt_ms = (m.prefill_s or 0.0) * 1000
    predicted_ms = (m.decode_s or 0.0) * 1000
    computed = m.computed_tokens
    return {
        "cache_n": m.cached_tokens,
        "prompt_n": computed,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / computed if computed else 0.0,
        "prompt_per_second": computed / prompt_ms * 1000 if prompt_ms and computed else 0.0,
        "predicted_n": m.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": (m.tpot_s or 0.0) * 1000,
        "predicted_per_second": m.tokens_per_s or 0.0,
    }


class Live:
    """One streamed reply's figures so far, from its ``Started`` and the events after it."""

    def __init__(self, started: Started | None) -> None:
        self.total = started.prompt_tokens if started is not None else 0
        self.cache = started.cached_tokens if started is not None else 0
        self.read_at = started.t if started is not None else 0.0  # the prompt's reading began (seconds since t0)
        self.processed = self.cache
        self.prefill_s = 0.0  # the chunks' own compute time, as Metrics.prefill_s sums it
        self.tokens = 0
        self.first_t: float | None = None  # the first token's event
        self.last_t: float | None = None

    def start(self) -> dict[str, Any] | None:
        """The first ``prompt_progress``: the reading begins, the cached tokens already in (None for a reply
        that reads no prompt: an answer-cache hit)."""
        if not self.total:
            return None
        return self.progress_now(self.read_at)

    def prefilled(self, event: PrefillProgress) -> dict[str, Any] | None:
        """The ``prompt_progress`` after one prefill chunk; None after the first token (a tool round's own
        prompt is not this reply's reading)."""
        if self.first_t is not None:
            return None
        self.total = event.total
        self.processed = event.done
        self.prefill_s += event.seconds
        return self.progress_now(event.t)

    def progress_now(self, t: float) -> dict[str, Any]:
        return {
            "total": self.total,
            "cache": self.cache,
            "processed": self.processed,
            "time_ms": max(0, round((t - self.read_at) * 1000)),
        }

    def token(self, event: Token | Thinking) -> None:
        self.tokens += len(event.ids)
        if self.first_t is None:
            self.first_t = event.t
        self.last_t = event.t

    def metrics(self) -> Metrics:
        """The reply's numbers so far: the prefill's, then the decode's since its first token."""
        decode_s = (self.last_t or 0.0) - (self.first_t or 0.0)
        gaps = self.tokens - 1
        return Metrics(
            prompt_tokens=self.total,
            cached_tokens=self.cache,
            computed_tokens=max(0, self.processed - self.cache),
            completion_tokens=self.tokens,
            prefill_s=self.prefill_s,
            decode_s=decode_s,
            tpot_s=decode_s / gaps if gaps > 0 else None,
            tokens_per_s=gaps / decode_s if gaps > 0 and decode_s > 0 else None,
        )

    def timings(self) -> dict[str, float | int]:
        return timings(self.metrics())
