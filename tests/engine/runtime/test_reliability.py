"""Every request ends with exactly one Done or Error, whatever fails, and the engine serves the next one.

A failure is injected at each stage of serving a request (prompt build, draft
sources, prefix cache lookup, prefill, a decode step, detokenising, saving to
the prefix cache, assembling ``Done``); bad sampling values are refused before
any generation; a 64-position model stops at its context; the engine thread
survives a failing ``call`` and a failing event callback.  All on the tiny
random model, whose greedy output is exact, so "serves correctly" means the
very same tokens as before the failure.
"""

from __future__ import annotations

import json
import math
import queue
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import engine.runtime.serving as serving_module
import engine.runtime.steps as steps_module
from engine.api import (
    AnswerCacheSettings,
    Done,
    Error,
    Event,
    Loaded,
    ModelSpec,
    Request,
    Sampling,
    Started,
    Token,
    Warning,
)
from engine.runtime.detokenize import StreamText
from engine.runtime.prefix_cache import PrefixCache
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.tiny import make_tiny_model

QUESTION = [{"role": "user", "content": "Tell me a long story about the sea."}]
GREEDY = Sampling(max_tokens=24)
NO_ANSWER_CACHE = AnswerCacheSettings(enabled=False)  # every request here must reach the model


@pytest.fixture(scope="module")
def runner(tiny_dir: Path):
    r = EngineRunner(str(tiny_dir), answer_cache=NO_ANSWER_CACHE)
    yield r
    r.close()


@pytest.fixture(scope="module")
def baseline(runner: EngineRunner) -> list[int]:
    """The greedy reply to QUESTION before anything failed."""
    ids = token_ids(runner.run(QUESTION, sampling=GREEDY, prefix_cache=False))
    assert len(ids) == GREEDY.max_tokens
    return ids


def request(messages: list[dict[str, str]] = QUESTION, **fields: Any) -> Request:
    fields.setdefault("sampling", GREEDY)
    return Request(id=uuid.uuid4().hex, messages=tuple(messages), **fields)


def exchange(runner: EngineRunner, req: Request) -> list[object]:
    """Every event the engine sends (warnings too) from submitting ``req`` until its Done or Error."""
    runner.engine.submit(req)
    out: list[object] = []
    while True:
        event = runner.client.events.get(timeout=120)
        out.append(event)
        if isinstance(event, Done | Error) and event.request_id == req.id:
            return out


def of(events: list[object], req: Request) -> list[Event]:
    return [e for e in events if isinstance(e, Event) and e.request_id == req.id]


def streamed(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


def raising(exc: Exception, real: Callable[..., Any] | None = None, after: int = 0) -> Callable[..., Any]:
    """A stand-in that passes its first ``after`` calls to ``real`` and raises ``exc`` from then on."""
    calls = [0]

    def fn(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] <= after and real is not None:
            return real(*args, **kwargs)
        raise exc

    return fn


def fails_then_serves(
    runner: EngineRunner, bad: Request, baseline: list[int], monkeypatch: pytest.MonkeyPatch
) -> tuple[Done | Error, list[object]]:
    """Serve ``bad`` with the patches in force; undo them; the same engine then answers as before.

    Returns ``bad``'s terminal event and every event sent while ``bad`` was served.
    """
    events = exchange(runner, bad)
    monkeypatch.undo()
    # the same conversation, so a half-written cache entry would show; speculation on, so would a draft state
    normal = request(conversation_id=bad.conversation_id, speculative="auto")
    more = exchange(runner, normal)
    mine = of(events + more, bad)  # a second Done/Error of ``bad`` would come before ``normal``'s events
    terminals = [e for e in mine if isinstance(e, Done | Error)]
    assert len(terminals) == 1, f"expected exactly one Done or Error, got {terminals}"
    assert mine[-1] is terminals[0], "nothing may follow the terminal event"
    end = terminals[0]
    if isinstance(end, Error):
        assert end.partial_text == streamed(mine), "an Error carries exactly the text streamed so far"
        assert "Try again" in end.message
    follow = of(more, normal)
    assert isinstance(follow[-1], Done), f"the engine did not recover: {follow[-1]!r}"
    assert token_ids(follow) == baseline
    return end, events


def victim(**fields: Any) -> Request:
    return request(conversation_id=uuid.uuid4().hex, **fields)


def test_failing_prompt_build(runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_module, "build_prompt", raising(RuntimeError("template exploded")))
    bad = victim()
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Error) and "template exploded" in end.message and end.partial_text == ""
    assert [type(e) for e in of(events, bad)] == [Error]


def test_failing_draft_source_setup(runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_module, "PromptLookup", raising(OSError("lookup table unreadable")))
    end, _ = fails_then_serves(runner, victim(speculative="lookup"), baseline, monkeypatch)
    assert isinstance(end, Error) and "OSError" in end.message and end.partial_text == ""


def test_failing_prefix_cache_lookup(
    runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PrefixCache, "lookup", raising(TypeError("unhashable entry")))
    end, _ = fails_then_serves(runner, victim(), baseline, monkeypatch)
    assert isinstance(end, Error) and "TypeError" in end.message and end.partial_text == ""


def test_failing_prefill(runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps_module, "forward", raising(RuntimeError("out of memory")))
    bad = victim()
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Error) and "out of memory" in end.message and end.partial_text == ""
    assert not any(isinstance(e, Token) for e in of(events, bad))


@pytest.mark.parametrize(("speculative", "steps"), [("off", 9), ("auto", 2)])
def test_failing_decode_step_keeps_the_partial_reply(
    runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch, speculative: str, steps: int
) -> None:
    # call 1 is the prefill (which also gives the first token), then one call per decode step; call
    # ``steps + 1`` fails (with "auto" the earlier answer drafts most of the reply in one step)
    real = steps_module.forward
    monkeypatch.setattr(steps_module, "forward", raising(RuntimeError("step failed"), real, after=steps))
    bad = victim(speculative=speculative)
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Error) and "step failed" in end.message
    ids = token_ids(of(events, bad))
    assert steps <= len(ids) < len(baseline) and ids == baseline[: len(ids)]
    assert end.partial_text, "the text streamed before the failure is kept"


def test_failing_detokeniser_keeps_the_partial_reply(
    runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StreamText, "add", raising(ValueError("bad bytes"), StreamText.add, after=12))
    bad = victim()
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Error) and "bad bytes" in end.message
    assert end.partial_text and token_ids(of(events, bad)) == baseline[: len(token_ids(of(events, bad)))]


@pytest.mark.parametrize("stage", ["insert", "save"])
def test_failing_prefix_cache_save_still_ends_in_done_with_a_warning(
    runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    monkeypatch.setattr(PrefixCache, stage, raising(OSError(28, "No space left on device")))
    # a new system prompt, so the engine writes its KV to disk (``save``)
    system = {"role": "system", "content": f"You are reliable, {uuid.uuid4().hex}."}
    bad = victim(messages=[system, *QUESTION])
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Done) and end.finish_reason == "length"
    assert end.text == streamed(of(events, bad)) and token_ids(of(events, bad))
    warnings = [e for e in events if isinstance(e, Warning)]
    assert [w.kind for w in warnings] == ["cache"] and "No space left" in warnings[0].message


def test_failing_done_assembly(runner: EngineRunner, baseline: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_module, "request_metrics", raising(KeyError("spans")))
    bad = victim()
    end, events = fails_then_serves(runner, bad, baseline, monkeypatch)
    assert isinstance(end, Error) and "KeyError" in end.message
    assert token_ids(of(events, bad)) == baseline and end.partial_text == streamed(of(events, bad))


@pytest.mark.parametrize(
    ("sampling", "word"),
    [
        (Sampling(temperature=math.nan), "temperature"),
        (Sampling(temperature=-1.0), "temperature"),
        (Sampling(top_k=-1), "top_k"),
        (Sampling(top_p=0.0), "top_p"),
        (Sampling(repetition_penalty=0.0), "repetition_penalty"),
        (Sampling(max_tokens=0), "max_tokens"),
        (Sampling(max_tokens=-1), "max_tokens"),
        (Sampling(max_tokens="16"), "max_tokens"),  # type: ignore[arg-type]  # settings.json of the wrong type
        (Sampling(seed=2**70), "seed"),
        (Sampling(stop=("",)), "stop"),
        (Sampling(stop="abc"), "stop"),  # type: ignore[arg-type]  # a string, not a list of them
    ],
)
def test_invalid_sampling_is_refused_before_generation(runner: EngineRunner, sampling: Sampling, word: str) -> None:
    bad = request(sampling=sampling)
    events = of(exchange(runner, bad), bad)
    assert [type(e) for e in events] == [Error], "no prefill, no tokens: one Error"
    assert word in events[0].message and "must" in events[0].message


def test_invalid_messages_are_refused(runner: EngineRunner) -> None:
    bad = request(messages=[{"role": "user", "content": None}])  # type: ignore[dict-item]
    events = of(exchange(runner, bad), bad)
    assert [type(e) for e in events] == [Error] and "content" in events[0].message


@pytest.fixture(scope="module")
def short_context(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model with a 64-position context."""
    path = make_tiny_model(tmp_path_factory.mktemp("ctx64"), seed=3)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (path / "config.json").write_text(json.dumps(config))
    r = EngineRunner(str(path), answer_cache=NO_ANSWER_CACHE)
    assert r.engine.loaded.context_length == 64
    yield r
    r.close()


@pytest.mark.parametrize("speculative", ["off", "lookup"])
def test_decoding_stops_at_the_context(
    short_context: EngineRunner, monkeypatch: pytest.MonkeyPatch, speculative: str
) -> None:
    positions: list[int] = []
    real = steps_module.forward

    def counting(model: Any, state: Any, ids: list[int], all_logits: bool = False, decode: bool = False) -> Any:
        out = real(model, state, ids, all_logits, decode)
        positions.append(len(state))
        return out

    monkeypatch.setattr(steps_module, "forward", counting)
    messages = [{"role": "user", "content": "Repeat after me: abc abc abc abc abc abc abc"}]
    events = short_context.run(messages, sampling=Sampling(max_tokens=500), speculative=speculative)
    final = done(events)
    started = events[0]
    assert isinstance(started, Started)
    assert final.finish_reason == "context"
    assert started.prompt_tokens + final.metrics.completion_tokens == 64
    assert max(positions) <= 64, f"the model was fed {max(positions)} positions"


def test_a_failing_call_is_reported_and_the_loop_goes_on(runner: EngineRunner, baseline: list[int]) -> None:
    def broken_task(engine: Any) -> None:
        raise RuntimeError("task failed")

    runner.engine.call(broken_task)
    normal = request()
    events = exchange(runner, normal)
    warnings = [e for e in events if isinstance(e, Warning)]
    assert [w.kind for w in warnings] == ["engine"] and "broken_task" in warnings[0].message
    assert token_ids(of(events, normal)) == baseline


def test_a_failing_event_callback_does_not_stop_the_engine(tiny_dir: Path, baseline: list[int]) -> None:
    from engine.runtime.engine import Engine, EngineOptions

    sink: queue.Queue[object] = queue.Queue()
    raised: list[object] = []

    def on_event(event: object) -> None:
        if isinstance(event, Token) and not raised:
            raised.append(event)
            raise RuntimeError("the window is gone")
        sink.put(event)

    engine = Engine(on_event, EngineOptions(answer_cache=NO_ANSWER_CACHE))
    try:
        engine.load(ModelSpec(source=str(tiny_dir), dtype="float32"))
        while not isinstance(sink.get(timeout=120), Loaded):
            pass

        def serve(req: Request) -> list[object]:
            engine.submit(req)
            out: list[object] = []
            while not isinstance(out[-1:] and out[-1], Done | Error):
                out.append(sink.get(timeout=120))
            return out

        first, second = serve(request()), serve(request())
        assert isinstance(first[-1], Error) and raised, "the failed delivery ends the reply with an Error"
        assert isinstance(second[-1], Done) and token_ids(second) == baseline
    finally:
        engine.shutdown()


def test_a_bad_prefix_budget_is_refused_at_once(runner: EngineRunner) -> None:
    from engine.runtime.engine import EngineOptions

    for bad in ("512", -1, 1.5, None):
        with pytest.raises(ValueError, match="whole number of bytes"):
            runner.engine.set_prefix_budget(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="whole number of bytes"):
            EngineOptions(prefix_cache_bytes=bad)  # type: ignore[arg-type]


def test_unreadable_saved_prompt_caches_mean_a_cold_start(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrefixCache, "load", raising(AttributeError("'list' object has no attribute 'items'")))
    r = EngineRunner(str(tiny_dir), answer_cache=NO_ANSWER_CACHE)
    try:
        assert isinstance(r.load_event, Loaded) and r.load_event.info.warm_prefixes == 0
        assert [w.kind for w in r.client.warnings] == ["cache"]
        assert token_ids(r.run(QUESTION, sampling=GREEDY))
    finally:
        r.close()
