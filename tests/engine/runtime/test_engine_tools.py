"""Tools inside the engine's replies, on the tiny model: slash lines, disabled tools, concurrency, model rounds.

The tiny model writes gibberish, so these tests check the plumbing (events, results, timings, rounds), never words.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from engine.api import (
    AnswerCacheSettings,
    Done,
    Error,
    Loaded,
    ModelSpec,
    Request,
    Sampling,
    Started,
    Token,
    ToolCall,
    reply_format,
)
from engine.runtime import tool_turns
from engine.tools import Call, Parsed, Tool
from tests.support.engine_runner import EngineRunner, done

SHORT = Sampling(max_tokens=6)


def sleeper(name: str, seconds: float) -> Tool:
    def fn(arguments: dict[str, object]) -> str:
        time.sleep(seconds)  # the tool's own work: what the runner overlaps
        return f"{name} slept {seconds}"

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return Tool(name, f"sleeps {seconds} s", schema, fn, timeout_s=5.0, source="test")


@pytest.fixture(scope="module")
def runner(tiny_dir: Path) -> EngineRunner:
    r = EngineRunner(str(tiny_dir), answer_cache=AnswerCacheSettings(enabled=False))
    for name, seconds in (("slow_a", 0.3), ("slow_b", 0.2), ("slow_c", 0.4)):
        r.engine.tools.add(sleeper(name, seconds))
    yield r
    r.close()


def tool_events(events: list[object]) -> list[ToolCall]:
    return [e for e in events if isinstance(e, ToolCall)]


def test_slash_line_runs_the_tool_and_the_model_answers_after(runner: EngineRunner) -> None:
    events = runner.run([{"role": "user", "content": "/calculator 2*(3+4)"}], sampling=SHORT, tools=("calculator",))
    (call,) = tool_events(events)
    assert call.name == "calculator" and call.ok and "14" in call.result
    assert call.arguments and 0 <= call.start <= call.end == call.t
    assert isinstance(events[0], Started) and events.index(call) > 0
    final = done(events)
    m = final.metrics
    assert m.tools_wall_s is not None and m.tools_wall_s >= 0
    assert m.tools_sequential_s == pytest.approx(call.end - call.start)
    assert [s.name for s in m.spans if s.name.startswith("tool:")] == ["tool:calculator"]
    assert m.completion_tokens > 0 and final.text == "".join(e.text for e in events if isinstance(e, Token))


def test_the_results_reach_the_prompt(runner: EngineRunner) -> None:
    plain = done(runner.run([{"role": "user", "content": "What is it?"}], sampling=SHORT, tools=("calculator",)))
    with_tool = done(
        runner.run([{"role": "user", "content": "What is it?\n/calculator 6*7"}], sampling=SHORT, tools=("calculator",))
    )
    assert with_tool.metrics.prompt_tokens > plain.metrics.prompt_tokens, "the result text is in the prompt"


def test_a_disabled_tool_gives_an_error_result_and_the_reply_goes_on(runner: EngineRunner) -> None:
    events = runner.run(
        [{"role": "user", "content": "/clock UTC\n/calculator 1+1"}], sampling=SHORT, tools=("calculator",)
    )
    calls = {c.name: c for c in tool_events(events)}
    assert not calls["clock"].ok and "not enabled" in calls["clock"].result
    assert calls["calculator"].ok and calls["calculator"].result.strip() == "2"
    assert isinstance(events[-1], Done)


def test_without_enabled_tools_a_slash_line_is_plain_text(runner: EngineRunner) -> None:
    events = runner.run([{"role": "user", "content": "/calculator 1+1"}], sampling=SHORT)
    assert not tool_events(events) and done(events).metrics.tools_wall_s is None


def test_slow_tools_run_concurrently_or_one_after_another(runner: EngineRunner) -> None:
    messages = [{"role": "user", "content": "/slow_a\n/slow_b\n/slow_c"}]
    names = ("slow_a", "slow_b", "slow_c")
    together = done(runner.run(messages, sampling=SHORT, tools=names)).metrics
    apart = done(runner.run(messages, sampling=SHORT, tools=names, parallel_tools=False)).metrics
    assert together.tools_sequential_s >= 0.85 and apart.tools_sequential_s >= 0.85
    assert apart.tools_wall_s > 0.85, apart.tools_wall_s  # three sleeps in a row cannot take less
    bars = sorted((s for s in together.spans if s.name.startswith("tool:")), key=lambda s: s.start_s)
    assert len(bars) == 3 and bars[-1].start_s < min(b.end_s for b in bars), "all three ran at once (waterfall)"
    assert together.tools_wall_s < together.tools_sequential_s
    one_by_one = sorted((s for s in apart.spans if s.name.startswith("tool:")), key=lambda s: s.start_s)
    assert all(b.start_s >= a.end_s for a, b in zip(one_by_one, one_by_one[1:], strict=False)), "no overlap"


def test_model_calls_run_for_a_bounded_number_of_rounds(runner: EngineRunner, monkeypatch) -> None:  # noqa: ANN001
    seen: list[str] = []

    def always_a_call(text: str) -> Parsed:
        seen.append(text)
        return Parsed("", (Call("calculator", {"expression": "1+2"}),))

    monkeypatch.setattr(tool_turns, "parse_model_output", always_a_call)
    rounds = runner.engine.options.tools.max_rounds
    events = runner.run([{"role": "user", "content": "count"}], sampling=Sampling(max_tokens=40), tools=("calculator",))
    calls = tool_events(events)
    assert len(calls) == rounds and all(c.ok and c.result.strip() == "3" for c in calls)
    assert len(seen) == rounds + 1, "the model answers once more after the last round, and that is the end"
    final = done(events)
    assert final.metrics.tools_wall_s is not None
    assert final.text == "".join(e.text for e in events if isinstance(e, Token))
    assert len([s for s in final.metrics.spans if s.name == "decode" or s.name == "prefill"]) >= 2


def test_malformed_and_unknown_model_calls_are_error_results(runner: EngineRunner, monkeypatch) -> None:  # noqa: ANN001
    replies = iter([Parsed("", (Call("", error="the tool call is not valid JSON"), Call("nope", {})))])
    monkeypatch.setattr(tool_turns, "parse_model_output", lambda text: next(replies, Parsed(text)))
    events = runner.run([{"role": "user", "content": "break"}], sampling=Sampling(max_tokens=20), tools=("all",))
    calls = tool_events(events)
    assert len(calls) == 2 and not any(c.ok for c in calls)
    assert "not valid JSON" in calls[0].result and "no tool named 'nope'" in calls[1].result
    assert isinstance(events[-1], Done)


def test_tool_settings_are_checked(tiny_dir: Path) -> None:
    from engine.api import ToolSettings
    from engine.runtime.engine import EngineOptions

    with pytest.raises(ValueError, match="max_rounds"):
        EngineOptions(tools=ToolSettings(max_rounds=-1))
    with pytest.raises(ValueError, match="threshold"):
        EngineOptions(answer_cache=AnswerCacheSettings(threshold=0.0))


def test_a_failing_mcp_server_is_a_warning_not_a_failed_load(tiny_dir: Path, tmp_path: Path) -> None:
    from engine.api import ToolSettings, Warning

    r = EngineRunner(
        str(tiny_dir),
        tools=ToolSettings(mcp_servers=(str(tmp_path / "no-such-server"),)),
        answer_cache=AnswerCacheSettings(enabled=False),
    )
    try:
        assert r.load_event.__class__.__name__ == "Loaded"
        deadline = time.monotonic() + 60
        while not any(w.kind == "tools" for w in r.client.warnings) and time.monotonic() < deadline:
            try:
                event = r.client.events.get(timeout=1)
            except Exception:  # noqa: BLE001 - queue.Empty: wait on
                continue
            if isinstance(event, Warning):
                r.client.warnings.append(event)
        assert any(w.kind == "tools" and "no-such-server" in w.message for w in r.client.warnings)
        assert isinstance(r.run([{"role": "user", "content": "still here"}], sampling=SHORT)[-1], Done)
    finally:
        r.close()


def test_a_tool_round_stalls_no_other_stream(tiny_dir: Path) -> None:
    """The tools run away from the batch (``batching.away``): a peer's tokens keep coming while they run.  The
    tool waits until the peer has streamed five more tokens (or 30 s): before, the engine thread ran the tools
    itself, so the peer could stream none until the tool gave up."""
    from engine.runtime.engine import Engine, EngineOptions

    received: dict[str, list[object]] = {}
    ended: dict[str, threading.Event] = {}
    loaded = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, Loaded):
            loaded.set()
        request_id = getattr(event, "request_id", None)
        if request_id in received:
            received[request_id].append(event)
            if isinstance(event, Done | Error):
                ended[request_id].set()

    def submit(text: str, sampling: Sampling, **fields: object) -> str:
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": text},), sampling, **fields)  # type: ignore[arg-type]
        received[request.id], ended[request.id] = [], threading.Event()
        engine.submit(request)
        return request.id

    def peer_tokens() -> int:
        return sum(isinstance(e, Token) for e in received[peer])

    def waits_for_the_peer(arguments: dict[str, object]) -> str:
        start, deadline = peer_tokens(), time.monotonic() + 30
        while peer_tokens() < start + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        return f"the peer streamed {peer_tokens() - start} tokens meanwhile"

    engine = Engine(on_event, EngineOptions(answer_cache=AnswerCacheSettings(enabled=False)))
    try:
        schema = {"type": "object", "properties": {}}
        engine.tools.add(Tool("watch", "waits for the peer", schema, waits_for_the_peer, timeout_s=60.0, source="test"))
        engine.load(ModelSpec(source=str(tiny_dir), dtype="float32", quant="none"))
        assert loaded.wait(120)
        # a reply held to 400 letters: the tiny model's own would end at its first end-of-text token
        peer = submit("Go on.", Sampling(max_tokens=450, format=reply_format("regex", "[ab]{400}")))
        deadline = time.monotonic() + 60
        while peer_tokens() < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        tools = submit("/watch", SHORT, tools=("watch",))
        assert ended[tools].wait(120) and ended[peer].wait(300)
    finally:
        engine.shutdown()
    (call,) = [e for e in received[tools] if isinstance(e, ToolCall)]
    assert call.ok and call.result.startswith("the peer streamed") and call.end - call.start < 30, call.result
    assert int(call.result.split()[3]) >= 5, call.result
    assert done(received[peer]).finish_reason == "stop" and len(done(received[peer]).text) == 400
