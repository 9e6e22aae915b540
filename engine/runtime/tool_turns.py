"""Tools inside a reply: the engine's tool box, the user's slash lines, the model's calls and their rounds.

:class:`ToolBox` is built from :class:`~engine.api.ToolSettings` when the
engine starts: the built-in tools (``engine.tools.builtin_tools``) and the MCP
servers, which start on a thread of their own (one that fails becomes a
``Warning("tools", ...)``; the engine never waits for them).
:meth:`ToolBox.view` gives, per request, a registry where exactly the tools
the request names (``"all"``: every one) are enabled; only those ever run.

:func:`run_slash_lines` runs the ``/NAME ARGS`` lines of the user's last
message (concurrently unless the request says otherwise) and puts their
results, as text, in that message, so any chat template and any model sees
them.  :func:`model_calls` finds the calls in a model's reply (the engine
runs them with :func:`run_turn`), and :func:`follow_up` gives the messages of
the next round: the assistant turn with its calls and one ``tool`` message
per result, or, for a chat template that cannot render those, the same as
plain text.  :class:`Rounds` adds up the rounds of one reply into its
:class:`~engine.api.Metrics` (tool wall and sequential time, ``tool:NAME``
spans, every round's prefill and decode).

A turn's results are cut to a share of the model's context, measured in its
tokens (:func:`fit_results`; :func:`run_turn` does it when given the tokenizer
and the context length): together they fill at most a quarter of it, so a
huge tool result leaves the conversation and the reply their room.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.api import Metrics, Request, Span, ToolCall, ToolSettings, Warning
from engine.model.tool_template import template_renders_tools
from engine.runtime.prompt import content_ids
from engine.tools import (
    Call,
    Parsed,
    Registry,
    Tool,
    TurnResult,
    assistant_message,
    builtin_tools,
    parse_model_output,
    parse_slash_lines,
    result_messages,
    results_as_text,
    run_calls,
    tool_schemas,
)

P = TypeVar("P")
RESULT_SHARE = 4  # one turn's tool results together fill at most 1/RESULT_SHARE of the model's context


def settings_problems(settings: ToolSettings) -> list[str]:
    rounds = settings.max_rounds
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        return [f"tools: max_rounds must be a whole number of 0 or more, not {rounds!r}"]
    return []


class ToolBox:
    """Every tool this engine may offer; requests enable some of them by name."""

    def __init__(self, settings: ToolSettings, on_event: Callable[[object], None]) -> None:
        self.settings = settings
        self.builtin: list[Tool] = builtin_tools(
            settings.granted_dirs, fetch_allow_private=settings.fetch_allow_private
        )
        self.extra: list[Tool] = []  # tools added in code (tests, plugins), beside the built-in ones
        self.hub: Any = None
        if settings.mcp_servers:
            threading.Thread(target=self._start_mcp, args=(on_event,), name="brisk-mcp-start", daemon=True).start()

    def _start_mcp(self, on_event: Callable[[object], None]) -> None:
        from engine.tools.mcp_client import McpHub, ServerSpec

        hub = McpHub()
        self.hub = hub
        for target in self.settings.mcp_servers:
            try:
                state = hub.add(ServerSpec.parse(target))
            except Exception as exc:  # a bad server line is reported; the others and the chat go on
                traceback.print_exc()
                on_event(Warning("tools", f"The MCP server {target!r} was not started ({exc}); check the command."))
                continue
            if state.status != "ready":
                on_event(Warning("tools", f"The MCP server {target!r} is not available: {state.message}"))

    def add(self, tool: Tool) -> None:
        """Offer ``tool`` too (replacing one of that name)."""
        self.extra = [t for t in self.extra if t.name != tool.name] + [tool]

    def view(self, names: tuple[str, ...] | list[str]) -> Registry | None:
        """A registry with exactly ``names`` enabled, or None when the request enables no tool."""
        if not names:
            return None
        own = {t.name: t for t in self.builtin}
        own.update({t.name: t for t in self.extra})
        tools = list(own.values())
        if self.hub is not None:
            tools += self.hub.tools(taken=lambda name: name in own)
        return Registry(tools).only(names)  # names not known enable nothing; calls of them get errors

    def close(self) -> None:
        if self.hub is not None:
            self.hub.close(timeout_s=2.0)


def run_turn(
    calls: tuple[Call, ...] | list[Call],
    view: Registry,
    request: Request,
    emit: Callable[[ToolCall], None],
    tokenizer: Any = None,
    context: int = 0,
) -> TurnResult:
    """Run one turn's calls (concurrently unless ``request.parallel_tools`` is false), each ending in a ``ToolCall``;
    with ``tokenizer`` and ``context`` the results are cut to their share of the context (:func:`fit_results`)."""
    turn = run_calls(
        calls, view, parallel=request.parallel_tools, t0=request.submitted_at, on_event=emit, request_id=request.id
    )
    return fit_results(turn, tokenizer, context)


def fit_results(turn: TurnResult, tokenizer: Any, context: int) -> TurnResult:
    """``turn`` with each result cut, in ``tokenizer``'s tokens, so that together they fill at most
    ``context // RESULT_SHARE`` tokens; a cut result says so.  Without a tokenizer or a context: as it is."""
    if tokenizer is None or context <= 0 or not turn.results:
        return turn
    budget = max(64, context // RESULT_SHARE // len(turn.results))
    results = []
    for result in turn.results:
        ids = content_ids(tokenizer, result.text)
        if len(ids) <= budget:
            results.append(result)
            continue
        note = f"\n[cut from {len(ids):,} tokens]"
        keep = max(1, budget - len(content_ids(tokenizer, note)))
        results.append(dataclasses.replace(result, text=tokenizer.decode(ids[:keep]) + note))
    return dataclasses.replace(turn, results=tuple(results))


def prompt_schemas(request: Request, view: Registry | None, loaded: Any) -> list[dict[str, Any]] | None:
    """The tool schemas ``request``'s prompt is rendered with on the ``loaded`` model: the enabled tools'
    (None: no tools).  Where its chat template cannot carry them they become Brisk's own tool prompt
    (engine.tools.prompt), unless the request turned that off (``Request.tool_prompt``)."""
    schemas = (tool_schemas(view) or None) if view is not None else None
    tokenizer = getattr(loaded, "tokenizer", None)
    if schemas and not request.tool_prompt and tokenizer is not None and not template_renders_tools(tokenizer):
        return None
    return schemas


def slash_calls(messages: list[dict[str, Any]], view: Registry) -> tuple[str, tuple[Call, ...]]:
    """The user's last message without its ``/NAME`` lines, and those lines as calls."""
    parsed = parse_slash_lines(str(messages[-1].get("content", "")), view.get)
    return parsed.text, parsed.calls


def with_slash_results(messages: list[dict[str, Any]], kept: str, turn: TurnResult) -> list[dict[str, Any]]:
    """``messages`` whose last (user) message holds ``kept`` and the results as text."""
    results = results_as_text(turn)
    content = f"{kept}\n\n{results}" if kept else results
    return [*messages[:-1], {**messages[-1], "content": content}]


def model_calls(text: str) -> Parsed:
    """A model's reply split into its prose and its tool calls (no calls: the reply is final)."""
    return parse_model_output(text)


def follow_up(
    messages: list[dict[str, Any]], reply: str, parsed: Parsed, turn: TurnResult, as_text: bool
) -> list[dict[str, Any]]:
    """The next round's messages: the ``reply`` that asked for ``parsed.calls``, and the results."""
    if as_text:
        return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": results_as_text(turn)}]
    results = [{**m, "content": m["content"] or "(no output)"} for m in result_messages(turn)]
    return [*messages, assistant_message(parsed.text, parsed.calls), *results]


def next_prompt(
    build: Callable[[list[dict[str, Any]]], P],
    messages: list[dict[str, Any]],
    reply: str,
    parsed: Parsed,
    turn: TurnResult,
    as_text: bool,
) -> tuple[list[dict[str, Any]], P, bool]:
    """The next round's messages and ``build(messages)``; results as plain text (and ``True``) when the chat
    template cannot render tool turns (a ``ValueError`` from ``build`` is the prompt's own and is raised)."""
    if not as_text:
        following = follow_up(messages, reply, parsed, turn, as_text=False)
        try:
            return following, build(following), False
        except ValueError:
            raise
        except Exception:  # a template without tool turns (a TemplateError): say the same as text
            traceback.print_exc()
    following = follow_up(messages, reply, parsed, turn, as_text=True)
    return following, build(following), True


@dataclass
class Rounds:
    """The rounds of one reply: each decode's metrics (with the cache lookup's end) and each tool turn."""

    decodes: list[tuple[Metrics, float]] = field(default_factory=list)
    turns: list[TurnResult] = field(default_factory=list)

    @property
    def tools_ran(self) -> bool:
        return any(t.results for t in self.turns)

    def metrics(self, first: Metrics) -> Metrics:
        """``first`` (the first decode's metrics with the engine's numbers) with every round added."""
        if len(self.decodes) <= 1 and not self.turns:
            return first
        spans = list(first.spans)
        for m, lookup_at in self.decodes[1:]:
            if m.prefill_s is not None:
                spans.append(Span("prefill", lookup_at, lookup_at + m.prefill_s))
            if m.ttft_s is not None and m.total_s is not None:
                spans.append(Span("decode", m.ttft_s, m.total_s))
        for turn in self.turns:
            spans.extend(turn.spans())
        spans.sort(key=lambda s: s.start_s)
        last = self.decodes[-1][0]
        drafted = sum(m.drafted for m, _ in self.decodes)
        accepted = sum(m.accepted for m, _ in self.decodes)
        tokens = sum(m.completion_tokens for m, _ in self.decodes)
        decode_s = sum(m.decode_s or 0.0 for m, _ in self.decodes)
        steps = tokens - len(self.decodes)
        return dataclasses.replace(
            first,
            prompt_tokens=last.prompt_tokens,
            cached_tokens=last.cached_tokens,
            computed_tokens=sum(m.computed_tokens for m, _ in self.decodes),
            completion_tokens=tokens,
            decode_s=decode_s,
            tokens_per_s=steps / decode_s if steps > 0 and decode_s else None,
            total_s=last.total_s,
            drafted=drafted,
            accepted=accepted,
            acceptance=accepted / drafted if drafted else None,
            tools_wall_s=sum(t.wall_s for t in self.turns) if self.turns else None,
            tools_sequential_s=sum(t.sequential_s for t in self.turns) if self.turns else None,
            spans=tuple(spans),
        )
