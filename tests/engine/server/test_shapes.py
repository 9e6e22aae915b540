"""OpenAI's request bodies read into Brisk's (engine.server.shapes): no server, no model."""

from __future__ import annotations

import json

import pytest

from engine.api import Sampling, format_kind
from engine.server import shapes
from engine.server.shapes import ApiError

DEFAULTS = Sampling(repetition_penalty=1.1, stop_repeats=3, max_tokens=512)


def test_messages_become_brisks() -> None:
    messages = shapes.messages_from(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ]
    )
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["content"] == "Weather in Oslo?"
    assert messages[2]["tool_calls"][0]["function"] == {"name": "weather", "arguments": {"city": "Oslo"}}
    assert messages[3] == {"role": "tool", "content": "rain", "name": "weather"}


def test_fields_left_out_keep_the_windows_values() -> None:
    sampling = shapes.sampling_from({"temperature": 0.7, "stop": "END"}, DEFAULTS, 2048)
    assert sampling.temperature == 0.7 and sampling.stop == ("END",)
    assert sampling.repetition_penalty == 1.1 and sampling.stop_repeats == 3 and sampling.max_tokens == 512
    assert shapes.sampling_from({"max_completion_tokens": 9, "max_tokens": 99}, DEFAULTS, 2048).max_tokens == 9
    assert shapes.sampling_from({"frequency_penalty": 0, "n": 1}, DEFAULTS, 2048).temperature == 0.0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"logit_bias": {"word": 1}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": "x"}, "seed"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
def test_what_brisk_cannot_honour_is_refused_by_name(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as raised:
        shapes.sampling_from(body, DEFAULTS, 2048)
    assert raised.value.status == 400 and raised.value.param == param
    assert raised.value.body()["error"]["type"] == "invalid_request_error"


def test_response_format_and_forced_tool_calls_are_reply_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    assert format_kind(shapes.sampling_from(body, DEFAULTS, 2048).format) == "json_schema"
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    tools, forced = shapes.tools_from({"tools": [tool], "tool_choice": "required"})
    assert tools[0]["function"]["name"] == "f" and format_kind(forced) == "lark"
    assert json.loads(forced)["grammar"].startswith('start: "<tool_call>"')
    assert shapes.tools_from({"tools": [tool], "tool_choice": "none"}) == ((), "")
    with pytest.raises(ApiError, match="not in 'tools'"):
        shapes.tools_from({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}})


def test_completion_prompts_are_one_text() -> None:
    request, reply = shapes.completion_request({"prompt": ["Once"], "echo": True}, "m", DEFAULTS, 2048, "off")
    assert request.raw and request.messages[0]["content"] == "Once" and reply.echo and request.origin == "server"
    with pytest.raises(ApiError, match="one text"):
        shapes.completion_request({"prompt": [1, 2, 3]}, "m", DEFAULTS, 2048, "off")
