"""Continuous batching: requests submitted together decode in shared model steps, and each greedy reply is
token for token the one it gets alone (tiny random model in fp16-cpu, where the native step batches; the
bundled model as installed); a long prompt prefilled in chunks lets the others step between its chunks."""

from __future__ import annotations

import queue
import time
import uuid
from pathlib import Path

import pytest

from engine.api import Done, Error, Loaded, LoadFailed, ModelSpec, Request, Sampling, Token
from engine.client import local_backend
from engine.runtime.batching import MAX_ACTIVE

PROMPTS = [
    "Tell me a story about a fox.",
    "What is the capital of France?",
    "List three prime numbers.",
    "Explain rain to a child.",
    "Write a haiku about winter.",
    "Give me tips for an interview.",
    "Describe a sunset over the sea.",
    "How do plants grow?",
]


class Collector:
    """A real engine; every request's events collected by id."""

    def __init__(self, source: str, quant: str) -> None:
        from engine.api import AnswerCacheSettings

        self.events: queue.Queue[object] = queue.Queue()
        self.engine = local_backend(answer_cache=AnswerCacheSettings(enabled=False))(self.events.put)
        self.engine.load(ModelSpec(source=source, dtype="float32", quant=quant))
        while True:
            event = self.events.get(timeout=600)
            if isinstance(event, LoadFailed):
                raise AssertionError(event.message)
            if isinstance(event, Loaded):
                break

    def run(self, requests: list[Request], spacing_s: float = 0.0) -> dict[str, list[object]]:
        out: dict[str, list[object]] = {r.id: [] for r in requests}
        for request in requests:
            self.engine.submit(request)
            if spacing_s:
                time.sleep(spacing_s)
        ended = 0
        while ended < len(requests):
            event = self.events.get(timeout=600)
            rid = getattr(event, "request_id", None)
            if rid in out:
                out[rid].append(event)
                ended += isinstance(event, Done | Error)
        return out

    def close(self) -> None:
        self.engine.shutdown()


def request(text: str, max_tokens: int = 32, speculative: str = "off", **fields: object) -> Request:
    return Request(
        uuid.uuid4().hex,
        ({"role": "user", "content": text},),
        Sampling(max_tokens=max_tokens),
        speculative=speculative,
        prefix_cache=False,
        **fields,  # type: ignore[arg-type]
    )


def ids_of(events: list[object]) -> list[int]:
    assert isinstance(events[-1], Done), events[-1]
    return [i for e in events if isinstance(e, Token) for i in e.ids]


@pytest.fixture(scope="module")
def tiny_fp16(tiny_dir: Path):
    collector = Collector(str(tiny_dir), "fp16-cpu")
    yield collector
    collector.close()


@pytest.mark.parametrize("speculative", ["off", "lookup"])
def test_batched_greedy_equals_alone(tiny_fp16: Collector, speculative: str) -> None:
    alone = {}
    for text in PROMPTS:
        (events,) = tiny_fp16.run([request(text, speculative=speculative)]).values()
        alone[text] = ids_of(events)
    steps_before = tiny_fp16.engine.batch.steps
    together = [request(text, speculative=speculative) for text in PROMPTS]
    out = tiny_fp16.run(together)
    for r in together:
        assert ids_of(out[r.id]) == alone[r.messages[0]["content"]], r.messages[0]["content"]
    assert tiny_fp16.engine.batch.widest >= 4  # the requests really stepped together
    assert tiny_fp16.engine.batch.steps > steps_before


def test_more_requests_than_places_wait_and_the_windows_go_first(tiny_fp16: Collector) -> None:
    server = [request(f"Server question {i}", max_tokens=16, origin="server") for i in range(MAX_ACTIVE + 2)]
    window = request("The window's question", max_tokens=16)
    out = tiny_fp16.run([*server, window])
    finished = sorted(out, key=lambda rid: out[rid][-1].t)  # submitted together: t orders the ends
    assert all(isinstance(events[-1], Done) for events in out.values())
    # the window's request did not wait behind the two server requests that found no place
    assert finished.index(window.id) < max(finished.index(r.id) for r in server[-2:])


def test_a_long_prompt_does_not_freeze_the_others(tiny_fp16: Collector) -> None:
    talking = request("Tell me a long story about the sea.", max_tokens=200)
    long_prompt = request("Summarise this. " + "The harbour was quiet that morning. " * 120, max_tokens=4)
    out = tiny_fp16.run([talking, long_prompt], spacing_s=0.0)
    tokens_during_prefill = [
        e for e in out[talking.id] if isinstance(e, Token) and e.t < _first_token_t(out[long_prompt.id])
    ]
    assert len(tokens_during_prefill) > 0
    assert all(isinstance(events[-1], Done) for events in out.values())


def _first_token_t(events: list[object]) -> float:
    return next(e.t for e in events if isinstance(e, Token))


def test_cancel_inside_a_batch_ends_only_that_request(tiny_fp16: Collector) -> None:
    requests = [request(text, max_tokens=200) for text in PROMPTS[:4]]
    for r in requests:
        tiny_fp16.engine.submit(r)
    tiny_fp16.engine.cancel(requests[1].id)
    out: dict[str, list[object]] = {r.id: [] for r in requests}
    ended = 0
    while ended < 4:
        event = tiny_fp16.events.get(timeout=600)
        rid = getattr(event, "request_id", None)
        if rid in out:
            out[rid].append(event)
            ended += isinstance(event, Done | Error)
    assert out[requests[1].id][-1].finish_reason == "cancelled"
    assert all(out[r.id][-1].finish_reason != "cancelled" for r in requests if r is not requests[1])


@pytest.mark.bundled
def test_bundled_model_batched_equals_alone() -> None:
    collector = Collector("", "fp16-cpu")
    try:
        alone = {}
        for text in PROMPTS[:4]:
            (events,) = collector.run([request(text, max_tokens=48)]).values()
            alone[text] = ids_of(events)
        together = [request(text, max_tokens=48) for text in PROMPTS[:4]]
        out = collector.run(together)
        for r in together:
            assert ids_of(out[r.id]) == alone[r.messages[0]["content"]]
        assert collector.engine.batch.widest == 4
    finally:
        collector.close()
