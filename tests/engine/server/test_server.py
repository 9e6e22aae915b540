"""The OpenAI-compatible server on the tiny model: a real uvicorn on a free port, the official ``openai`` SDK,
raw HTTP (httpx) for what the SDK hides, and Brisk's own remote backend as a second client."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from engine.api import Done, ModelSpec, Request, Sampling
from tests.support.server import Served

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            # bounded: the tiny random model would write a string until the token limit
            "properties": {"city": {"enum": ["Paris", "Oslo", "Rome"]}, "days": {"type": "integer", "maximum": 9}},
            "required": ["city", "days"],
        },
    },
}


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def direct(served: Served, messages: list[dict], max_tokens: int = 24) -> Done:
    """The engine's own greedy reply, not through HTTP."""
    request = Request(uuid.uuid4().hex, tuple(messages), Sampling(max_tokens=max_tokens))
    events = list(served.client.stream(request))
    assert isinstance(events[-1], Done), events[-1]
    return events[-1]


def test_models_and_health(served: Served) -> None:
    models = served.openai().models.list()
    ids = [m.id for m in models.data]
    assert served.service.model in ids
    health = httpx.get(served.root + "/health").json()
    assert health["status"] == "ok" and health["model"] == served.service.model


def test_chat_matches_the_engine_streamed_and_not(served: Served) -> None:
    expected = direct(served, HELLO)
    api = served.openai()
    reply = api.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=24)
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == {"length": "length", "stop": "stop"}[expected.finish_reason]
    assert reply.usage.completion_tokens == expected.metrics.completion_tokens
    assert reply.usage.prompt_tokens == expected.metrics.prompt_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens > 0  # the same prompt's KV was reused
    assert reply.model_extra["brisk"]["ttft_s"] > 0

    stream = api.chat.completions.create(
        model=served.service.model,
        messages=HELLO,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected.metrics.completion_tokens


def test_completions_take_the_prompt_as_it_is(served: Served) -> None:
    api = served.openai()
    reply = api.completions.create(model=served.service.model, prompt="The cat sat on the", max_tokens=12)
    chat = api.chat.completions.create(
        model=served.service.model, messages=[{"role": "user", "content": "The cat sat on the"}], max_tokens=1
    )
    assert reply.choices[0].text and reply.usage.prompt_tokens < chat.usage.prompt_tokens  # no chat template
    again = api.completions.create(
        model=served.service.model, prompt="The cat sat on the", max_tokens=12, stream=True, echo=True
    )
    text = "".join(c.choices[0].text for c in again if c.choices)
    assert text == "The cat sat on the" + reply.choices[0].text


def test_sampling_fields_are_honoured(served: Served) -> None:
    api = served.openai()
    one = (
        api.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=16, temperature=1.0, seed=7)
        .choices[0]
        .message.content
    )
    two = (
        api.chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=16, temperature=1.0, seed=7)
        .choices[0]
        .message.content
    )
    assert one == two  # one seed, one reply
    short = api.chat.completions.create(model=served.service.model, messages=HELLO, max_completion_tokens=3)
    assert short.usage.completion_tokens <= 3 and short.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": HELLO, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
        ({"messages": HELLO, "n": 9}, 400, "n"),
        ({"messages": HELLO, "temperature": "hot"}, 400, "temperature"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "messages[0]"),
        ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {}}}, 400, "response_format"),
        ({"messages": HELLO, "tool_choice": "required"}, 400, "tool_choice"),
        (
            {"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}}},
            400,
            "response_format",
        ),
    ],
)
def test_bad_requests_get_openai_errors(served: Served, body: dict, status: int, param: str) -> None:
    response = httpx.post(served.url + "/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_malformed_bodies_and_paths(served: Served) -> None:
    raw = httpx.post(
        served.url + "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    big = httpx.post(served.url + "/chat/completions", content=b" " * (9 << 20))
    assert big.status_code == 413
    assert httpx.get(served.url + "/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(served.url + "/chat/completions").status_code == 405
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        served.openai().chat.completions.create(model=served.service.model, messages=HELLO, presence_penalty=3)


def test_a_key_is_required_when_set(tiny_dir: Path) -> None:
    server = Served(str(tiny_dir), api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            server.openai(api_key="wrong").models.list()
        assert httpx.post(server.url + "/chat/completions", json={"messages": HELLO}).status_code == 401
        assert server.openai().models.list().data
    finally:
        server.close()


def test_tool_choice_required_returns_a_valid_call(served: Served) -> None:
    api = served.openai()
    reply = api.chat.completions.create(
        model=served.service.model,
        messages=[{"role": "user", "content": "What is the weather in Paris for 3 days?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=120,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"] in ("Paris", "Oslo", "Rome") and isinstance(arguments["days"], int)
    # the tool's answer goes back as a tool turn and the reply goes on
    follow = api.chat.completions.create(
        model=served.service.model,
        messages=[
            {"role": "user", "content": "What is the weather in Paris for 3 days?"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_tokens=8,
    )
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_streamed_tool_calls_come_as_deltas(served: Served) -> None:
    stream = served.openai().chat.completions.create(
        model=served.service.model,
        messages=[{"role": "user", "content": "Weather in Oslo, 2 days?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "<tool_call>" not in text
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    json.loads(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_concurrent_clients_get_their_lone_replies(served: Served) -> None:
    prompts = [f"Tell me about topic number {i}." for i in range(4)]
    alone = [direct(served, [{"role": "user", "content": p}]).text for p in prompts]
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        reply = served.openai().chat.completions.create(
            model=served.service.model, messages=[{"role": "user", "content": prompts[i]}], max_tokens=24
        )
        results[i] = reply.choices[0].message.content or ""

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[i] for i in range(4)] == alone


def test_idle_connections_and_a_slow_reader_hold_nobody_up(served: Served) -> None:
    idle = [socket.create_connection(("127.0.0.1", served.thread.port)) for _ in range(1000)]
    try:
        body = {"messages": HELLO, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", served.url + "/chat/completions", json=body, timeout=60) as slow:
            assert slow.status_code == 200  # and never read
            reply = served.openai().chat.completions.create(model=served.service.model, messages=HELLO, max_tokens=8)
            assert reply.choices[0].message.content is not None
    finally:
        for sock in idle:
            sock.close()


def test_two_hundred_messages_are_fitted_to_the_context(served: Served) -> None:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i} says something."} for i in range(199)
    ]
    reply = served.openai().chat.completions.create(model=served.service.model, messages=turns, max_tokens=8)
    assert reply.choices[0].message.content is not None
    assert reply.usage.prompt_tokens <= served.service.context  # the oldest turns were dropped to fit


def test_embeddings(served: Served) -> None:
    served.service.embedder = _embedder
    try:
        api = served.openai()
        out = api.embeddings.create(model="all-MiniLM-L6-v2", input=["a cat", "a kitten", "stock markets fell"])
        vectors = [d.embedding for d in out.data]
        assert len(vectors) == 3 and len(vectors[0]) == 384
        dot = [sum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors]
        assert dot[1] > dot[2]
        assert out.usage.prompt_tokens > 3
        with pytest.raises(openai.BadRequestError):
            api.embeddings.create(model="all-MiniLM-L6-v2", input=[[1, 2, 3]])
    finally:
        served.service.embedder = None


def _embedder():  # noqa: ANN202
    from engine.answer_cache.embed import shared_embedder

    return shared_embedder()


def test_brisk_remote_backend_talks_to_brisk_serve(served: Served) -> None:
    from engine.client import Client
    from engine.remote import remote_backend

    expected = direct(served, HELLO)
    with Client(remote_backend(served.url, served.service.model, None), timeout=60) as remote:
        remote.load(ModelSpec(source=served.service.model or ""))
        done = remote.ask(tuple(HELLO), sampling=Sampling(max_tokens=24))
    assert done.text == expected.text
    assert done.metrics.completion_tokens == expected.metrics.completion_tokens
