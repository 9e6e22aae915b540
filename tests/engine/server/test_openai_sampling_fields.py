"""OpenAI's sampling fields on the real server with the tiny model, through the official ``openai`` SDK:
``logit_bias``, ``presence_penalty`` / ``frequency_penalty``, ``logprobs`` / ``top_logprobs`` (chat and legacy
completions, streamed and not, checked against a log-softmax of the model's own logits) and ``seed``, with
speculation off and on (``auto`` drafts each reply from the earlier ones, so drafts are verified)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import torch

from engine.api import Done, Request, Sampling, Token
from engine.server import shapes
from engine.server.vocab import piece_bytes
from tests.support.server import Served

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]
QUOTE = [{"role": "user", "content": "Repeat: the lamp, the lens, the log; the lamp, the lens, the log."}]


@pytest.fixture(scope="module")
def served(tiny_dir: Path) -> Iterator[Served]:
    server = Served(str(tiny_dir))
    yield server
    server.close()


@pytest.fixture(scope="module")
def hf_model(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture
def drafting(served: Served) -> Iterator[None]:
    """Speculation on for the test (the server's requests take the service's source)."""
    served.service.speculative = "auto"
    yield
    served.service.speculative = "off"


def chat(served: Served, **fields: Any) -> Any:
    fields.setdefault("messages", HELLO)
    fields.setdefault("max_tokens", 16)
    return served.openai().chat.completions.create(model=served.service.model, **fields)


def direct(served: Served, sampling: Sampling, messages: list[dict] = HELLO) -> Done:
    """The engine's own reply, not through HTTP."""
    return replied(served, sampling, messages)[0]


def replied(served: Served, sampling: Sampling, messages: list[dict] = HELLO) -> tuple[Done, list[int]]:
    """The engine's own reply and its token ids."""
    request = Request(uuid.uuid4().hex, tuple(messages), sampling, answer_cache=False)
    events = list(served.client.stream(request))
    assert isinstance(events[-1], Done), events[-1]
    return events[-1], [i for e in events if isinstance(e, Token) for i in e.ids]


def reference(served: Served, hf_model: Any, body: dict, reply: list[int], params: Sampling) -> torch.Tensor:
    """The log-softmax at each reply position of the model's own logits (transformers' forward on the prompt
    the server builds and the reply), after the request's bias and penalties and over its temperature."""
    from engine.runtime import sampling

    request, _ = shapes.chat_request(body, "m", Sampling(max_tokens=16), 2048, "off")
    prompt = served.service.vocab.prompt_ids(request)  # type: ignore[union-attr]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
    rows = [sampling.processed(row, params, reply[:i]) for i, row in enumerate(logits)]
    return torch.log_softmax(torch.stack(rows) / (params.temperature or 1.0), -1)


def said(answer: Any) -> list[bytes]:
    """A chat answer's tokens, as their bytes (the tiny model's text is mostly U+FFFD)."""
    return [bytes(c.bytes) for c in answer.choices[0].logprobs.content]


def pieces(served: Served, ids: list[int]) -> list[bytes]:
    return [piece_bytes(served.client.backend.loaded.tokenizer, i) for i in ids]


def test_logit_bias_forces_and_bans_tokens_as_the_engine_does(served: Served) -> None:
    _, plain = replied(served, Sampling(max_tokens=8))
    banned = chat(served, max_tokens=8, logprobs=True, logit_bias={str(plain[0]): -100})
    assert said(banned)[0] != pieces(served, plain)[0]
    _, engine = replied(served, Sampling(max_tokens=8, logit_bias=((plain[0], -100.0),)))
    assert said(banned) == pieces(served, engine)
    forced = chat(served, max_tokens=6, logprobs=True, logit_bias={"70": 100})
    assert said(forced) == pieces(served, [70] * 6)
    assert all(c.logprob == pytest.approx(0.0, abs=1e-4) for c in forced.choices[0].logprobs.content)


def test_presence_and_frequency_penalties_are_openais(served: Served) -> None:
    plain = chat(served, messages=QUOTE, max_tokens=24, logprobs=True)
    penalised = chat(served, messages=QUOTE, max_tokens=24, logprobs=True, presence_penalty=1.5, frequency_penalty=2)
    assert said(penalised) != said(plain)
    _, engine = replied(served, Sampling(max_tokens=24, presence_penalty=1.5, frequency_penalty=2.0), QUOTE)
    assert said(penalised) == pieces(served, engine)


def test_chat_logprobs_are_the_log_softmax_of_the_models_logits(served: Served, hf_model: Any) -> None:
    body = {"messages": HELLO, "max_tokens": 12, "logprobs": True, "top_logprobs": 5}
    answer = chat(served, **{k: v for k, v in body.items() if k != "messages"})
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens == 12
    assert b"".join(bytes(c.bytes) for c in content).decode("utf-8", "replace") == answer.choices[0].message.content
    done, ids = replied(served, Sampling(max_tokens=12))
    assert done.text == answer.choices[0].message.content
    expected = reference(served, hf_model, body, ids, Sampling())
    for i, entry in enumerate(content):
        assert entry.logprob == pytest.approx(expected[i, ids[i]].item(), abs=1e-3)
        assert len(entry.top_logprobs) == 5
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the likeliest token is the one said
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(expected[i].topk(5).values.tolist(), abs=1e-3)


def test_logprobs_follow_bias_penalty_and_temperature(served: Served, hf_model: Any) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 10,
        "logprobs": True,
        "temperature": 0.7,
        "seed": 5,
        "logit_bias": {"70": 4},
        "frequency_penalty": 0.8,
    }
    answer = chat(served, **{k: v for k, v in body.items() if k != "messages"})
    params = Sampling(temperature=0.7, logit_bias=((70, 4.0),), frequency_penalty=0.8)
    done, ids = replied(served, dataclasses.replace(params, max_tokens=10, seed=5))
    assert done.text == answer.choices[0].message.content  # one seed, one reply
    content = answer.choices[0].logprobs.content
    assert len(ids) == len(content)
    expected = reference(served, hf_model, body, ids, params)
    assert [c.logprob for c in content] == pytest.approx([expected[i, t].item() for i, t in enumerate(ids)], abs=1e-3)
    assert all(c.top_logprobs == [] for c in content)


def stream_chat(served: Served, **fields: Any) -> tuple[str, list[Any]]:
    text, numbers = "", []
    for chunk in chat(served, stream=True, **fields):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                numbers.extend(chunk.choices[0].logprobs.content)
    return text, numbers


@pytest.mark.parametrize("source", ["off", "auto"])
def test_streamed_logprobs_equal_the_whole_answers_with_speculation_off_and_on(served: Served, source: str) -> None:
    served.service.speculative = source
    try:
        whole = chat(served, messages=QUOTE, max_tokens=24, logprobs=True, top_logprobs=2)
        text, numbers = stream_chat(served, messages=QUOTE, max_tokens=24, logprobs=True, top_logprobs=2)
        if source == "auto":  # the reply just given was drafted from, so these numbers are verified tokens'
            assert whole.model_extra["brisk"]["accepted"] > 0
    finally:
        served.service.speculative = "off"
    assert text == whole.choices[0].message.content
    got = [(n.token, n.logprob, [t.token for t in n.top_logprobs]) for n in numbers]
    want = [(n.token, n.logprob, [t.token for t in n.top_logprobs]) for n in whole.choices[0].logprobs.content]
    assert [g[0] for g in got] == [w[0] for w in want] and [g[2] for g in got] == [w[2] for w in want]
    assert [g[1] for g in got] == pytest.approx([w[1] for w in want], abs=1e-4)
    plain = chat(served, messages=QUOTE, max_tokens=24, logprobs=True, top_logprobs=2)  # speculation off
    assert [n.logprob for n in plain.choices[0].logprobs.content] == pytest.approx([w[1] for w in want], abs=1e-4)


def test_legacy_completions_give_logprobs_streamed_and_not(served: Served) -> None:
    api = served.openai()
    whole = api.completions.create(model=served.service.model, prompt="The cat sat on", max_tokens=10, logprobs=3)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == whole.usage.completion_tokens
    assert all(1 <= len(top) <= 4 and max(top.values()) <= 0 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    tokens, numbers = [], []
    stream = api.completions.create(
        model=served.service.model, prompt="The cat sat on", max_tokens=10, logprobs=3, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens.extend(chunk.choices[0].logprobs.tokens)
            numbers.extend(chunk.choices[0].logprobs.token_logprobs)
    assert tokens == lp.tokens and numbers == pytest.approx(lp.token_logprobs, abs=1e-4)
    none = api.completions.create(model=served.service.model, prompt="The cat sat on", max_tokens=4)
    assert none.choices[0].logprobs is None


def test_a_seed_repeats_a_sampled_reply_whatever_drafted_it(served: Served) -> None:
    replies = []
    accepted = 0
    for source in ("off", "auto"):
        served.service.speculative = source
        try:
            for _ in range(3):
                answer = chat(served, messages=QUOTE, max_tokens=32, temperature=1.0, seed=1234)
                replies.append(answer.choices[0].message.content)
                accepted += answer.model_extra["brisk"]["accepted"]
        finally:
            served.service.speculative = "off"
    assert len(set(replies)) == 1, replies
    assert accepted > 0  # auto drafted the earlier replies, and the drafts were checked
    other = chat(served, messages=QUOTE, max_tokens=32, temperature=1.0, seed=4321).choices[0].message.content
    assert other != replies[0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HELLO, "logit_bias": {"99999": 5}}, "logit_bias"),  # past the tiny vocabulary
        ({"messages": HELLO, "logit_bias": {"5": 200}}, "logit_bias"),
        ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": HELLO, "presence_penalty": -3}, "presence_penalty"),
    ],
)
def test_values_out_of_range_are_refused_by_name(served: Served, body: dict, param: str) -> None:
    response = httpx.post(served.url + "/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_echo_with_logprobs_is_refused_and_logprobs_skip_the_answer_cache(served: Served) -> None:
    response = httpx.post(served.url + "/completions", json={"prompt": "Hi", "logprobs": 1, "echo": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "echo"
    request, _ = shapes.chat_request({"messages": HELLO, "logprobs": True}, "m", Sampling(), 2048, "off")
    assert request.answer_cache is False and request.sampling.logprobs
    request, _ = shapes.chat_request({"messages": HELLO}, "m", Sampling(), 2048, "off")
    assert request.answer_cache is True


def choice_bytes(choice: Any) -> list[bytes]:
    return [bytes(c.bytes) for c in choice.logprobs.content]


def test_n_siblings_equal_the_request_sent_n_times_with_their_seeds(served: Served) -> None:
    fields = {"messages": QUOTE, "max_tokens": 12, "temperature": 1.0, "logprobs": True}
    many = chat(served, n=3, seed=10, **fields)
    assert [c.index for c in many.choices] == [0, 1, 2]
    alone = [chat(served, seed=10 + i, **fields) for i in range(3)]
    assert [choice_bytes(c) for c in many.choices] == [said(a) for a in alone]
    assert len({tuple(choice_bytes(c)) for c in many.choices}) == 3  # three seeds, three replies
    assert many.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt counted once, as OpenAI does
    streamed: dict[int, list[bytes]] = {}
    usage = None
    ids = set()
    for chunk in chat(served, n=3, seed=10, stream=True, stream_options={"include_usage": True}, **fields):
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.setdefault(c.index, []).extend(bytes(n.bytes) for n in c.logprobs.content)
    assert [streamed[i] for i in range(3)] == [said(a) for a in alone]
    assert usage is not None and usage.completion_tokens == many.usage.completion_tokens
    assert len(ids) == 1  # one id for every choice


def test_legacy_completions_take_n(served: Served) -> None:
    api = served.openai()
    fields = {"model": served.service.model, "prompt": "The cat sat on", "max_tokens": 8, "temperature": 1.0}
    many = api.completions.create(n=2, seed=3, logprobs=0, **fields)
    alone = [api.completions.create(seed=3 + i, logprobs=0, **fields) for i in range(2)]
    assert [c.logprobs.tokens for c in many.choices] == [a.choices[0].logprobs.tokens for a in alone]
    greedy = api.completions.create(n=2, **{**fields, "temperature": 0})
    assert greedy.choices[0].text == greedy.choices[1].text and greedy.usage.completion_tokens == 16


def test_llama_cpps_completion_maps_the_same_fields(served: Served) -> None:
    body = {"prompt": "The cat sat on", "n_predict": 6, "n_probs": 2, "return_tokens": True}
    plain = httpx.post(served.root + "/completion", json=body).json()
    probs = plain["completion_probabilities"]
    assert [p["id"] for p in probs] == plain["tokens"] and all(len(p["top_logprobs"]) == 2 for p in probs)
    assert all(p["top_logprobs"][0]["id"] == p["id"] for p in probs)  # greedy: the likeliest is said
    with httpx.stream("POST", served.root + "/completion", json={**body, "stream": True}) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    streamed = [p for chunk in map(json.loads, lines) for p in chunk.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == plain["tokens"]
    assert [p["logprob"] for p in streamed] == pytest.approx([p["logprob"] for p in probs], abs=1e-4)
    banned = httpx.post(served.root + "/completion", json={**body, "logit_bias": [[plain["tokens"][0], False]]})
    assert banned.json()["tokens"][0] != plain["tokens"][0]
    forced = httpx.post(served.root + "/completion", json={**body, "logit_bias": {"70": 100}}).json()
    assert forced["tokens"] == [70] * 6 and forced["generation_settings"]["logit_bias"] == [[70, 100.0]]
    penalised = {**body, "frequency_penalty": 2.0, "presence_penalty": 1.0, "n_probs": 0}
    got = httpx.post(served.root + "/completion", json=penalised).json()
    assert got["generation_settings"]["frequency_penalty"] == 2.0 and "completion_probabilities" not in got


def test_fields_only_the_local_engine_honours_are_refused_over_a_remote_one() -> None:
    from starlette.testclient import TestClient

    from engine.server.app import Service, build_app
    from engine.server.hub import Hub
    from engine.server.vocab import Vocab

    submitted: list[Request] = []

    def submit(request: Request) -> None:  # the remote engine: never reached by these requests
        submitted.append(request)
        raise RuntimeError("the remote engine was asked")

    service = Service(Hub(submit, lambda _: None), model="m", vocab=Vocab(lambda: object()))
    with TestClient(build_app(service), raise_server_exceptions=False) as http:
        for field, value in (("logprobs", True), ("logit_bias", {"5": 1}), ("frequency_penalty", 0.5)):
            refused = http.post("/v1/chat/completions", json={"messages": HELLO, field: value})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    assert submitted == []  # refused before the engine saw them
