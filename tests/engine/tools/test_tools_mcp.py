"""MCP servers started over stdio: their tools are listed and run; one that crashes or hangs is reported."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from engine.tools import Call, Registry, builtin_tools, run_calls
from engine.tools.mcp_client import McpHub, ServerSpec, ServerState
from tests.support import mcp_servers

DEMO = str(mcp_servers.DEMO)
CONNECT_S = 90.0  # generous: a cold start of Python and the SDK on a busy CPU


@pytest.fixture
def hub() -> Iterator[McpHub]:
    changes: list[ServerState] = []
    hub = McpHub(connect_timeout_s=CONNECT_S, call_timeout_s=30.0, on_change=changes.append)
    hub.changes = changes  # type: ignore[attr-defined]
    try:
        yield hub
    finally:
        hub.close()


def test_stdio_server_lists_and_runs_tools_beside_the_builtins(hub: McpHub) -> None:
    state = hub.add(ServerSpec.parse(f"{sys.executable} {DEMO}", name="demo"))
    assert state.status == "ready", state.message
    assert {t.name for t in state.tools} == {"add", "slow_echo", "fail", "crash"}
    add = next(t for t in state.tools if t.name == "add")
    assert add.description == "Add two whole numbers." and add.parameters["required"] == ["a", "b"]

    registry = Registry(builtin_tools())
    for tool in hub.tools(taken=lambda name: registry.get(name) is not None):
        registry.add(tool)
    registry.enable("calculator", "add", "slow_echo", "fail")
    assert registry.get("add") is not None and registry.get("add").source == "mcp:demo"  # type: ignore[union-attr]
    turn = run_calls(
        [
            Call("add", {"a": 2, "b": 3}),
            Call("calculator", {"expression": "6*7"}),
            Call("fail", {"reason": "on purpose"}),
            Call("crash", {}),  # listed but not enabled: never reaches the server
            Call("slow_echo", {"text": "hi", "seconds": 0.05}),
        ],
        registry,
    )
    add_r, calc_r, fail_r, crash_r, echo_r = turn.results
    assert (add_r.ok, add_r.text) == (True, "5")
    assert (calc_r.ok, calc_r.text) == (True, "42")
    assert not fail_r.ok
    assert not crash_r.ok and "not enabled" in crash_r.text
    assert (echo_r.ok, echo_r.text) == (True, "hi")
    assert hub.state("demo").status == "ready"  # type: ignore[union-attr]
    assert hub.call("demo", "add", {"a": 1, "b": 1}) == "2"  # the synchronous path


def test_a_server_that_dies_mid_call_is_reported_and_the_others_go_on(hub: McpHub) -> None:
    assert hub.add(ServerSpec("demo", (sys.executable, DEMO))).status == "ready"
    registry = Registry(builtin_tools() + hub.tools(), enabled=["crash", "calculator"])
    crash_r, calc_r = run_calls([Call("crash", {}), Call("calculator", {"expression": "1+1"})], registry).results
    assert not crash_r.ok and "stopped during a call to crash" in crash_r.text
    assert (calc_r.ok, calc_r.text) == (True, "2")
    state = hub.wait_ready("demo")
    assert state.status == "died" and "restart it" in state.message
    again = run_calls([Call("crash", {})], registry).results[0]
    assert not again.ok and "demo" in again.text
    assert hub.tools() == []  # a dead server offers no tools
    assert any(s.status == "died" for s in hub.changes)  # type: ignore[attr-defined]


def test_a_server_that_crashes_at_start_is_reported_with_its_stderr(hub: McpHub) -> None:
    state = hub.add(ServerSpec("broken", (sys.executable, DEMO, "--crash-at-start")))
    assert state.status == "failed"
    assert "could not be started" in state.message and "cannot open its database" in state.message
    missing = hub.add(ServerSpec.parse("/no/such/mcp-server --flag"))
    assert missing.status == "failed" and "No such file" in missing.message
    assert hub.tools() == []


def test_a_server_that_hangs_at_start_times_out() -> None:
    hub = McpHub(connect_timeout_s=3.0)
    try:
        state = hub.add(ServerSpec("sleepy", (sys.executable, DEMO, "--hang-at-start")))
        assert state.status == "failed" and "did not answer within 3 s" in state.message
    finally:
        hub.close()


def test_server_specs_from_what_the_user_typed() -> None:
    spec = ServerSpec.parse("npx -y @modelcontextprotocol/server-everything")
    assert spec.command == ("npx", "-y", "@modelcontextprotocol/server-everything") and spec.url == ""
    assert spec.name == "server-everything"
    web = ServerSpec.parse("http://127.0.0.1:8000/mcp")
    assert web.url == "http://127.0.0.1:8000/mcp" and web.name == "127.0.0.1" and web.command == ()
    assert ServerSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError):
        ServerSpec.parse("   ")
