"""The configuration a reply ran with, and the history of replies for the panel's chart (no Qt).

:class:`ReplyConfig` is every switch of the latency panel: streaming on/off,
the prefix cache, the speculative source (``engine.api.SOURCES``), the
quantization mode (``engine.api.QUANT_CHOICES``), the answer cache and parallel
tools.  ``ReplyConfig.current(settings, stream=..., parallel_tools=...)`` reads
the four that live in :class:`~engine.storage.Settings` and takes the two
GUI-only ones from the panel.  :meth:`ReplyConfig.request` applies a
configuration to an engine :class:`~engine.api.Request`; :meth:`to_dict` /
:meth:`from_dict` are the form saved with each reply (``metrics["config"]``), so
a restart still knows how a reply was made.  :func:`config_tooltip` is the text
of a reply's tooltip, from a config or a stored message's metrics.
:meth:`ReplyConfig.compare_config` is the part ``engine.compare`` can replay.

:class:`History` keeps one :class:`HistoryPoint` (TTFT, tokens/s and the
config's short label) per finished reply, oldest first, at most ``limit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.api import QUANT_CHOICES, SOURCES, Metrics, Request
from engine.compare import Config as CompareConfig
from engine.storage import Settings

LABELS = {
    "stream": "Streaming",
    "prefix_cache": "Prefix cache",
    "speculative": "Speculative",
    "quant": "Quantization",
    "answer_cache": "Answer cache",
    "parallel_tools": "Parallel tools",
    "prefill_typing": "Prefill while typing",
}


def _onoff(value: bool) -> str:
    return "on" if value else "off"


@dataclass(frozen=True)
class ReplyConfig:
    stream: bool = True
    prefix_cache: bool = True
    speculative: str = "off"
    quant: str = "auto"
    answer_cache: bool = True
    parallel_tools: bool = True
    prefill_typing: bool = True  # the draft is prefilled while it is typed (Settings.prefill_while_typing)
    client: str = ""  # a reply the server gave another program: that program's name (its own chart series)

    @classmethod
    def current(cls, settings: Settings, *, stream: bool = True, parallel_tools: bool = True) -> ReplyConfig:
        return cls(
            stream=stream,
            prefix_cache=settings.prefix_cache,
            speculative=settings.speculative,
            quant=settings.quant,
            answer_cache=settings.answer_cache,
            parallel_tools=parallel_tools,
            prefill_typing=settings.prefill_while_typing,
        )

    def request(self, request: Request) -> Request:
        """``request`` with this configuration's per-request switches (quant is the loaded model's)."""
        return dataclasses.replace(
            request,
            prefix_cache=self.prefix_cache,
            speculative=self.speculative,
            answer_cache=self.answer_cache,
            parallel_tools=self.parallel_tools,
        )

    def compare_config(self) -> CompareConfig:
        return CompareConfig(
            prefix_cache=self.prefix_cache,
            speculative=self.speculative,
            quant=self.quant,
            stream=self.stream,
            typing=self.prefill_typing,
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "stream": _onoff(self.stream),
            "prefix_cache": _onoff(self.prefix_cache),
            "speculative": self.speculative,
            "quant": self.quant,
            "answer_cache": _onoff(self.answer_cache),
            "parallel_tools": _onoff(self.parallel_tools),
            "prefill_typing": _onoff(self.prefill_typing),
        }

    @classmethod
    def from_dict(cls, data: object) -> ReplyConfig | None:
        """Read a saved config back; None when it is missing or damaged."""
        if not isinstance(data, Mapping):
            return None
        default = cls()

        def flag(key: str) -> bool:
            value = data.get(key)
            return value == "on" if value in ("on", "off") else bool(getattr(default, key))

        speculative = data.get("speculative")
        quant = data.get("quant")
        return cls(
            stream=flag("stream"),
            prefix_cache=flag("prefix_cache"),
            speculative=speculative if speculative in SOURCES else default.speculative,
            quant=quant if quant in QUANT_CHOICES else default.quant,
            answer_cache=flag("answer_cache"),
            parallel_tools=flag("parallel_tools"),
            prefill_typing=flag("prefill_typing"),
        )

    def short(self) -> str:
        """A few words for a chart legend: what differs from the defaults, e.g. ``spec=lookup, no stream``."""
        parts = []
        if not self.stream:
            parts.append("no stream")
        if not self.prefix_cache:
            parts.append("no prefix cache")
        if self.speculative != "off":
            parts.append(f"spec={self.speculative}")
        if self.quant not in ("none", "auto"):
            parts.append(self.quant)
        if not self.prefill_typing:
            parts.append("no typing prefill")
        if self.client:
            parts.insert(0, f"server: {self.client}")
        return ", ".join(parts) or "plain"

    def lines(self) -> list[str]:
        return [f"{LABELS[key]}: {value}" for key, value in self.to_dict().items()]


def config_tooltip(source: ReplyConfig | Mapping[str, Any] | None) -> str:
    """A reply's tooltip: the configuration it ran with (``source``: a config, or a stored message's metrics)."""
    config = source if isinstance(source, ReplyConfig) else None
    if config is None and isinstance(source, Mapping):
        config = ReplyConfig.from_dict(source.get("config", source))
    if config is None:
        return ""
    return "Ran with\n" + "\n".join(config.lines())


@dataclass(frozen=True)
class HistoryPoint:
    ttft_s: float | None
    tokens_per_s: float | None
    config: ReplyConfig


class History:
    def __init__(self, limit: int = 200) -> None:
        self.limit = limit
        self.points: list[HistoryPoint] = []

    def add(self, metrics: Metrics | None, config: ReplyConfig) -> HistoryPoint:
        m = metrics or Metrics()
        point = HistoryPoint(m.ttft_s, m.tokens_per_s, config)
        self.points.append(point)
        del self.points[: -self.limit]
        return point

    def labels(self) -> list[str]:
        """The distinct configurations in the history, in order of first appearance."""
        return list(dict.fromkeys(p.config.short() for p in self.points))
