"""Answer-cache hits as the user sees them (no Qt): a reply's badge and the session's tally.

:func:`cache_badge` is the line over a reply that came from the answer cache
(``Metrics.answer_cache``): ``From cache, exact · 12 ms · saved 1.93 s`` or
``Similar question, 0.93: “What is France's capital?” · 41 ms · saved 1.20 s``;
"" for a reply the model generated.  It reads a stored metrics dict too, so a
reopened conversation shows the same badge.

:class:`CacheTally` counts the replies of this session that finished and how
many the cache answered, and adds up the time saved (``Metrics.saved_s``, the
original generation's time minus the hit's), for the latency panel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.api import Metrics

QUESTION_CHARS = 80


def _num(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def is_cached(metrics: Metrics | Mapping[str, Any] | None) -> bool:
    data = metrics.to_dict() if isinstance(metrics, Metrics) else metrics or {}
    return data.get("answer_cache") in ("exact", "semantic")


def cache_badge(metrics: Metrics | Mapping[str, Any] | None) -> str:
    data = metrics.to_dict() if isinstance(metrics, Metrics) else metrics or {}
    kind = data.get("answer_cache")
    if kind == "exact":
        parts = ["From cache, exact"]
    elif kind == "semantic":
        similarity = _num(data, "similarity")
        head = "Similar question" + (f", {similarity:.2f}" if similarity is not None else "")
        question = data.get("cached_question")
        if isinstance(question, str) and question.strip():
            flat = " ".join(question.split())
            if len(flat) > QUESTION_CHARS:
                flat = flat[: QUESTION_CHARS - 1] + "\u2026"
            head += f": \u201c{flat}\u201d"
        parts = [head]
    else:
        return ""
    took = _num(data, "total_s")
    if took is not None:
        parts.append(_seconds(took))
    saved = _num(data, "saved_s")
    if saved is not None:
        parts.append(f"saved {_seconds(max(0.0, saved))}")
    return " \u00b7 ".join(parts)


@dataclass
class CacheTally:
    replies: int = 0
    hits: int = 0
    saved_s: float = 0.0

    def add(self, metrics: Metrics | None) -> None:
        """Count one finished reply (``metrics``: its Done metrics; None for a failed or stopped one)."""
        self.replies += 1
        if metrics is not None and metrics.answer_cache in ("exact", "semantic"):
            self.hits += 1
            self.saved_s += max(0.0, metrics.saved_s or 0.0)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.replies if self.replies else None

    def text(self) -> str:
        """``1 of 3 replies (33 %) · saved 1.93 s`` (a dash before the first reply)."""
        if not self.replies:
            return "\u2014"
        rate = 100 * self.hits / self.replies
        return f"{self.hits} of {self.replies} replies ({rate:.0f} %) \u00b7 saved {_seconds(self.saved_s)}"
