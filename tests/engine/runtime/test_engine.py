"""Engine tests on the tiny random model: exact greedy output, streaming, cancel, sampling, errors."""

from __future__ import annotations

import torch

from engine.api import Done, Error, PrefillProgress, Sampling, Started, Token
from engine.runtime.prompt import build_prompt
from tests.support.engine_runner import EngineRunner, done, token_ids

SYSTEM = {"role": "system", "content": "You are terse."}


def reference_greedy(runner: EngineRunner, messages: list[dict[str, str]], n: int) -> list[int]:
    """Greedy decode by recomputing the whole sequence every step (no cache at all)."""
    loaded = runner.engine.loaded
    ids = build_prompt(loaded.tokenizer, messages, loaded.context_length, n).ids
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            logits = loaded.model(input_ids=torch.tensor([ids + out])).logits[0, -1]
            token = int(logits.argmax())
            if token in loaded.eos_ids:
                break
            out.append(token)
    return out


def test_greedy_matches_uncached_reference(tiny_engine: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Say something long."}]
    events = tiny_engine.run(messages, sampling=Sampling(max_tokens=40), prefix_cache=False)
    assert token_ids(events) == reference_greedy(tiny_engine, messages, 40)
    assert len(token_ids(events)) > 0


def test_event_order_and_times(tiny_engine: EngineRunner) -> None:
    events = tiny_engine.run([{"role": "user", "content": "hello"}], sampling=Sampling(max_tokens=10))
    assert isinstance(events[0], Started)
    assert any(isinstance(e, PrefillProgress) for e in events)
    times = [e.t for e in events]
    assert times == sorted(times) and times[0] >= 0
    final = done(events)
    assert final.text == "".join(e.text for e in events if isinstance(e, Token))
    m = final.metrics
    assert m.prompt_tokens == events[0].prompt_tokens
    assert m.completion_tokens == len(token_ids(events))
    assert 0 < m.ttft_s <= final.t


def test_max_tokens_stops_with_length(tiny_engine: EngineRunner) -> None:
    events = tiny_engine.run([{"role": "user", "content": "go"}], sampling=Sampling(max_tokens=5))
    ids = token_ids(events)
    assert len(ids) <= 5
    if len(ids) == 5:
        assert done(events).finish_reason == "length"


def test_cancel_keeps_partial_reply(tiny_engine: EngineRunner) -> None:
    events = tiny_engine.run(
        [{"role": "user", "content": "cancel me"}], sampling=Sampling(max_tokens=200), cancel_after=3
    )
    final = done(events)
    assert final.finish_reason == "cancelled"
    assert 3 <= len(token_ids(events)) < 200
    assert final.text == "".join(e.text for e in events if isinstance(e, Token))


def test_stop_string_cuts_reply(tiny_engine: EngineRunner) -> None:
    messages = [{"role": "user", "content": "Say something long."}]
    free = done(tiny_engine.run(messages, sampling=Sampling(max_tokens=40))).text
    assert len(free) > 6
    stop = free[3:5]
    cut = tiny_engine.run(messages, sampling=Sampling(max_tokens=40, stop=(stop,)))
    final = done(cut)
    assert stop not in final.text
    assert final.text == free[: free.find(stop)]
    assert "".join(e.text for e in cut if isinstance(e, Token)) == final.text


def test_seeded_sampling_is_reproducible(tiny_engine: EngineRunner) -> None:
    params = Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=7, max_tokens=20)
    messages = [{"role": "user", "content": "sample"}]
    a = token_ids(tiny_engine.run(messages, sampling=params))
    b = token_ids(tiny_engine.run(messages, sampling=params))
    c = token_ids(tiny_engine.run(messages, sampling=Sampling(temperature=1.0, seed=8, max_tokens=20)))
    assert a == b
    assert a != c


def test_empty_message_is_an_error_not_a_crash(tiny_engine: EngineRunner) -> None:
    events = tiny_engine.run([{"role": "user", "content": "   "}])
    assert isinstance(events[-1], Error)
    assert "empty" in events[-1].message


def test_overlong_history_keeps_system_and_recent_turns(tiny_engine: EngineRunner) -> None:
    # the tiny model has a 512-token context; each turn here is ~100 tokens
    turns = []
    for i in range(8):
        turns += [{"role": "user", "content": f"question {i} " + "x" * 80}, {"role": "assistant", "content": "ok " * 5}]
    messages = [SYSTEM, *turns, {"role": "user", "content": "last question"}]
    events = tiny_engine.run(messages, sampling=Sampling(max_tokens=16))
    started = events[0]
    assert isinstance(started, Started) and started.truncated
    assert isinstance(events[-1], Done)
    prompt = build_prompt(tiny_engine.engine.loaded.tokenizer, messages, 512, 16)
    text = tiny_engine.engine.loaded.tokenizer.decode(prompt.ids)
    assert "You are terse." in text and "last question" in text and "question 0 " not in text
    assert len(prompt.ids) <= 512 - 16


def test_single_huge_message_is_cut_to_fit(tiny_engine: EngineRunner) -> None:
    events = tiny_engine.run([{"role": "user", "content": "y" * 5000}], sampling=Sampling(max_tokens=8))
    assert events[0].truncated
    assert isinstance(events[-1], Done)
    assert events[0].prompt_tokens <= 512 - 8
