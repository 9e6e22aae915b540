"""A reply's numbers, measured where they happen, gathered into :class:`~engine.api.Metrics`.

:class:`ReplyMeter` is fed by the decode stream (``engine.runtime.decode``):
``prefilled(item)`` for each prefill chunk, ``step(step)`` for each decode
step (the first one's arrival is the TTFT), ``token()`` when a token is taken
into the reply (times are read then, with ``time.perf_counter()``), ``split(...)`` once its text went through
the thinking split (``engine.runtime.thinking``: thinking tokens, the thinking's end, the first answer text);
``metrics(...)`` gives the decode's
numbers (TTFT, TPOT mean/p50/p95 from each token's share of its step, tokens/s, per-source ``DraftStats``,
the speed-up against the median plain step once enough were measured).
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
from engine.runtime.steps import FORCED, Prefilled, Step
from engine.runtime.thinking import ThinkingSplit


@dataclass
class ReplyMeter:
    """Collects one reply's timings and draft statistics."""

    t0: float  # perf_counter() at submission
    prefill_s: float | None = None
    first_s: float | None = None  # since t0: the model's first token was known (even an EOS)
    token_times: list[float] = field(default_factory=list)  # since t0, one per reply token
    step_tokens: list[list[float]] = field(default_factory=list)  # the token times, grouped by the step that made them
    sources: dict[str, DraftStats] = field(default_factory=dict)
    forced: int = 0  # tokens the format forced and the model confirmed
    thought: bool = False  # the reply had a thinking part (<think>...</think>)
    thinking_tokens: int = 0  # tokens taken while the reply was (or could still be) in its thinking
    thinking_end_s: float | None = None  # since t0: the thinking's closing tag was read
    answer_s: float | None = None  # since t0: the first answer text went out

    def prefilled(self, item: Prefilled) -> None:
        self.prefill_s = (self.prefill_s or 0.0) + item.seconds

    def token(self) -> None:
        now = time.perf_counter() - self.t0
        self.token_times.append(now)
        if not self.step_tokens:
            self.step_tokens.append([])
        self.step_tokens[-1].append(now)

    def split(self, was_inside: bool, split: ThinkingSplit, answered: bool) -> None:
        """A token's text went through ``split``: ``was_inside`` before it (it counts as thinking; False for the
        end's flush, no token), ``answered``: answer text went out."""
        now = time.perf_counter() - self.t0
        self.thought = split.thought
        self.thinking_tokens += was_inside
        if was_inside and not split.inside:
            self.thinking_end_s = now
        if answered and self.answer_s is None:
            self.answer_s = now

    def step(self, step: Step) -> None:
        self.step_tokens.append([])
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.t0
        if step.source == FORCED:
            self.forced += step.accepted
        elif step.source is not None:
            s = self.sources.get(step.source, DraftStats())
            self.sources[step.source] = DraftStats(s.drafted + step.drafted, s.accepted + step.accepted, s.steps + 1)

    def metrics(self, prompt_tokens: int, cached_tokens: int, controller: Controller, drafting: bool) -> Metrics:
        """The decode's numbers, read now (at the end of the reply)."""
        end = time.perf_counter() - self.t0
        n = len(self.token_times)
        ttft = self.first_s
        decode_s = end - ttft if ttft is not None else None
        gaps = sorted(per_token_times(self.step_tokens))
        drafted = sum(s.drafted for s in self.sources.values())
        accepted = sum(s.accepted for s in self.sources.values())
        steps = sum(s.steps for s in self.sources.values())
        speedup = None
        plain = controller.plain_step_reference()
        if drafting and plain and n > 1 and decode_s:
            # a robust plain step time (the median of the latest, only once enough were measured) x tokens,
            # against the time the reply actually took
            speedup = plain * (n - 1) / decode_s
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
            forced=self.forced,
            plain_step_s=plain if speedup is not None else None,
            speedup=speedup,
            thinking_tokens=self.thinking_tokens if self.thought else 0,
            thinking_s=(self.thinking_end_s or end) - ttft if self.thought and ttft is not None else None,
            answer_ttft_s=self.answer_s if self.thought else None,
        )


def per_token_times(step_tokens: list[list[float]]) -> list[float]:
    """Each token's share of the step that made it: a step's time (since the previous step's last token)
    divided among its tokens.  Tokens a verification accepted together arrive together; the gaps between
    their arrivals (0.0 ms) said nothing about what a token cost.  The first step (the first token) is
    the TTFT's, not counted."""
    out: list[float] = []
    previous: float | None = None
    for times in step_tokens:
        if not times:
            continue
        if previous is not None:
            out.extend([(times[-1] - previous) / len(times)] * len(times))
        previous = times[-1]
    return out


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
        answer_at = m.ttft_s
        if m.thinking_s is not None:  # the thinking's own bar; the decode bar is the answer's
            answer_at = m.ttft_s + m.thinking_s
            spans.append(Span("thinking", m.ttft_s, answer_at))
        if m.total_s is not None and m.completion_tokens > 1 and m.total_s > answer_at:
            spans.append(Span("decode", answer_at, m.total_s))
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
