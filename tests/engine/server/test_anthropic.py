"""Anthropic's Messages API (``/v1/messages``, issue 51) on the tiny model over real HTTP, through the
``anthropic`` SDK: plain and streamed replies equal to the OpenAI path's greedy text, the system prompt,
stop sequences, a tool_use round trip, count_tokens against the prompt the engine builds, and errors in
Anthropic's shape."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx2 as httpx
import pytest

from tests.support.server import Served

HELLO = [{"role": "user", "content": "Hello there, who are you?"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    # bounded: the tiny random model would write a string until the token limit
    "input_schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo", "Rome"]}, "days": {"type": "integer", "maximum": 9}},
        "required": ["city", "days"],
    },
}


@pytest.fixture(scope="module")
def served(tiny_dir: Path):
    server = Served(str(tiny_dir))
    yield server
    server.close()


def client(served: Served, **kwargs) -> anthropic.Anthropic:
    kwargs.setdefault("api_key", "none")
    return anthropic.Anthropic(base_url=served.root, max_retries=0, timeout=120, **kwargs)


def openai_text(served: Served, messages: list[dict], max_tokens: int, **kwargs) -> str:
    reply = served.openai().chat.completions.create(
        model=served.service.model, messages=messages, max_tokens=max_tokens, **kwargs
    )
    return reply.choices[0].message.content or ""


def test_create_answers_as_the_openai_path(served: Served) -> None:
    message = client(served).messages.create(model="claude-sonnet-4-5", max_tokens=12, messages=HELLO)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == served.service.model  # the loaded model answers, and says so
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == openai_text(served, HELLO, 12)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    usage = message.usage
    assert usage.output_tokens > 0 and usage.cache_creation_input_tokens == 0
    assert usage.input_tokens + usage.cache_read_input_tokens > 0


def test_max_tokens_is_the_stop_reason_at_the_limit(served: Served) -> None:
    message = client(served).messages.create(model="m", max_tokens=3, messages=HELLO)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_streamed_events_carry_the_same_text(served: Served) -> None:
    api = client(served)
    plain = api.messages.create(model="m", max_tokens=12, messages=HELLO)
    events = list(api.messages.create(model="m", max_tokens=12, messages=HELLO, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == plain.content[0].text
    assert events[0].message.usage.input_tokens + events[0].message.usage.cache_read_input_tokens > 0
    assert events[-2].delta.stop_reason == plain.stop_reason
    assert events[-2].usage.output_tokens == plain.usage.output_tokens
    # the SDK's own stream helper puts the events back together into the same message
    with api.messages.stream(model="m", max_tokens=12, messages=HELLO) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == plain.content[0].text and final.stop_reason == plain.stop_reason
    # and the raw stream names each SSE event, with a ping after message_start
    body = {"model": "m", "max_tokens": 4, "messages": HELLO, "stream": True}
    with httpx.stream("POST", served.root + "/v1/messages", json=body) as raw:
        names = [line.removeprefix("event: ") for line in raw.iter_lines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_system_prompt_is_the_first_turn(served: Served) -> None:
    system = "You are a pirate. Answer in one line."
    api = client(served)
    as_text = api.messages.create(model="m", max_tokens=10, system=system, messages=HELLO)
    as_blocks = api.messages.create(
        model="m",
        max_tokens=10,
        system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": HELLO[0]["content"]}]}],
    )
    expected = openai_text(served, [{"role": "system", "content": system}, *HELLO], 10)
    assert as_text.content[0].text == as_blocks.content[0].text == expected
    assert expected != openai_text(served, HELLO, 10)  # the system turn reached the model


def test_stop_sequence_ends_the_reply_and_is_named(served: Served) -> None:
    api = client(served)
    cat = [{"role": "user", "content": "The cat sat on the"}]  # the tiny model's reply to it is not all one character
    free = api.messages.create(model="m", max_tokens=16, messages=cat).content[0].text
    stop = free[1:3]
    assert len(free) > 3 and free.find(stop) > 0, free
    message = api.messages.create(model="m", max_tokens=16, messages=cat, stop_sequences=["NEVER-SEEN", stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == free[: free.index(stop)]
    streamed = list(api.messages.create(model="m", max_tokens=16, messages=cat, stop_sequences=[stop], stream=True))
    assert "".join(e.delta.text for e in streamed if e.type == "content_block_delta") == message.content[0].text
    assert streamed[-2].delta.stop_reason == "stop_sequence" and streamed[-2].delta.stop_sequence == stop


def test_tool_use_round_trip(served: Served) -> None:
    api = client(served)
    question = {"role": "user", "content": "What is the weather in Paris for 3 days?"}
    message = api.messages.create(
        model="m", max_tokens=120, messages=[question], tools=[WEATHER], tool_choice={"type": "any"}
    )
    assert message.stop_reason == "tool_use", message
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert call.input["city"] in ("Paris", "Oslo", "Rome") and isinstance(call.input["days"], int)
    # the same call, streamed, comes as a tool_use block with its input as JSON
    events = list(
        api.messages.create(
            model="m",
            max_tokens=120,
            messages=[question],
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            stream=True,
        )
    )
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert starts[-1].type == "tool_use" and starts[-1].name == "get_weather"
    partial = "".join(
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == len(starts) - 1
    )
    assert json.loads(partial) == call.input
    assert events[-2].delta.stop_reason == "tool_use"
    # the tool's answer goes back as a tool_result and the model goes on; the prompt holds both
    history = [
        question,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
    ]
    follow = api.messages.create(model="m", max_tokens=8, messages=history, tools=[WEATHER])
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with_result = api.messages.count_tokens(model="m", messages=history, tools=[WEATHER]).input_tokens
    history[2]["content"][0]["content"] = "sunny, 21 C, light wind from the west all afternoon"
    assert api.messages.count_tokens(model="m", messages=history, tools=[WEATHER]).input_tokens > with_result
    # the same turns on the OpenAI path: the same greedy reply
    openai_history = [
        question,
        {"role": "assistant", "content": None, "tool_calls": [_openai_call(call.id, call.name, call.input)]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}
    expected = openai_text(served, openai_history, 8, tools=[{"type": "function", "function": tool}])
    assert "".join(b.text for b in follow.content if b.type == "text") == expected


def _openai_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_count_tokens_is_the_prompt_the_engine_builds(served: Served) -> None:
    api = client(served)
    system = "Be brief."
    counted = api.messages.count_tokens(model="m", system=system, messages=HELLO).input_tokens
    usage = api.messages.create(model="m", max_tokens=4, system=system, messages=HELLO).usage
    assert counted == usage.input_tokens + usage.cache_read_input_tokens
    chat = served.openai().chat.completions.create(
        model=served.service.model, messages=[{"role": "system", "content": system}, *HELLO], max_tokens=4
    )
    assert counted == chat.usage.prompt_tokens
    with_tools = api.messages.count_tokens(model="m", system=system, messages=HELLO, tools=[WEATHER]).input_tokens
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}
    chat = served.openai().chat.completions.create(
        model=served.service.model,
        messages=[{"role": "system", "content": system}, *HELLO],
        tools=[{"type": "function", "function": tool}],
        max_tokens=4,
    )
    assert with_tools == chat.usage.prompt_tokens  # the tools as the engine puts them in the prompt


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": "m", "messages": HELLO}, "max_tokens"),
        ({"model": "m", "max_tokens": 8, "messages": HELLO, "thinking": {"type": "sometimes"}}, "thinking: must be"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, "role"),
        ({"model": "m", "max_tokens": 8, "messages": HELLO, "temperature": 1.5}, "temperature"),
        (
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            "'image'",
        ),
    ],
)
def test_errors_are_anthropic_error_objects(served: Served, body: dict, words: str) -> None:
    raw = httpx.post(served.root + "/v1/messages", json=body)
    assert raw.status_code == 400, raw.text
    error = raw.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match=words.strip("'")):
        client(served).post("/v1/messages", body=body, cast_to=anthropic.types.Message)


def test_the_sdk_raises_bad_request_for_missing_max_tokens_and_unknown_fields(served: Served) -> None:
    api = client(served)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        api.messages.create(model="m", messages=HELLO, max_tokens=None)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="top_logprobs") as refused:
        api.messages.create(model="m", max_tokens=8, messages=HELLO, extra_body={"top_logprobs": 3})
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_metadata_is_taken_and_said(served: Served) -> None:
    response = client(served).messages.with_raw_response.create(
        model="m", max_tokens=6, messages=HELLO, metadata={"user_id": "u-1"}
    )
    assert response.headers["x-brisk-ignored"] == "metadata"
    assert response.parse().content[0].text == openai_text(served, HELLO, 6)


def test_the_key_is_taken_as_x_api_key(tiny_dir: Path) -> None:
    server = Served(str(tiny_dir), api_key="s3cret")
    try:
        with pytest.raises(anthropic.AuthenticationError):
            client(server, api_key="wrong").messages.create(model="m", max_tokens=2, messages=HELLO)
        refused = httpx.post(server.root + "/v1/messages", json={"model": "m", "max_tokens": 2, "messages": HELLO})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert client(server, api_key="s3cret").messages.create(model="m", max_tokens=2, messages=HELLO).content
        assert client(server, api_key=None, auth_token="s3cret").messages.count_tokens(model="m", messages=HELLO)
    finally:
        server.close()


def test_blocks_become_the_chat_turns_of_the_openai_path() -> None:
    from engine.server.anthropic_api import _messages

    turns = _messages(
        [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout", "is_error": True},
                    {"type": "text", "text": "Try again."},
                ],
            },
        ],
    )
    assert turns == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: timeout"},
        {"role": "user", "content": "Try again."},
    ]
