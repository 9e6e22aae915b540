"""Tools through the real CLI on the tiny model: slash lines, enabled tools only, MCP servers, parallel and sequential.

The tiny model cannot call tools itself, so every call here comes from a
``/NAME ARGS`` line in the user's message (the engine runs those before the
model answers).  Concurrency uses the test MCP server's ``slow_echo`` (0.3,
0.2 and 0.4 s): asserted on the order of starts and ends and on the wall time
against the sum, with wide margins, never on exact durations.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support import mcp_servers
from tests.support.brisk_cli import brisk, events

DEMO = str(mcp_servers.DEMO)
MCP = f"{sys.executable} {DEMO}"
SLOW = "\n".join(f'/slow_echo {{"text": "{t}", "seconds": {s}}}' for t, s in (("a", 0.3), ("b", 0.2), ("c", 0.4)))


def tool_events(out: str) -> list[dict]:
    return [e for e in events(out) if e["type"] == "tool"]


def test_calculator_slash_line_and_a_disabled_tool(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "ask", "/calculator 2*(3+4)\n/clock UTC\nWhat do you make of that?", "--model", str(tiny_dir),
        "--tools", "calculator", "--json", "--max-tokens", "2", data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    evs = events(run.stdout)
    calc, clock = sorted(tool_events(run.stdout), key=lambda e: e["name"])
    assert set(calc) == {"type", "t", "name", "arguments", "start", "end", "ok", "result"}
    assert (calc["name"], calc["ok"], calc["result"]) == ("calculator", True, "14")
    assert calc["arguments"] == {"expression": "2*(3+4)"}
    assert 0 <= calc["start"] <= calc["end"] <= calc["t"]
    assert clock["name"] == "clock" and clock["ok"] is False, "clock was not enabled, so it must not run"
    assert "not enabled" in clock["result"] and "--tools clock" in clock["result"]
    done = evs[-1]
    assert done["type"] == "done"
    m = done["metrics"]
    assert m["tools_wall_s"] is not None and m["tools_sequential_s"] is not None
    assert calc["t"] <= done["t"]


def test_tool_flags_are_checked_before_loading(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-model")  # never loaded: the flags are refused first
    run = brisk("ask", "hi", "--model", missing, "--tools", "calculator,calculater", "--json")
    assert run.returncode == 3
    message = events(run.stdout)[-1]["message"]
    assert "no tool named 'calculater'" in message and "calculator, clock, units, files, fetch" in message
    run = brisk("ask", "hi", "--model", missing, "--tools", ",", "--grant", str(tmp_path / "nope"), "--json")
    assert run.returncode == 3
    message = events(run.stdout)[-1]["message"]
    assert "names no tool" in message and "is not a folder" in message


def test_an_unknown_name_is_looked_up_in_the_mcp_servers(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-model")
    run = brisk("ask", "hi", "--model", missing, "--tools", "slow_echo,nosuch", "--mcp", MCP, "--json")
    assert run.returncode == 3
    message = events(run.stdout)[-1]["message"]
    assert "no tool named 'nosuch'" in message and "slow_echo" in message and "add" in message


def test_mcp_tools_run_concurrently_or_one_after_another(tiny_dir: Path, tmp_path: Path) -> None:
    common = ("--model", str(tiny_dir), "--tools", "all", "--mcp", MCP, "--json", "--max-tokens", "2")
    parallel = brisk("ask", SLOW, *common, data_dir=str(tmp_path))
    assert parallel.returncode == 0, parallel.stderr
    calls = tool_events(parallel.stdout)
    assert sorted(c["result"] for c in calls) == ["a", "b", "c"] and all(c["ok"] for c in calls)
    assert max(c["start"] for c in calls) < min(c["end"] for c in calls), "every call started before any ended"
    m = events(parallel.stdout)[-1]["metrics"]
    assert m["tools_sequential_s"] >= 0.85  # the sum of the calls' own durations (0.9 s of sleeps)
    assert m["tools_wall_s"] < 0.8 * m["tools_sequential_s"]

    sequential = brisk("ask", SLOW, *common, "--sequential-tools", data_dir=str(tmp_path))
    assert sequential.returncode == 0, sequential.stderr
    calls = tool_events(sequential.stdout)
    assert [c["result"] for c in calls] == ["a", "b", "c"]
    assert all(a["end"] <= b["start"] for a, b in zip(calls, calls[1:], strict=False)), "no two calls overlapped"
    m = events(sequential.stdout)[-1]["metrics"]
    assert m["tools_wall_s"] >= 0.85


def test_an_mcp_server_that_fails_is_reported_and_the_reply_goes_on(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "ask", "/calculator 1+1", "--model", str(tiny_dir), "--tools", "calculator",
        "--mcp", f"{MCP} --crash-at-start", "--json", "--max-tokens", "2", data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    evs = events(run.stdout)
    warnings = [e for e in evs if e["type"] == "warning"]
    assert warnings and warnings[0]["kind"] == "tools" and "cannot open its database" in warnings[0]["message"]
    assert [(c["ok"], c["result"]) for c in tool_events(run.stdout)] == [(True, "2")]
    # the server's failure is said by its own thread, before or after the reply ends
    assert [e for e in evs if e["type"] != "warning"][-1]["type"] == "done"
