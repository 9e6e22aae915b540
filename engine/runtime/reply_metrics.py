"""A reply's numbers, measured where they happen, gathered into :class:`~engine.api.Metrics`.

:class:`ReplyMeter` is fed by the decode stream (``engine.runtime.decode``):
``prefilled(item)`` for each prefill chunk, ``step(step)`` for each decode
step (the first one's arrival is the TTFT), ``token()`` when a token is taken
into the reply (times are read then, with ``time.perf_counter()``); ``metrics(...)`` gives the decode's
numbers (TTFT, TPOT mean/p50/p95, tokens/s, per-source ``DraftStats``).
:func:`request_metrics` adds the engine's own numbers (queue, prompt, cache
lookup, the waterfall of ``Span`` s).  All times are seconds since ``t0``, the
request's submission.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from engine.api import DraftStats, Metrics, Span
from engine.runtime.speculative import Controller
from engine.runtime.steps import Prefilled, Step


@dataclass
class ReplyMeter:
    """Collects one reply's timings and draft statistics."""

    t0: float  # perf_counter() at submission
    prefill_s: float | None = None
    first_s: float | None = None  # since t0: the model's first token was known (even an EOS)
    token_times: list[float] = field(default_factory=list)  # since t0, one per reply token
    sources: dict[str, DraftStats] = field(default_factory=dict)

    def prefilled(self, item: Prefilled) -> None:
        self.prefill_s = (self.prefill_s or 0.0) + item.seconds

    def token(self) -> None:
        self.token_times.append(time.perf_counter() - self.t0)

    def step(self, step: Step) -> None:
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.t0
        if step.source is not None:
            s = self.sources.get(step.source, DraftStats())
            self.sources[step.source] = DraftStats(s.drafted + step.drafted, s.accepted + step.accepted, s.steps + 1)

    def metrics(self, prompt_tokens: int, cached_tokens: int, controller: Controller, drafting: bool) -> Metrics:
        """The decode's numbers, read now (at the end of the reply)."""
        end = time.perf_counter() - self.t0
        n = len(self.token_times)
        ttft = self.first_s
        decode_s = end - ttft if ttft is not None else None
        gaps = sorted(b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False))
        drafted = sum(s.drafted for s in self.sources.values())
        accepted = sum(s.accepted for s in self.sources.values())
        steps = sum(s.steps for s in self.sources.values())
        speedup = None
        if drafting and controller.plain_step_s and n > 1 and decode_s:
            # the measured plain step time x tokens, against the time the reply actually took
            speedup = controller.plain_step_s * (n - 1) / decode_s
        return Metrics(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            computed_tokens=prompt_tokens - cached_tokens,
            prefill_s=self.prefill_s,
            ttft_s=ttft,
            completion_tokens=n,
            decode_s=decode_s,
            tpot_s=decode_s / (n - 1) if n > 1 and decode_s is not None else None,
            tpot_p50_s=quantile(gaps, 0.5),
            tpot_p95_s=quantile(gaps, 0.95),
            tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s else None,
            total_s=end,
            drafted=drafted,
            accepted=accepted,
            acceptance=accepted / drafted if drafted else None,
            accepted_per_step=accepted / steps if steps else None,
            draft_sources=dict(self.sources),
            plain_step_s=controller.plain_step_s if speedup is not None else None,
            speedup=speedup,
        )


def request_metrics(
    m: Metrics, queue_s: float, prompt_at: float, lookup_at: float, cache_bytes: int, truncated: bool
) -> Metrics:
    """``m`` with the engine's numbers: ``queue_s`` and the ends of prompt building and cache lookup (since t0)."""
    spans = [
        Span("queue", 0.0, queue_s),
        Span("prompt", queue_s, prompt_at),
        Span("cache lookup", prompt_at, lookup_at),
    ]
    if m.prefill_s is not None:
        spans.append(Span("prefill", lookup_at, lookup_at + m.prefill_s))
    if m.ttft_s is not None:
        spans.append(Span("first token", lookup_at + (m.prefill_s or 0.0), m.ttft_s))
        if m.total_s is not None and m.completion_tokens > 1:
            spans.append(Span("decode", m.ttft_s, m.total_s))
    return dataclasses.replace(
        m,
        queue_s=queue_s,
        prompt_s=prompt_at - queue_s,
        lookup_s=lookup_at - prompt_at,
        cache_bytes=cache_bytes,
        truncated=truncated,
        spans=tuple(spans),
    )


def quantile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of already sorted values (nearest rank), or None when there are none."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]
