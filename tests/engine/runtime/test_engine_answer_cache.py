"""The answer cache inside the engine, on the tiny model: exact hits, misses on another context, fresh, during a load.

Each test module gets its own data folder (the cache lives in its ``brisk.db``); semantic matching is off here
(it is tested in test_answer_cache_semantic.py), so every hit is exact and deterministic.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.api import AnswerCacheSettings, Done, Loaded, ModelSpec, Request, Sampling, Started, Token
from engine.runtime import loading as loading_module
from engine.runtime.answer_lookup import wait_all_kept
from tests.support.engine_runner import EngineRunner, done, token_ids

SETTINGS = AnswerCacheSettings(semantic=False)
GREEDY = Sampling(max_tokens=12)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data = tmp_path_factory.mktemp("answer-cache-data")
    before = os.environ["BRISK_DATA_DIR"]
    os.environ["BRISK_DATA_DIR"] = str(data)
    yield data
    os.environ["BRISK_DATA_DIR"] = before


@pytest.fixture(scope="module")
def runner(tiny_dir: Path, data_dir: Path) -> Iterator[EngineRunner]:
    r = EngineRunner(str(tiny_dir), answer_cache=SETTINGS)
    yield r
    r.close()


def ask(runner: EngineRunner, question: str, system: str = "", **kwargs: object) -> list[object]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    kwargs.setdefault("sampling", GREEDY)
    return runner.run(messages, **kwargs)


def test_the_same_greedy_question_twice_is_an_exact_hit(runner: EngineRunner) -> None:
    first = ask(runner, "What is a tiny model?")
    second = ask(runner, "  what is a TINY model? ")  # case and whitespace do not matter
    a, b = done(first), done(second)
    assert a.metrics.answer_cache is None and a.metrics.completion_tokens > 0
    assert b.metrics.answer_cache == "exact"
    assert b.text == a.text and token_ids(second) == token_ids(first)
    assert isinstance(second[0], Started) and [type(e) for e in second[1:]] == [Token, Done]
    m = b.metrics
    assert m.ttft_s is not None and 0 <= m.ttft_s <= m.total_s <= b.t
    assert m.saved_s is not None and m.saved_s >= 0 and m.similarity is None
    assert m.completion_tokens == len(token_ids(second))


def test_a_cached_reply_that_stopped_at_max_tokens_says_so_again(runner: EngineRunner) -> None:
    short = Sampling(max_tokens=3)
    first = done(ask(runner, "Tell me a long story about tiny models.", sampling=short))
    again = done(ask(runner, "Tell me a long story about tiny models.", sampling=short))
    assert first.finish_reason == "length" and first.metrics.completion_tokens == 3
    assert again.metrics.answer_cache == "exact" and again.text == first.text
    assert again.finish_reason == "length"
    # a kept reply that ended before max_tokens (the model's end of turn) stays "stop"
    question = {"role": "user", "content": "Say hi."}
    request = Request(uuid.uuid4().hex, (question,), GREEDY, answer_cache=True)
    engine = runner.engine
    assert engine.answer_lookup.put(engine.identity, request, "Hi!", [1, 2], 0.5)
    hit = done(runner.run([question], sampling=GREEDY))
    assert hit.metrics.answer_cache == "exact" and hit.text == "Hi!" and hit.finish_reason == "stop"


def test_another_context_or_sampling_misses(runner: EngineRunner) -> None:
    done(ask(runner, "Name a colour."))
    assert done(ask(runner, "Name a colour.")).metrics.answer_cache == "exact"
    assert done(ask(runner, "Name a colour.", system="Be brief.")).metrics.answer_cache is None
    assert done(ask(runner, "Name a colour.", sampling=Sampling(max_tokens=13))).metrics.answer_cache is None
    sampled = Sampling(max_tokens=12, temperature=0.8, seed=1)
    assert done(ask(runner, "Name a colour.", sampling=sampled)).metrics.answer_cache is None
    assert done(ask(runner, "Name a colour.", sampling=sampled)).metrics.answer_cache is None, "sampled: not cached"
    assert done(ask(runner, "Name a colour.", tools=("calculator",))).metrics.answer_cache is None
    assert done(ask(runner, "Name a colour.", answer_cache=False)).metrics.answer_cache is None


def test_fresh_bypasses_the_cache_and_replaces_the_answer(runner: EngineRunner) -> None:
    first = done(ask(runner, "Regenerate me."))
    entries = runner.engine.answer_lookup.stats().entries
    fresh = done(ask(runner, "Regenerate me.", fresh=True))
    assert fresh.metrics.answer_cache is None and fresh.metrics.completion_tokens > 0
    assert runner.engine.answer_lookup.stats().entries == entries, "the fresh answer replaced the old one"
    again = done(ask(runner, "Regenerate me."))
    assert again.metrics.answer_cache == "exact" and again.text == fresh.text == first.text


def test_a_cancelled_reply_is_not_kept(runner: EngineRunner) -> None:
    events = ask(runner, "Cancel this one.", sampling=Sampling(max_tokens=200), cancel_after=2)
    assert done(events).finish_reason == "cancelled"
    assert done(ask(runner, "Cancel this one.", sampling=Sampling(max_tokens=200))).metrics.answer_cache is None


def test_cached_answers_are_speculative_drafts(runner: EngineRunner) -> None:
    first = ask(runner, "Draft from me, please.", sampling=Sampling(max_tokens=24))
    again = ask(
        runner, "Draft from me, please.", sampling=Sampling(max_tokens=24), answer_cache=False, speculative="answers"
    )
    m = done(again).metrics
    assert token_ids(again) == token_ids(first)
    assert m.draft_sources["answers"].accepted > 0


def test_a_cached_answer_is_served_while_the_model_loads(
    tiny_dir: Path, runner: EngineRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.runtime.engine import Engine, EngineOptions

    question = "Answer me during the load."
    expected = done(ask(runner, question))  # cached by the runner's load of the same spec
    wait_all_kept()  # the runner's engine keeps it just after its Done: the new engine must find it
    release = threading.Event()
    real_load = loading_module.load_model

    def slow_load(spec: ModelSpec, progress, **options):  # noqa: ANN001, ANN003, ANN202
        assert release.wait(120), "the test never released the load"
        return real_load(spec, progress, **options)

    monkeypatch.setattr(loading_module, "load_model", slow_load)
    events: queue.Queue[object] = queue.Queue()
    engine = Engine(events.put, EngineOptions(answer_cache=SETTINGS))
    try:
        engine.load(ModelSpec(source=str(tiny_dir), dtype="float32"))
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": question},), GREEDY)
        engine.submit(request)
        seen: list[object] = []
        while not isinstance(seen[-1:] and seen[-1], Done):
            seen.append(events.get(timeout=60))
        assert not release.is_set() and not any(isinstance(e, Loaded) for e in seen), "served before the load ended"
        hit = seen[-1]
        assert hit.metrics.answer_cache == "exact" and hit.text == expected.text
        release.set()
        while not isinstance(events.get(timeout=120), Loaded):
            pass
        miss = Request(uuid.uuid4().hex, ({"role": "user", "content": "Not cached yet."},), GREEDY)
        engine.submit(miss)
        while not isinstance(last := events.get(timeout=120), Done):
            pass
        assert last.request_id == miss.id and last.metrics.answer_cache is None
    finally:
        release.set()
        engine.shutdown()


def test_a_cached_reply_that_cannot_be_delivered_ends_with_an_error(runner: EngineRunner, tiny_dir: Path) -> None:
    from engine.api import Error
    from engine.runtime.engine import Engine, EngineOptions

    question = "Deliver me twice."
    done(ask(runner, question))
    wait_all_kept()
    sink: queue.Queue[object] = queue.Queue()

    def on_event(event: object) -> None:
        if isinstance(event, Token):
            raise RuntimeError("the window is gone")
        sink.put(event)

    engine = Engine(on_event, EngineOptions(answer_cache=SETTINGS))
    try:
        engine.load(ModelSpec(source=str(tiny_dir), dtype="float32"))
        while not isinstance(sink.get(timeout=120), Loaded):
            pass
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": question},), GREEDY)
        engine.submit(request)
        while not isinstance(last := sink.get(timeout=60), Done | Error):
            pass
        assert isinstance(last, Error) and last.request_id == request.id
    finally:
        engine.shutdown()
