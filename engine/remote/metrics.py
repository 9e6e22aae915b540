"""One streamed reply's chunks in, its text and :class:`~engine.api.Metrics` out: what is measured where.

:class:`ReplyStats` takes each chat-completion chunk with the client's arrival
time (``time.perf_counter()``) and returns the text deltas to send as tokens.
At the end, :meth:`ReplyStats.metrics` gives:

- measured here, at the client: ``ttft_s`` (submission to the first non-empty
  delta), ``decode_s`` (first delta to the last), the gaps between deltas
  (``tpot_p50_s``/``tpot_p95_s``: per token when the server sends one token
  per chunk, as llama.cpp, vLLM, SGLang and Ollama do by default),
  ``tpot_s`` and ``tokens_per_s`` over the completion tokens, ``total_s``;
- reported by the server, when it does: ``prompt_tokens`` and
  ``completion_tokens`` (``usage``; else llama.cpp's ``timings``; else the
  count of deltas), ``cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``
  or llama.cpp's ``timings.cache_n``), ``prefill_s`` (llama.cpp's
  ``timings.prompt_ms``).  Draft acceptance, KV reuse bytes and the waterfall's
  prefill split are not reported by these servers and stay ``None``/0.

:meth:`ReplyStats.server` gives the server's own figures as it sent them
(``usage``, ``timings``, ``model``, ``system_fingerprint``, ``finish_reason``).
"""

from __future__ import annotations

from typing import Any

from engine.api import Metrics, Span

from .errors import MalformedChunk


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def _as_dict(value: Any) -> dict[str, Any] | None:
    """A pydantic model (typed or built without validation) or a dict, as a plain dict."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        try:
            out = dump(warnings=False)
        except TypeError:
            out = dump()
        return out if isinstance(out, dict) else None
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class ReplyStats:
    """The text, timings and server figures of one streamed reply."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.parts: list[str] = []
        self.times: list[float] = []  # arrival of each non-empty delta
        self.finish_reason: str | None = None  # as the server said it
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.model = ""
        self.fingerprint = ""
        self.t_end: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: Any, t: float) -> list[str]:
        """Take one chunk that arrived at ``t``; return its text deltas (or raise :class:`MalformedChunk`)."""
        extra = getattr(chunk, "model_extra", None) or {}
        if getattr(chunk, "object", None) == "error" or "error" in extra:  # vLLM and others send errors as a chunk
            detail = extra.get("error", extra.get("message", ""))
            if isinstance(detail, dict):
                detail = detail.get("message", detail)
            raise MalformedChunk(f"the server reported an error: {detail}")
        choices = getattr(chunk, "choices", None)
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise MalformedChunk(f"'choices' is {type(choices).__name__}, not a list")
        self.model = str(getattr(chunk, "model", "") or self.model)
        self.fingerprint = str(getattr(chunk, "system_fingerprint", "") or self.fingerprint)
        usage = _as_dict(getattr(chunk, "usage", None))
        if usage:
            self.usage = usage
        timings = extra.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        out: list[str] = []
        for choice in choices:
            if getattr(choice, "index", 0) not in (0, None):
                continue
            delta = getattr(choice, "delta", None)
            if delta is None and not hasattr(choice, "finish_reason"):
                raise MalformedChunk("a choice with neither 'delta' nor 'finish_reason'")
            content = getattr(delta, "content", None) if delta is not None else None
            if content is not None and not isinstance(content, str):
                raise MalformedChunk(f"'content' is {type(content).__name__}, not text")
            if content:
                out.append(content)
                self.parts.append(content)
                self.times.append(t)
            reason = getattr(choice, "finish_reason", None)
            if reason:
                self.finish_reason = str(reason)
        return out

    def server(self) -> dict[str, Any]:
        """The server's own figures for this reply, as it reported them."""
        out: dict[str, Any] = {}
        if self.usage is not None:
            out["usage"] = self.usage
        if self.timings is not None:
            out["timings"] = self.timings
        if self.model:
            out["model"] = self.model
        if self.fingerprint:
            out["system_fingerprint"] = self.fingerprint
        if self.finish_reason:
            out["finish_reason"] = self.finish_reason
        return out

    def metrics(self, t_end: float) -> Metrics:
        usage = self.usage or {}
        timings = self.timings or {}
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        cached = _int(details.get("cached_tokens"))
        if cached is None:
            cached = _int(timings.get("cache_n"))
        prompt = _int(usage.get("prompt_tokens"))
        if prompt is None and _int(timings.get("prompt_n")) is not None:
            prompt = (_int(timings.get("prompt_n")) or 0) + (cached or 0)
        completion = _int(usage.get("completion_tokens"))
        if completion is None:
            completion = _int(timings.get("predicted_n"))
        if completion is None:
            completion = len(self.times)
        computed = _int(timings.get("prompt_n"))
        if computed is None and prompt is not None:
            computed = prompt - (cached or 0)
        prompt_ms = timings.get("prompt_ms")
        prefill_s = float(prompt_ms) / 1000 if isinstance(prompt_ms, int | float) else None

        ttft = self.times[0] - self.t0 if self.times else None
        decode_s = self.times[-1] - self.times[0] if self.times else None
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:], strict=False))
        steps = completion - 1
        reported = [name for name, value in (("prompt_tokens", prompt), ("cached_tokens", cached)) if value is not None]
        reported += [
            name for name, value in (("computed_tokens", computed), ("prefill_s", prefill_s)) if value is not None
        ]
        if _int(usage.get("completion_tokens")) is not None or _int(timings.get("predicted_n")) is not None:
            reported.append("completion_tokens")
        spans: tuple[Span, ...] = ()
        if ttft is not None and decode_s is not None:
            spans = (Span("first token", 0.0, ttft), Span("decode", ttft, ttft + decode_s))
        return Metrics(
            prompt_tokens=prompt or 0,
            cached_tokens=cached or 0,
            computed_tokens=computed or 0,
            completion_tokens=completion,
            prefill_s=prefill_s,
            ttft_s=ttft,
            decode_s=decode_s,
            tpot_s=decode_s / steps if decode_s and steps > 0 else None,
            tpot_p50_s=_quantile(gaps, 0.5),
            tpot_p95_s=_quantile(gaps, 0.95),
            tokens_per_s=steps / decode_s if decode_s and steps > 0 else None,
            total_s=t_end - self.t0,
            spans=spans,
            server_reported=tuple(reported),
            server=self.server() or None,
        )
