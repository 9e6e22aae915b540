"""What the latency panel knows about the reply in view, folded from engine events (no Qt).

:class:`ReplyTrace` takes the events of one request (``Started``,
``PrefillProgress``, ``Token``, ``ToolCall``, ``Done``, ``Error``) and keeps
the points of the live chart (``t`` and the running token count of each
``Token``, with its ``draft`` flag), the prefill progress, the tool calls and,
at the end, the engine's :class:`~engine.api.Metrics`.  :meth:`numbers` gives
every figure the panel shows: while streaming, timings measured on the token
events themselves (TTFT is the first token's ``t``; TPOT the gaps between
tokens); once ``Done`` arrives, the engine's own figures.  :meth:`spans` is the
waterfall: ``Metrics.spans`` when the reply is done, else the bars known so
far (the wait for the first token, a thinking model's thinking (``Thinking`` events, counted as tokens:
from the first token to the first answer token) and decode up to the last token).
``version`` grows with every change, so a view can redraw only when it moved.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from engine.api import Done, Error, Metrics, PrefillProgress, Span, Started, Thinking, Token, ToolCall


@dataclass
class TokenPoint:
    t: float
    count: int  # tokens so far, this one included
    draft: bool


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class ReplyTrace:
    request_id: str
    status: str = "streaming"  # streaming | done | cancelled | error
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prefill: tuple[int, int] | None = None
    started_t: float | None = None
    points: list[TokenPoint] = field(default_factory=list)
    tools: list[ToolCall] = field(default_factory=list)
    metrics: Metrics | None = None
    last_t: float = 0.0
    thinking_tokens: int = 0
    thinking_t: float | None = None  # the last Thinking event's t
    answer_t: float | None = None  # the first answer Token's t
    version: int = 0
    _gaps: list[float] = field(default_factory=list, repr=False)
    _numbers: tuple[int, dict[str, Any]] = (-1, {})

    @property
    def tokens(self) -> int:
        return self.points[-1].count if self.points else 0

    def apply(self, event: object) -> bool:
        """Fold one event in; False when it is not this request's."""
        if getattr(event, "request_id", None) != self.request_id:
            return False
        if isinstance(event, Started):
            self.prompt_tokens = event.prompt_tokens
            self.cached_tokens = event.cached_tokens if event.cached_tokens else self.cached_tokens
            self.started_t = event.t
        elif isinstance(event, PrefillProgress):
            self.prefill = (event.done, event.total)
        elif isinstance(event, Token | Thinking):
            count = len(event.ids) or 1
            if isinstance(event, Thinking):
                self.thinking_t, self.thinking_tokens = event.t, self.thinking_tokens + count
            elif self.answer_t is None:
                self.answer_t = event.t
            if self.points:  # seconds per token since the last event (a drafted burst spreads over its tokens)
                self._gaps.extend([(event.t - self.points[-1].t) / count] * count)
            self.points.append(TokenPoint(event.t, self.tokens + count, isinstance(event, Token) and event.draft))
        elif isinstance(event, ToolCall):
            self.tools.append(event)
        elif isinstance(event, Done):
            self.metrics = event.metrics
            self.status = "cancelled" if event.finish_reason == "cancelled" else "done"
        elif isinstance(event, Error):
            self.status = "error"
        else:
            return False
        self.last_t = max(self.last_t, float(getattr(event, "t", 0.0) or 0.0))
        self.version += 1
        return True

    # -- what the panel shows ---------------------------------------------------------------
    def gaps(self) -> list[float]:
        """Seconds per token between token events after the first (a drafted burst spreads over its tokens)."""
        return list(self._gaps)

    def numbers(self) -> dict[str, Any]:
        """Every figure known now; a key is missing when nothing measured it (computed once per version)."""
        if self._numbers[0] != self.version:
            self._numbers = (self.version, self._compute())
        return self._numbers[1]

    def _compute(self) -> dict[str, Any]:
        live: dict[str, Any] = {}
        if self.prompt_tokens is not None:
            live["prompt_tokens"] = self.prompt_tokens
        if self.cached_tokens is not None:
            live["cached_tokens"] = self.cached_tokens
            if self.prompt_tokens is not None:
                live["computed_tokens"] = self.prompt_tokens - self.cached_tokens
        if self.prefill is not None:
            live["prefill"] = self.prefill
        if self.points:
            first = self.points[0]
            live["ttft_s"] = first.t
            live["completion_tokens"] = self.tokens
            gaps = self._gaps
            if gaps:
                live["tpot_s"] = statistics.fmean(gaps)
                live["tpot_p50_s"] = _quantile(gaps, 0.5)
                live["tpot_p95_s"] = _quantile(gaps, 0.95)
                span = self.points[-1].t - first.t
                if span > 0:
                    live["tokens_per_s"] = (self.tokens - first.count) / span
            drafted = self._drafted()
            if drafted:
                live["draft_events"] = drafted
        if self.thinking_t is not None and self.points:
            live["thinking_tokens"] = self.thinking_tokens
            live["thinking_s"] = (self.answer_t or self.thinking_t) - self.points[0].t
            if self.answer_t is not None:
                live["answer_ttft_s"] = self.answer_t
        if self.tools:
            live["tools_wall_s"] = max(c.end for c in self.tools) - min(c.start for c in self.tools)
        if self.metrics is not None:
            final = {k: v for k, v in vars(self.metrics).items() if v is not None}
            if self.metrics.spans == ():
                final.pop("spans", None)
            live.update(final)
        return live

    def _drafted(self) -> int:
        return sum(1 for p in self.points if p.draft)

    def spans(self) -> tuple[Span, ...]:
        if self.metrics is not None and self.metrics.spans:
            return self.metrics.spans
        bars: list[Span] = []
        start = self.started_t or 0.0
        if self.started_t:
            bars.append(Span("queue", 0.0, self.started_t))
        if self.points:
            first = self.points[0].t
            bars.append(Span("first token", start, first))
            if self.thinking_t is not None:  # the thinking's own bar; decode is the answer's
                first = self.answer_t or self.points[-1].t
                bars.append(Span("thinking", self.points[0].t, first))
            if self.points[-1].t > first:
                bars.append(Span("decode", first, self.points[-1].t))
        elif self.status == "streaming" and self.last_t > start:
            bars.append(Span("prefill" if self.prefill else "first token", start, self.last_t))
        bars += [Span(f"tool:{c.name}", c.start, c.end) for c in self.tools]
        return tuple(bars)
