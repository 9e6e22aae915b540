"""Plain-Python state of one assistant reply, folded from engine events (no Qt).

:class:`ReplyState` accepts the events of its own request (``Started``,
``PrefillProgress``, ``Token``, ``Done``, ``Error``) through :meth:`apply` and
keeps everything a view needs: the text as segments flagged draft / not draft,
the tool calls (``ToolCall`` events, saved as ``metrics["tool_calls"]``), a thinking model's thinking
(``Thinking`` events: apart from the text, saved as ``metrics["thinking"]``; :func:`thinking_line` says how
long it thought),
the live timings taken from the events' ``t`` (TTFT, running tok/s), the final
metrics, and the status (``streaming``, ``done``, ``cancelled`` or ``error``,
the same words the store uses).

:func:`stats_line` formats metrics as the grey line under a reply, showing only
the parts whose numbers exist.  Nothing here estimates: every number comes from
an event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.state.config import ReplyConfig
from app.state.tools import call_record
from engine.api import Done, Error, Metrics, PrefillProgress, Started, Thinking, Token, ToolCall, prompt_counts

FORCED = "forced"  # a segment's provenance for text the reply's format forced (True: drafted and accepted)

SEP = " \u00b7 "  # " · "


@dataclass
class ReplyState:
    request_id: str
    message_id: int
    conversation_id: str
    # (text, provenance): False the model's own, True drafted and accepted, "forced" by the reply's format
    segments: list[tuple[str, bool | str]] = field(default_factory=list)
    status: str = "streaming"
    finish_reason: str = ""
    truncated: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # known from Done, or earlier if the engine's events carry it
    prefill: tuple[int, int] | None = None
    first_token_t: float | None = None
    last_token_t: float | None = None
    tokens: int = 0
    tokens_at_first: int = 0
    metrics: Metrics | None = None  # the engine's final numbers, from Done
    error: str = ""
    config: ReplyConfig | None = None  # the switches it ran with (saved as metrics["config"])
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # app.state.tools.call_record of each call
    thinking: str = ""  # the text of its <think>...</think>, apart from ``text`` (the answer)
    thinking_tokens: int = 0
    thinking_t: float | None = None  # the last Thinking event's t
    answer_t: float | None = None  # the first answer Token's t

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)

    @property
    def streaming(self) -> bool:
        return self.status == "streaming"

    def append(self, text: str, draft: bool | str = False) -> None:
        if not text:
            return
        if self.segments and self.segments[-1][1] == draft:
            self.segments[-1] = (self.segments[-1][0] + text, draft)
        else:
            self.segments.append((text, draft))

    def apply(self, event: object) -> bool:
        """Fold one event in; return False when it is not for this streaming reply."""
        if getattr(event, "request_id", None) != self.request_id or not self.streaming:
            return False
        if isinstance(event, Started):
            self.prompt_tokens = event.prompt_tokens
            self.truncated = self.truncated or event.truncated
            self._note_cached(event)
        elif isinstance(event, PrefillProgress):
            self.prefill = (event.done, event.total)
            self._note_cached(event)
        elif isinstance(event, Token | Thinking):
            count = len(event.ids) or 1
            if self.first_token_t is None:
                self.first_token_t = event.t
                self.tokens_at_first = count
            self.last_token_t = event.t
            self.tokens += count
            if isinstance(event, Thinking):
                self.thinking += event.text
                self.thinking_tokens += count
                self.thinking_t = event.t
            else:
                self.answer_t = event.t if self.answer_t is None else self.answer_t
                self.append(event.text, FORCED if event.forced else event.draft)
        elif isinstance(event, ToolCall):
            self.tool_calls.append(call_record(event))
        elif isinstance(event, Done):
            if event.text and event.text != self.text:
                self.segments = [(event.text, False)]
            self.thinking = event.thinking or self.thinking
            self.metrics = event.metrics
            self.finish_reason = event.finish_reason
            self.truncated = self.truncated or event.metrics.truncated
            self.status = "cancelled" if event.finish_reason == "cancelled" else "done"
        elif isinstance(event, Error):
            if not self.segments and event.partial_text:
                self.segments = [(event.partial_text, False)]
            self.error = event.message or "The engine reported an error without a message."
            self.status = "error"
        else:
            return False
        return True

    def _note_cached(self, event: object) -> None:
        """Engines that know the prompt-cache hit before the first token may say so early."""
        cached = getattr(event, "cached_tokens", None)
        if isinstance(cached, int) and not isinstance(cached, bool):
            self.cached_tokens = cached

    def stop(self) -> None:
        """The user pressed Stop: end the reply here, keeping the text so far."""
        if self.streaming:
            self.status = "cancelled"
            self.finish_reason = "cancelled"

    def live_metrics(self) -> dict[str, Any]:
        """Timings measured on the token events received so far."""
        live: dict[str, Any] = {}
        if self.first_token_t is not None:
            live["ttft_s"] = self.first_token_t
            live["completion_tokens"] = self.tokens
        if self.last_token_t is not None and self.first_token_t is not None:
            span = self.last_token_t - self.first_token_t
            if span > 0 and self.tokens > self.tokens_at_first:
                live["tokens_per_s"] = (self.tokens - self.tokens_at_first) / span
        if self.prompt_tokens is not None:
            live["prompt_tokens"] = self.prompt_tokens
        if self.cached_tokens is not None:
            live["cached_tokens"] = self.cached_tokens
        if self.thinking_t is not None and self.first_token_t is not None:
            live["thinking_tokens"] = self.thinking_tokens
            live["thinking_s"] = self.thinking_t - self.first_token_t
            if self.answer_t is not None:
                live["answer_ttft_s"] = self.answer_t
        return live

    def shown_metrics(self) -> dict[str, Any]:
        """Live timings overlaid with the engine's final metrics once they arrive."""
        return {**self.live_metrics(), **measured(self.metrics)}

    def stored_metrics(self) -> dict[str, Any]:
        """What is saved with the message, so a restart shows the same line."""
        saved = self.shown_metrics()
        if self.finish_reason:
            saved["finish_reason"] = self.finish_reason
        if self.truncated:
            saved["truncated"] = True
        if self.error:
            saved["error"] = self.error
        if self.config is not None:
            saved["config"] = self.config.to_dict()
        if self.tool_calls:
            saved["tool_calls"] = list(self.tool_calls)
        if self.thinking:
            saved["thinking"] = self.thinking
        return saved

    @property
    def thinking_now(self) -> bool:
        """The reply is streaming and still inside its thinking (no answer text yet)."""
        return self.streaming and self.thinking_t is not None and self.answer_t is None

    def thinking_line(self) -> str:
        """The line over the reply's thinking, right now ("" for a reply that did not think)."""
        return thinking_line(self.shown_metrics(), self.thinking_now) if self.thinking_t or self.thinking else ""

    def status_line(self) -> str:
        """The grey line under the reply, right now."""
        if self.streaming and self.first_token_t is None:
            if self.prefill and self.prefill[1]:
                done, total = self.prefill
                return f"Reading the prompt: {done} of {total} tokens\u2026"
            return "Waiting for the first token\u2026"
        return stats_line(self.shown_metrics(), self.finish_reason if not self.streaming else "")


def measured(metrics: Metrics | None) -> dict[str, Any]:
    """The numbers ``metrics`` carries, JSON-ready, without the ones not measured (``None``)."""
    if metrics is None:
        return {}
    return {key: value for key, value in metrics.to_dict().items() if value is not None}


def _num(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def thinking_line(metrics: Mapping[str, Any], thinking_now: bool = False) -> str:
    """The clickable line over a reply's thinking, e.g. ``Thought for 4.2 s (310 tokens), first answer token at
    4.3 s``; while it still thinks ``Thinking… 2.1 s``; "" without thinking numbers."""
    seconds, tokens = _num(metrics, "thinking_s"), _num(metrics, "thinking_tokens")
    if thinking_now:
        return f"Thinking\u2026 {seconds or 0.0:.1f} s"
    if not tokens:
        return ""
    line = f"Thought for {seconds:.1f} s ({int(tokens)} tokens)" if seconds is not None else "Thought"
    first = _num(metrics, "answer_ttft_s")
    return line + (f", first answer token at {first:.1f} s" if first is not None else "")


def stats_line(metrics: Metrics | Mapping[str, Any], finish_reason: str = "") -> str:
    """The grey line under a reply, from whichever numbers exist, e.g.

    ``TTFT 0.21 s · 38.2 tok/s · 120 tokens · reused 1180 of 1200 prompt tokens ·
    accepted 31 of 40 drafted (78 %) · 1.8× plain decode``.

    The reuse part needs ``cached_tokens`` (the engine's final metrics carry it,
    0 included); until it is known only the prompt size is shown.
    """
    if isinstance(metrics, Metrics):
        metrics = measured(metrics)
    parts: list[str] = []
    ttft = _num(metrics, "ttft_s")
    if ttft is not None:
        parts.append(f"TTFT {ttft:.2f} s")
    tps = _num(metrics, "tokens_per_s")
    if tps is not None:
        parts.append(f"{tps:.1f} tok/s")
    completion = _num(metrics, "completion_tokens")
    if completion is not None:
        parts.append(f"{int(completion)} tokens")
    prompt, cached = prompt_counts(metrics)  # a remote engine: only what its server reported
    if prompt:  # unknown, or none read (a reply from the answer cache): no "reused 0 of 0"
        parts.append(f"reused {cached} of {prompt} prompt tokens" if cached is not None else f"{prompt} prompt tokens")
    drafted, accepted = _num(metrics, "drafted"), _num(metrics, "accepted")
    if drafted:  # missing or zero: nothing was drafted for this reply, nothing to say
        accepted = accepted or 0
        parts.append(f"accepted {int(accepted)} of {int(drafted)} drafted ({100 * accepted / drafted:.0f} %)")
    speedup = _num(metrics, "speedup")
    if speedup is not None:
        parts.append(f"{speedup:.1f}\u00d7 plain decode")
    quant = metrics.get("quant")
    if isinstance(quant, str) and quant not in ("", "none"):
        parts.append(quant)
    if finish_reason == "cancelled":
        parts.append("stopped")
    elif finish_reason == "length":
        parts.append("reached the token limit")
    elif finish_reason == "repetition":
        parts.append("stopped: it was repeating itself")
    return SEP.join(parts)
