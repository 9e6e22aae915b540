"""The tool runner: concurrency, sequential mode, failures that do not stop the others, enabled tools only."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from engine.api import ToolCall
from engine.tools import Call, Registry, Tool, ToolError, run_calls, run_calls_async, tool_schemas
from engine.tools.run import assistant_message, result_messages, results_as_text


def sleeper(name: str, seconds: float) -> Tool:
    def fn(arguments: dict[str, Any]) -> str:
        time.sleep(seconds)
        return f"{name} slept {seconds}"

    return Tool(name, f"sleeps {seconds} s", {"type": "object", "properties": {}}, fn, timeout_s=5.0)


def three() -> Registry:
    return Registry([sleeper("a", 0.3), sleeper("b", 0.2), sleeper("c", 0.4)], enabled=["all"])


CALLS = [Call("a"), Call("b"), Call("c")]


def test_concurrent_calls_take_as_long_as_the_slowest() -> None:
    events: list[ToolCall] = []
    t0 = time.perf_counter()
    turn = run_calls(CALLS, three(), t0=t0, on_event=events.append, request_id="r1")
    assert [r.name for r in turn.results] == ["a", "b", "c"]  # call order, not finishing order
    assert all(r.ok for r in turn.results)
    assert turn.wall_s >= 0.39  # the slowest call's own time
    starts, ends = [e.start for e in events], [e.end for e in events]
    assert len(events) == 3 and max(starts) < min(ends), "all three calls were running at the same moment"
    assert turn.sequential_s >= 0.88
    assert turn.saved_s > 0.2
    # the calls overlapped: each started before any other ended
    assert max(r.start for r in turn.results) < min(r.end for r in turn.results)
    assert sorted(e.name for e in events) == ["a", "b", "c"]
    assert [e.end for e in events] == sorted(e.end for e in events)  # each event sent as its call ends
    assert all(e.request_id == "r1" and e.t == e.end and e.end > e.start >= 0 for e in events)
    assert [s.name for s in turn.spans()] == ["tool:a", "tool:b", "tool:c"]


def test_sequential_switch_runs_one_after_another() -> None:
    turn = run_calls(CALLS, three(), parallel=False)
    assert turn.wall_s > 0.85
    ends = [r.end for r in turn.results]
    starts = [r.start for r in turn.results]
    assert starts[1] >= ends[0] and starts[2] >= ends[1]


def test_a_raising_or_hanging_tool_does_not_stop_the_others() -> None:
    release = threading.Event()

    def boom(arguments: dict[str, Any]) -> str:
        raise RuntimeError("disk on fire")

    def hang(arguments: dict[str, Any]) -> str:
        release.wait(30)
        return "late"

    async def async_ok(arguments: dict[str, Any]) -> str:
        await asyncio.sleep(0.05)
        return "async fine"

    empty = {"type": "object", "properties": {}}
    registry = Registry(
        [
            Tool("boom", "raises", empty, boom),
            Tool("hang", "hangs", empty, hang, timeout_s=0.5),
            Tool("fine", "async", empty, async_ok),
            sleeper("slow", 0.2),
        ],
        enabled=["all"],
    )
    try:
        turn = run_calls([Call("boom"), Call("hang"), Call("fine"), Call("slow")], registry)
    finally:
        release.set()
    boom_r, hang_r, fine_r, slow_r = turn.results
    assert not boom_r.ok and "disk on fire" in boom_r.text
    assert not hang_r.ok and "did not finish within 0.5 s" in hang_r.text
    assert fine_r.ok and fine_r.text == "async fine"
    assert slow_r.ok
    assert turn.wall_s < 3.0


def test_disabled_unknown_and_malformed_calls_are_error_results_and_never_run() -> None:
    ran: list[str] = []

    def secret(arguments: dict[str, Any]) -> str:
        ran.append("secret")
        return "should not run"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    registry = Registry([Tool("secret", "off", schema, secret), sleeper("on", 0.0)], enabled=["on"])
    turn = run_calls(
        [
            Call("secret", {"n": 1}),
            Call("nope"),
            Call("", error="the tool call is not valid JSON"),
            Call("on"),
        ],
        registry,
    )
    assert ran == []
    secret_r, nope_r, bad_r, on_r = turn.results
    assert not secret_r.ok and "not enabled" in secret_r.text
    assert not nope_r.ok and "no tool named 'nope'" in nope_r.text
    assert not bad_r.ok and "not valid JSON" in bad_r.text
    assert on_r.ok
    # a view enabling only some names: enabling the secret tool there lets it run, with argument checks
    view = registry.only(["secret"])
    assert [t.name for t in view.enabled()] == ["secret"]
    bad_args, good = run_calls([Call("secret", {"n": "x"}), Call("secret", {"n": 2})], view).results
    assert not bad_args.ok and "must be integer" in bad_args.text
    assert good.ok and ran == ["secret"]
    assert not run_calls([Call("on")], view).results[0].ok


def test_registry_rules_and_schemas() -> None:
    registry = three()
    with pytest.raises(ValueError):
        registry.add(sleeper("a", 0.1))
    registry.disable("b")
    assert [s["function"]["name"] for s in tool_schemas(registry)] == ["a", "c"]
    assert tool_schemas(registry)[0] == {
        "type": "function",
        "function": {"name": "a", "description": "sleeps 0.3 s", "parameters": {"type": "object", "properties": {}}},
    }
    with pytest.raises(ToolError, match="not enabled"):
        registry.resolve("b")


def test_messages_for_the_next_round() -> None:
    registry = Registry([sleeper("a", 0.0)], enabled=["a"])
    turn = run_calls([Call("a"), Call("zzz")], registry)
    assert result_messages(turn) == [
        {"role": "tool", "name": "a", "content": "a slept 0.0"},
        {"role": "tool", "name": "zzz", "content": "error: " + turn.results[1].text},
    ]
    message = assistant_message("thinking", [Call("a", {"x": 1})])
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "a", "arguments": {"x": 1}}}]
    assert "a slept 0.0" in results_as_text(turn)


def test_run_calls_inside_a_loop_points_to_the_async_version() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="run_calls_async"):
            run_calls([Call("a")], three())
        turn = await run_calls_async([Call("b")], three())
        assert turn.results[0].ok

    asyncio.run(main())
