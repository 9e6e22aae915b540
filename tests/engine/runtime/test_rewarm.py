"""After a reload the last system prompt is prefilled again in the background: the next reply reuses it,
a request that arrives meanwhile comes first (after one chunk at most), and greedy output never changes."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import engine.runtime.rewarm as rewarm_module
import engine.runtime.steps as steps_module
from engine import quant
from engine.api import Done, Error, Event, Loaded, ModelSpec, Request, Sampling, Started, Warning
from engine.runtime.loading import kv_file
from engine.runtime.prefix_cache import PERSISTED
from engine.runtime.rewarm import PARTIAL
from engine.runtime.steps import PREFILL_CHUNK
from tests.support.engine_runner import EngineRunner, done, token_ids

# about 340 tokens with the tiny model's byte-level tokenizer: two prefill chunks
SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in one short paragraph. " * 5}
# about 330 tokens with the bundled model's tokenizer
BUNDLED_SYSTEM = {"role": "system", "content": SYSTEM["content"] * 5}
GREEDY = Sampling(max_tokens=16)


@pytest.fixture
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder with no saved prompt caches, so nothing but the warm-up can make a reply warm."""
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def ask(runner: EngineRunner, question: str, system: dict[str, str] = SYSTEM, **fields: Any) -> list[object]:
    fields.setdefault("conversation_id", uuid.uuid4().hex)
    return runner.run([system, {"role": "user", "content": question}], sampling=GREEDY, answer_cache=False, **fields)


def system_length(runner: EngineRunner) -> int:
    (n,) = [len(e.tokens) for k, e in runner.engine.prefix_cache.entries.items() if k.startswith(PERSISTED)]
    return n


def reload_and_check(runner: EngineRunner, source: str, mode: str, system: dict[str, str] = SYSTEM) -> None:
    """Reload in ``mode``; the next reply with the same system prompt reuses it and equals a cold one."""
    done(ask(runner, "Name a colour.", system))
    length = system_length(runner)
    assert length > PREFILL_CHUNK, "the system prompt should take more than one chunk"
    loaded = runner.client.load(ModelSpec(source=source, dtype="float32", quant=mode))
    assert isinstance(loaded, Loaded) and loaded.info.quant == mode
    assert runner.engine.rewarm.idle.wait(300), "the warm-up never finished"
    saved = kv_file(runner.engine.prefix_cache.identity).is_file()
    assert saved == runner.engine.options.persist_prefixes, "the warm-up saves a system prompt as a reply does"
    events = ask(runner, "Name an animal.", system)
    started, final = events[0], done(events)
    assert isinstance(started, Started)
    assert started.cached_tokens == final.metrics.cached_tokens >= length, "the system prompt was not reused"
    cold = ask(runner, "Name an animal.", system, prefix_cache=False)
    assert token_ids(events) == token_ids(cold), "greedy changed"
    assert not [k for k in runner.engine.prefix_cache.entries if k.startswith(PARTIAL)]


@pytest.mark.parametrize(("mode", "persist"), [("none", False), ("int8-cpu", True)])
def test_a_reload_prefills_the_last_system_prompt_again(
    tiny_dir: Path, fresh_data: Path, mode: str, persist: bool
) -> None:
    if reason := quant.availability(torch.device("cpu")).get(mode):
        pytest.skip(reason)
    runner = EngineRunner(str(tiny_dir), persist_prefixes=persist)
    try:
        reload_and_check(runner, str(tiny_dir), mode)
        assert not runner.client.warnings
    finally:
        runner.close()


@pytest.mark.bundled
def test_a_reload_prefills_the_system_prompt_again_on_the_bundled_model(fresh_data: Path) -> None:
    runner = EngineRunner("", persist_prefixes=False)
    try:
        reload_and_check(runner, "", "none", BUNDLED_SYSTEM)
    finally:
        runner.close()


def test_a_request_during_the_warm_up_comes_first_and_reuses_the_part_done(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = EngineRunner(str(tiny_dir), persist_prefixes=False)
    try:
        done(ask(runner, "Name a colour."))
        length = system_length(runner)
        request = Request(
            uuid.uuid4().hex,
            (SYSTEM, {"role": "user", "content": "Name an animal."}),
            GREEDY,
            conversation_id="during",
            answer_cache=False,
        )
        log: list[tuple[str, int]] = []
        real = rewarm_module.forward

        def warm_forward(model: Any, state: Any, ids: list[int], *args: Any) -> Any:
            log.append(("warm", len(ids)))
            if len(log) == 1:  # the request arrives while the first chunk is computed
                object.__setattr__(request, "submitted_at", 0.0)
                runner.engine.scheduler.put(("submit", request))
            return real(model, state, ids, *args)

        def reply_forward(model: Any, state: Any, ids: list[int], *args: Any, **kwargs: Any) -> Any:
            log.append(("reply", len(ids)))
            return real(model, state, ids, *args, **kwargs)

        monkeypatch.setattr(rewarm_module, "forward", warm_forward)
        monkeypatch.setattr(steps_module, "forward", reply_forward)
        runner.engine.load(ModelSpec(source=str(tiny_dir), dtype="float32"))  # not client.load: it drops events
        events: list[Event] = []
        while not isinstance(events[-1:] and events[-1], Done | Error):
            event = runner.client.events.get(timeout=120)
            if isinstance(event, Event) and event.request_id == request.id:
                events.append(event)
        assert runner.engine.rewarm.idle.wait(120)
        monkeypatch.undo()
        assert log[0] == ("warm", PREFILL_CHUNK) and log[1][0] == "reply", f"the request waited: {log}"
        assert [kind for kind, _ in log].count("warm") == 1, "the request kept the whole prompt: no more warm-up"
        assert isinstance(events[0], Started) and events[0].cached_tokens == PREFILL_CHUNK, "the part done is reused"
        assert token_ids(events) == token_ids(ask(runner, "Name an animal.", prefix_cache=False))
        assert system_length(runner) == length
        assert not [k for k in runner.engine.prefix_cache.entries if k.startswith(PARTIAL)]
    finally:
        runner.close()


def test_a_failing_warm_up_is_a_cache_warning_and_a_cold_exact_reply(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = EngineRunner(str(tiny_dir), persist_prefixes=False)
    try:
        done(ask(runner, "Name a colour."))

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("out of memory")

        monkeypatch.setattr(rewarm_module, "forward", broken)
        runner.client.load(ModelSpec(source=str(tiny_dir), dtype="float32"))
        assert runner.engine.rewarm.idle.wait(120)
        monkeypatch.undo()
        events = ask(runner, "Name an animal.")
        warnings = [w for w in runner.client.warnings if isinstance(w, Warning)]
        assert [w.kind for w in warnings] == ["cache"] and "out of memory" in warnings[0].message
        assert done(events).metrics.cached_tokens == 0
        assert token_ids(events) == token_ids(ask(runner, "Name an animal.", prefix_cache=False))
    finally:
        runner.close()


def test_clearing_the_prompt_cache_stops_the_warm_up(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = EngineRunner(str(tiny_dir), persist_prefixes=False)
    try:
        done(ask(runner, "Name a colour."))
        assert system_length(runner) > PREFILL_CHUNK, "the warm-up must take more than one chunk"
        chunks: list[int] = []
        go = threading.Event()
        real = rewarm_module.forward

        def held_forward(model: Any, state: Any, ids: list[int], *args: Any) -> Any:
            chunks.append(len(ids))
            go.wait(60)  # the first chunk waits until the clear is queued behind it
            return real(model, state, ids, *args)

        monkeypatch.setattr(rewarm_module, "forward", held_forward)
        runner.client.load(ModelSpec(source=str(tiny_dir), dtype="float32"))
        deadline = time.monotonic() + 60
        while not chunks and time.monotonic() < deadline:
            time.sleep(0.01)
        runner.engine.clear_prefix_cache()
        while runner.engine.scheduler.intake.empty() and time.monotonic() < deadline:
            time.sleep(0.01)  # the clear has reached the engine's queue
        go.set()
        assert runner.engine.rewarm.idle.wait(120)
        monkeypatch.undo()
        assert chunks == [PREFILL_CHUNK], f"the warm-up went on after the clear: {chunks}"
        assert done(ask(runner, "Name an animal.")).metrics.cached_tokens == 0
    finally:
        runner.close()


def test_same_vocabulary_knows_a_reload_of_the_same_files_and_compares_others(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    from engine.runtime.rewarm import same_vocabulary

    first, again = AutoTokenizer.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    assert same_vocabulary(first, again)
    calls: list[str] = []

    class Other:  # another folder: the vocabularies themselves are compared
        name_or_path = "elsewhere"

        def __len__(self) -> int:
            return len(first)

        def get_vocab(self) -> dict[str, int]:
            calls.append("vocab")
            return {**first.get_vocab(), "<extra>": len(first)}

    assert not same_vocabulary(first, Other()) and calls == ["vocab"]
