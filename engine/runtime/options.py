"""The local engine's options and the checks that refuse bad values up front, each said as what to change.

:class:`EngineOptions` (built by ``engine.client.local_backend(**options)``):
the prefix cache's byte budget, whether system-prompt KV is saved, the
:class:`~engine.api.ToolSettings` and :class:`~engine.api.AnswerCacheSettings`;
a bad value raises ``ValueError`` when the options are made.
:func:`request_problems` lists what is wrong with a request's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.api import SOURCES, AnswerCacheSettings, Request, Sampling, ToolSettings
from engine.runtime import answer_lookup, tool_turns


@dataclass
class EngineOptions:
    prefix_cache_bytes: int = 512 << 20
    persist_prefixes: bool = True  # save system-prompt KV for a warm first message after restart
    tools: ToolSettings = field(default_factory=ToolSettings)  # what requests may enable (Request.tools)
    answer_cache: AnswerCacheSettings = field(default_factory=AnswerCacheSettings)
    # quant="auto" on a first start: answer on float32 at once, measure the modes between replies, then switch
    # (the window; a one-shot CLI measures before its reply instead, so that it answers on the chosen mode)
    defer_probe: bool = False
    # llama-server's --cache-reuse: raw prompts (/completion, /infill) move cached chunks this long (0: off)
    cache_reuse: int = 0

    def __post_init__(self) -> None:
        check_budget(self.prefix_cache_bytes)
        if not isinstance(self.cache_reuse, int) or isinstance(self.cache_reuse, bool) or self.cache_reuse < 0:
            raise ValueError(f"Cache reuse takes a whole number of tokens, 0 (off) or more, not {self.cache_reuse!r}.")
        problems = tool_turns.settings_problems(self.tools) + answer_lookup.settings_problems(self.answer_cache)
        if problems:
            raise ValueError("; ".join(problems) + ".")


def check_budget(budget_bytes: object) -> None:
    """Raise ``ValueError`` (saying what to change) unless ``budget_bytes`` is a whole number of 0 or more."""
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
        raise ValueError(f"The prompt cache size must be a whole number of bytes, 0 or more, not {budget_bytes!r}.")


def request_problems(request: Request) -> list[str]:
    """What is wrong with a request's values, each said as what to change."""
    if not isinstance(request.sampling, Sampling):
        return [f"sampling must be an engine.api.Sampling, not {type(request.sampling).__name__}"]
    problems = request.sampling.problems()
    if not isinstance(request.sampling.stop, tuple | list):
        problems.append(f"stop must be a list of strings, not {request.sampling.stop!r}")
    if request.speculative not in SOURCES:
        problems.append(f"unknown speculative source {request.speculative!r}; choose one of {', '.join(SOURCES)}")
    if not isinstance(request.tools, tuple | list) or not all(isinstance(t, str) for t in request.tools):
        problems.append(f"tools must be a list of tool names, not {request.tools!r}")
    if not request.messages or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
        for m in request.messages
    ):
        problems.append("every message needs a text role and content")
    if not all(isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) for t in request.client_tools):
        problems.append('client tools must be {"type": "function", "function": {...}} objects')
    if request.raw and (len(request.messages) != 1 or request.client_tools):
        problems.append("a raw prompt is one message and takes no tools")
    return problems
