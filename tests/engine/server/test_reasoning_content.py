"""A thinking model through the OpenAI-compatible server, with the official ``openai`` SDK: the thinking comes
back apart as ``reasoning_content`` (streamed and not), or in ``content`` inside <think>...</think> with
``reasoning_format: "none"``; ``chat_template_kwargs.enable_thinking`` is the template's switch.

The tiny model writes a scripted reply (a regex format put on the request's sampling), so every event goes
through the real engine and server."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.api import reply_format
from engine.server import shapes
from tests.engine.runtime.test_thinking import QWEN3_LIKE, THOUGHT, folder
from tests.support.server import Served

ASK = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = Served(str(folder(tmp_path_factory.mktemp("qwen3-like"), QWEN3_LIKE)))
    yield server
    server.close()


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chat request of the test writes exactly THOUGHT."""
    original = shapes.sampling_from

    def sampling_from(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(original(*args, **kwargs), format=reply_format("regex", re.escape(THOUGHT)))

    monkeypatch.setattr(shapes, "sampling_from", sampling_from)


def ask(served: Served, **fields: Any) -> Any:
    return served.openai().chat.completions.create(model=served.service.model, messages=ASK, max_tokens=40, **fields)


def test_the_thinking_comes_back_apart_streamed_and_not(served: Served, scripted: None) -> None:
    message = ask(served).choices[0].message
    assert (message.content, message.reasoning_content) == ("Paris.", "I ponder.")
    chunks = list(ask(served, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    answer = "".join(d.content or "" for d in deltas)
    assert (answer, thought) == ("Paris.", "I ponder.")
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_answer:]), "thinking comes first"


def test_reasoning_format_none_keeps_the_thinking_in_the_content(served: Served, scripted: None) -> None:
    extra = {"reasoning_format": "none"}
    message = ask(served, extra_body=extra).choices[0].message
    assert message.content == "<think>I ponder.</think>Paris." and not getattr(message, "reasoning_content", None)
    streamed = "".join(
        c.choices[0].delta.content or "" for c in ask(served, stream=True, extra_body=extra) if c.choices
    )
    assert streamed == message.content


def test_enable_thinking_is_the_templates_switch_and_bad_values_are_refused(served: Served, scripted: None) -> None:
    def prompt_tokens(**extra: Any) -> int:
        return ask(served, extra_body=extra).usage.prompt_tokens

    auto = prompt_tokens()
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == auto + len("<think>\n\n</think>\n\n")
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": True}) == auto
    for extra, field in [
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools_in_user_message": True}}, "chat_template_kwargs"),
        ({"reasoning_format": "hidden"}, "reasoning_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(served, extra_body=extra)
        assert refused.value.body["param"] == field  # type: ignore[index]


def test_anthropic_messages_give_a_thinking_block_and_take_the_switch(served: Served, scripted: None) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=served.root, api_key="x", max_retries=0, timeout=120)
    message = client.messages.create(model="local", max_tokens=40, messages=ASK)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == ("I ponder.", "Paris.")
    with client.messages.stream(model="local", max_tokens=40, messages=ASK) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", "I ponder."),
        ("text", "Paris."),
    ]
    # the thinking block sent back in history is left out of the prompt; the switch is the template's
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in message.content]}]
    history.append({"role": "user", "content": "And of Italy?"})
    counted = client.messages.count_tokens(model="local", messages=history).input_tokens
    without = [*ASK, {"role": "assistant", "content": "Paris."}, history[-1]]
    assert counted == client.messages.count_tokens(model="local", messages=without).input_tokens
    off = client.messages.create(model="local", max_tokens=40, messages=ASK, thinking={"type": "disabled"})
    assert off.usage.input_tokens + off.usage.cache_read_input_tokens == message.usage.input_tokens + (
        message.usage.cache_read_input_tokens
    ) + len("<think>\n\n</think>\n\n")
