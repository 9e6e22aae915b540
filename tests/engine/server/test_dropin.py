"""The server as a drop-in for clients written for other servers (issue 51), on the tiny model over real
HTTP: every OpenAI path with and without ``/v1``, any model name answered by the loaded model (unless
``strict_model``), fields Brisk does not honour refused by name or, for the habits clients send, accepted
and said in ``X-Brisk-Ignored``, and honest ``usage`` on an answer-cache hit."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from tests.support.server import Served

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def test_every_path_answers_without_v1(served: Served) -> None:
    bare = openai.OpenAI(base_url=served.root, api_key="none", max_retries=0, timeout=120)
    versioned = served.openai()
    assert [m.id for m in bare.models.list().data] == [m.id for m in versioned.models.list().data]
    assert bare.models.retrieve(served.service.model).id == served.service.model
    chat = bare.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=8)
    assert chat.choices[0].message.content == (
        versioned.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=8)
        .choices[0]
        .message.content
    )
    text = bare.completions.create(model=served.service.model, prompt="The cat sat on the", max_tokens=6)
    assert text.choices[0].text == (
        versioned.completions.create(model=served.service.model, prompt="The cat sat on the", max_tokens=6)
        .choices[0]
        .text
    )
    streamed = bare.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content
    # /embeddings reaches its handler (this server has no embedding model: that 404, not "no endpoint")
    embed = httpx.post(served.root + "/embeddings", json={"input": "a cat"})
    assert embed.status_code == 404 and embed.json()["error"]["code"] == "model_not_found"
    assert httpx.get(served.root + "/v1/health").json()["status"] == "ok"


def test_a_wrong_path_lists_both_forms(served: Served) -> None:
    missing = httpx.post(served.root + "/chat/completion", json={"messages": HELLO})
    assert missing.status_code == 404
    assert "[/v1]/chat/completions" in missing.json()["error"]["message"]


def test_another_model_name_is_answered_by_the_loaded_model(served: Served) -> None:
    api = served.openai()
    expected = api.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=8)
    for name in ("gpt-4o-mini", "claude-3-5-sonnet-latest"):
        reply = api.chat.completions.create(model=name, messages=HELLO, max_tokens=8)
        assert reply.model == served.service.model  # the reply names the model that answered
        assert reply.choices[0].message.content == expected.choices[0].message.content
    chunks = list(api.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=4, stream=True))
    assert {c.model for c in chunks} == {served.service.model}
    text = api.completions.create(model="gpt-3.5-turbo-instruct", prompt="The cat", max_tokens=4)
    assert text.model == served.service.model


def test_strict_model_keeps_the_404(served: Served) -> None:
    served.service.strict_model = True
    try:
        with pytest.raises(openai.NotFoundError, match="gpt-4o-mini"):
            served.openai().chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=4)
        refused = httpx.post(served.url + "/completions", json={"model": "gpt-4o", "prompt": "The cat"})
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"
        assert served.openai().chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=2)
    finally:
        served.service.strict_model = False


def test_brisk_serve_takes_strict_model() -> None:
    from engine.cli import build_parser

    assert build_parser().parse_args(["serve", "--strict-model"]).strict_model is True
    assert build_parser().parse_args(["serve"]).strict_model is False


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {"messages": HELLO, "n_probs": 3}, "n_probs"),
        ("/chat/completions", {"messages": HELLO, "functions": [{"name": "f"}]}, "functions"),
        ("/chat/completions", {"messages": HELLO, "min_p": 0.1, "user": "u1"}, "min_p"),
        ("/completions", {"prompt": "The cat", "response_format": {"type": "json_object"}}, "response_format"),
        ("/completions", {"prompt": "The cat", "grammar": 'root ::= "yes"'}, "grammar"),
        ("/embeddings", {"input": "a cat", "truncate": True}, "truncate"),
    ],
)
def test_a_field_brisk_does_not_honour_is_refused_by_name(served: Served, path: str, body: dict, param: str) -> None:
    refused = httpx.post(served.url + path, json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and f"'{param}'" in error["message"]
    assert error["code"] == "unsupported_parameter"


def test_fields_sent_by_habit_are_taken_and_said(served: Served) -> None:
    habits = {"user": "u-1", "metadata": {"app": "x"}, "store": False, "parallel_tool_calls": True}
    plain = served.openai().chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=6)
    response = served.openai().chat.completions.with_raw_response.create(
        model=served.service.model, messages=HELLO, max_tokens=6, service_tier="auto", **habits
    )
    assert response.headers["x-brisk-ignored"] == "metadata, parallel_tool_calls, service_tier, store, user"
    assert response.parse().choices[0].message.content == plain.choices[0].message.content
    body = {"messages": HELLO, "max_tokens": 4, "stream": True, "user": "u-1", "logit_bias": None}
    with httpx.stream("POST", served.url + "/chat/completions", json=body) as streamed:
        assert streamed.status_code == 200 and streamed.headers["x-brisk-ignored"] == "user"
        streamed.read()
    text = httpx.post(served.url + "/completions", json={"prompt": "The cat", "max_tokens": 2, "user": "u"})
    assert text.status_code == 200 and text.headers["x-brisk-ignored"] == "user"
    bare = served.openai().chat.completions.with_raw_response.create(
        model=served.service.model, messages=HELLO, max_tokens=2
    )
    assert "x-brisk-ignored" not in bare.headers


def test_llama_cpps_name_for_the_repetition_penalty_is_honoured(served: Served) -> None:
    def reply(extra: dict) -> str:
        body = {"messages": HELLO, "max_tokens": 24, **extra}
        return httpx.post(served.url + "/chat/completions", json=body).json()["choices"][0]["message"]["content"]

    assert reply({"repeat_penalty": 1.8}) == reply({"repetition_penalty": 1.8}) != reply({})


@pytest.fixture(scope="module")
def cached(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server whose engine keeps an answer cache, in a data folder of its own."""
    before = os.environ["BRISK_DATA_DIR"]
    os.environ["BRISK_DATA_DIR"] = str(tmp_path_factory.mktemp("answer-cache-server"))
    server = Served(str(tiny_dir), answer_cache=True)
    yield server
    server.close()
    os.environ["BRISK_DATA_DIR"] = before


def test_an_answer_cache_hit_reports_its_prompt_all_cached(cached: Served) -> None:
    api = cached.openai()
    question = [{"role": "user", "content": "What does a lighthouse keeper do all day?"}]
    first = api.chat.completions.create(model=cached.service.model, messages=question, max_tokens=8)
    hit = api.chat.completions.create(model=cached.service.model, messages=question, max_tokens=8)
    assert first.model_extra["brisk"]["answer_cache"] is None and hit.model_extra["brisk"]["answer_cache"] == "exact"
    assert hit.choices[0].message.content == first.choices[0].message.content
    assert hit.usage.prompt_tokens == first.usage.prompt_tokens > 0
    assert hit.usage.prompt_tokens_details.cached_tokens == hit.usage.prompt_tokens
    assert hit.usage.total_tokens == hit.usage.prompt_tokens + hit.usage.completion_tokens
    chunks = list(
        api.chat.completions.create(
            model=cached.service.model,
            messages=question,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens == first.usage.prompt_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens


def test_the_tokenizer_copy_is_made_when_the_server_starts(served: Served) -> None:
    """The server's own tokenizer copy (engine.server.vocab) is made while listening, before any request needs it
    (it takes about 0.5 s for SmolLM2's: the first answer-cache hit would pay it)."""
    assert served.service.vocab is not None
    deadline = time.monotonic() + 60
    while not served.service.vocab.copied() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.service.vocab.copied()
