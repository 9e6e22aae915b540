"""Running one turn's tool calls, concurrently or one after another, each bounded by a timeout.

:func:`run_calls` (synchronous, for the engine thread) and :func:`run_calls_async`
run a turn's calls with ``asyncio.gather(..., return_exceptions=True)``, or in
order when ``parallel=False``.  A sync tool runs on its own daemon thread (a
hung one is left behind, never joined); an ``async def`` tool runs on the loop.
A malformed call, an unknown or disabled tool, bad arguments, an exception or
a timeout becomes an error :class:`CallResult`; the other calls go on.  Results
keep the calls' order.  Times are ``time.perf_counter()`` minus the caller's
``t0`` (the request's submission), so they sit on the same clock as events'
``t``.  Each call's :class:`engine.api.ToolCall` event goes to ``on_event`` as
the call ends, on the caller's thread.  A result longer than
``MAX_RESULT_CHARS`` is cut to that; wherever a call's arguments are echoed as
text (a log line, the results written into a user message, the CLI's
``[tool ...]`` line) they go through :func:`clip`, which keeps a few hundred
characters and says how many were left out, so a 1 MB argument is never
echoed whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.api import Span, ToolCall
from engine.tools.parse import Call
from engine.tools.registry import Registry, Tool, ToolError, check_arguments

log = logging.getLogger(__name__)
MAX_RESULT_CHARS = 32_000
ECHO_CHARS = 300  # what an echo of a call's arguments keeps


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to its first ``limit`` characters, with how many were left out (short text as it is)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters]"


def echo_arguments(arguments: Any, limit: int = ECHO_CHARS) -> str:
    """A call's arguments as JSON for a log or a message, cut by :func:`clip`."""
    try:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = str(arguments)
    return clip(text, limit)


@dataclass(frozen=True)
class CallResult:
    """One call's outcome; ``start``/``end`` in seconds since ``t0``."""

    name: str
    arguments: dict[str, Any]
    start: float
    end: float
    ok: bool
    text: str  # the result, or what went wrong

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def event(self, request_id: str) -> ToolCall:
        return ToolCall(
            request_id=request_id,
            t=self.end,
            name=self.name,
            arguments=self.arguments,
            start=self.start,
            end=self.end,
            ok=self.ok,
            result=self.text,
        )


@dataclass(frozen=True)
class TurnResult:
    """All calls of one turn, in call order, and the turn's timing."""

    results: tuple[CallResult, ...]
    start: float
    end: float
    parallel: bool

    @property
    def wall_s(self) -> float:
        """What the turn took (``Metrics.tools_wall_s``)."""
        return self.end - self.start

    @property
    def sequential_s(self) -> float:
        """The sum of the calls' own durations: what a sequential run takes (``Metrics.tools_sequential_s``)."""
        return sum(r.seconds for r in self.results)

    @property
    def saved_s(self) -> float:
        return self.sequential_s - self.wall_s

    def spans(self) -> tuple[Span, ...]:
        """One ``tool:NAME`` bar per call for the waterfall (``Metrics.spans``)."""
        return tuple(Span(f"tool:{r.name}", r.start, r.end) for r in self.results)


def run_calls(
    calls: Iterable[Call],
    registry: Registry,
    *,
    parallel: bool = True,
    t0: float | None = None,
    on_event: Callable[[ToolCall], None] | None = None,
    request_id: str = "",
) -> TurnResult:
    """Run ``calls`` against the enabled tools of ``registry`` and wait for all of them.

    Call from a thread with no running event loop (the engine thread); inside
    a loop, await :func:`run_calls_async` instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_calls was called inside an event loop; await run_calls_async instead")
    return asyncio.run(
        run_calls_async(calls, registry, parallel=parallel, t0=t0, on_event=on_event, request_id=request_id)
    )


async def run_calls_async(
    calls: Iterable[Call],
    registry: Registry,
    *,
    parallel: bool = True,
    t0: float | None = None,
    on_event: Callable[[ToolCall], None] | None = None,
    request_id: str = "",
) -> TurnResult:
    """The coroutine behind :func:`run_calls`."""
    origin = time.perf_counter() if t0 is None else t0
    todo = list(calls)
    start = time.perf_counter() - origin

    async def one(call: Call) -> CallResult:
        result = await _run_one(call, registry, origin)
        if on_event is not None:
            try:
                on_event(result.event(request_id))
            except Exception:
                log.exception("the on_event callback failed for tool %s", clip(call.name, 80))
        return result

    if parallel:
        gathered: Sequence[CallResult | BaseException] = await asyncio.gather(
            *(one(c) for c in todo), return_exceptions=True
        )
    else:
        gathered = [await one(c) for c in todo]
    end = time.perf_counter() - origin
    results = tuple(
        r if isinstance(r, CallResult) else CallResult(c.name, dict(c.arguments), start, end, False, _describe(r))
        for c, r in zip(todo, gathered, strict=True)
    )
    return TurnResult(results, start, end, parallel)


async def _run_one(call: Call, registry: Registry, origin: float) -> CallResult:
    start = time.perf_counter() - origin
    arguments = dict(call.arguments)
    timeout = 0.0
    try:
        if call.error:
            raise ToolError(call.error)
        tool = registry.resolve(call.name)
        problems = check_arguments(tool.parameters, arguments)
        if problems:
            raise ToolError(f"bad arguments for {tool.name}: {'; '.join(problems)}")
        timeout = tool.timeout_s
        value = await asyncio.wait_for(_invoke(tool, arguments), timeout)
        text, ok = _as_text(value), True
    except ToolError as exc:
        text, ok = str(exc) or "the tool failed", False
    except TimeoutError:
        text, ok = f"{call.name} did not finish within {timeout:g} s; it was abandoned", False
    except Exception as exc:  # a failing tool is a result the model sees, never a crash of the turn
        text, ok = f"{call.name} failed: {_describe(exc)}", False
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[truncated to {MAX_RESULT_CHARS} characters]"
    return CallResult(call.name, arguments, start, time.perf_counter() - origin, ok, text)


async def _invoke(tool: Tool, arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(tool.fn):
        return await tool.fn(arguments)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, error = tool.fn(arguments), None
        except Exception as exc:  # carried to the loop, reported as the call's result
            value, error = None, exc
        except BaseException as exc:  # SystemExit and friends from a tool must not end the engine thread
            value, error = None, RuntimeError(f"the tool tried to exit ({_describe(exc)})")
        # the turn may have ended (the loop closed) before this abandoned call finished
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"tool:{tool.name}", daemon=True).start()
    value = await future
    return await value if inspect.isawaitable(value) else value


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# -- messages for the next round --------------------------------------------------------------------


def assistant_message(text: str, calls: Iterable[Call]) -> dict[str, Any]:
    """The model's turn that asked for ``calls``, in the shape chat templates expect."""
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls
        ],
    }


def result_messages(turn: TurnResult) -> list[dict[str, Any]]:
    """One ``tool``-role message per call, in call order; an error's content starts with ``error:``."""
    return [{"role": "tool", "name": r.name, "content": r.text if r.ok else f"error: {r.text}"} for r in turn.results]


def result_text(name: str, arguments: Any, text: str, ok: bool = True) -> str:
    """One tool result as text for a model without a tool role (a user message): which tool, with what, and
    what came back, worded so that a small model reads the value as the answer (``Tool result of calculator
    {"expression": "6*7"}:\n42``) and a failure as one."""
    called = f"{name} {echo_arguments(arguments)}" if arguments else name
    if ok:
        return f"Tool result of {called}:\n{text}"
    return f"Tool result of {called}: the tool could not run: {text}"


def results_as_text(turn: TurnResult) -> str:
    """The results as plain text, for a user message (slash lines with a template that has no tool role)."""
    return "\n\n".join(result_text(r.name, r.arguments, r.text, r.ok) for r in turn.results)
