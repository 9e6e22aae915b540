"""Brisk's own tool prompt for chat templates without a tool format (engine.tools.prompt), on the tests' tiny
byte-level tokenizer: with its plain ChatML template (no tools) and with one that renders tools and tool turns."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from engine.api import Request
from engine.model.tool_template import template_renders_tool_turns, template_renders_tools
from engine.runtime.prompt import build_prompt, render
from engine.runtime.tool_turns import follow_up, prompt_schemas
from engine.tools import Call, Parsed, Registry, builtin_tools, parse_model_output, tool_schemas
from engine.tools.prompt import plain_tool_turns, tool_instructions
from engine.tools.run import CallResult, TurnResult
from tests.support.tiny import make_tokenizer

# ChatML with a tools section in the system turn and tool calls and results, as Qwen's templates do
TOOL_CHATML = (
    "{% if tools %}{{ '<|im_start|>system\\nTools:' }}{% for tool in tools %}"
    "{{ ' ' + tool['function']['name'] }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}{{ '<call>' + call['function']['name'] + '</call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NO_SYSTEM = (  # refuses a system message, as Gemma's template does
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer(template: str | None = None) -> Any:
    tok = make_tokenizer()
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def schemas() -> list[dict[str, Any]]:
    return tool_schemas(Registry(builtin_tools()).only(["calculator"]))


def text(tok: Any, messages: list[dict[str, Any]], tools: Any = None) -> str:
    return str(tok.decode(render(tok, messages, tools=tools)))


def turn(result: str = "391", ok: bool = True) -> TurnResult:
    return TurnResult((CallResult("calculator", {"expression": "17*23"}, 0.0, 0.001, ok, result),), 0.0, 0.001, True)


def test_the_probe_tells_a_template_with_tools_from_one_without() -> None:
    plain, tooled = tokenizer(), tokenizer(TOOL_CHATML)
    assert not template_renders_tools(plain) and not template_renders_tool_turns(plain)
    assert template_renders_tools(tooled) and template_renders_tool_turns(tooled)
    assert not template_renders_tools(tokenizer(NO_SYSTEM))


def test_the_tool_prompt_reaches_a_prompt_whose_template_has_no_tools(schemas: list[dict[str, Any]]) -> None:
    tok = tokenizer()
    question = [{"role": "user", "content": "What is 17*23?"}]
    rendered = text(tok, question, schemas)
    assert rendered.startswith("<|im_start|>system\n" + tool_instructions(schemas))
    assert '"name": "calculator"' in rendered and "<tool_call>" in rendered
    assert rendered.endswith("<|im_start|>user\nWhat is 17*23?<|im_end|>\n<|im_start|>assistant\n")
    example = rendered.split("<tool_call>")[1].split("</tool_call>")[0]
    assert parse_model_output(f"<tool_call>{example}</tool_call>").calls[0].name == "calculator"


def test_a_template_with_tools_renders_them_itself(schemas: list[dict[str, Any]]) -> None:
    tok = tokenizer(TOOL_CHATML)
    rendered = text(tok, [{"role": "user", "content": "Hi"}], schemas)
    assert rendered.startswith("<|im_start|>system\nTools: calculator<|im_end|>")
    assert "<tool_call>" not in rendered, "no second copy of the tools"


def test_the_tool_prompt_follows_the_system_prompt_and_is_kept_with_it(schemas: list[dict[str, Any]]) -> None:
    tok = tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    prompt = build_prompt(tok, messages, context=4096, max_tokens=64, tools=schemas)
    rendered = tok.decode(prompt.ids)
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\nYou have access to the following tools:")
    system_end = rendered.index("<|im_start|>user")
    assert tok.decode(prompt.ids[: prompt.system_tokens]) == rendered[:system_end], "saved like a system prompt"


def test_a_template_without_a_system_role_gets_it_in_the_first_user_message(schemas: list[dict[str, Any]]) -> None:
    rendered = text(tokenizer(NO_SYSTEM), [{"role": "user", "content": "What is 2+2?"}], schemas)
    assert rendered.startswith("<|im_start|>user\nYou have access to the following tools:")
    assert rendered.endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_a_tool_round_reads_as_text_where_the_template_has_no_tool_turns(schemas: list[dict[str, Any]]) -> None:
    tok = tokenizer()
    question = [{"role": "user", "content": "What is 17*23?"}]
    reply = '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'
    parsed = parse_model_output(reply)
    following = follow_up(question, reply, parsed, turn(), as_text=False)
    rendered = text(tok, following, schemas)
    assert "<|im_start|>tool" not in rendered, "no turn of a speaker the model never saw"
    assert f"<|im_start|>assistant\n{reply}<|im_end|>" in rendered, "the call is in the model's own turn"
    assert '<|im_start|>user\nTool result of calculator {"expression": "17*23"}:\n391<|im_end|>' in rendered


def test_a_failed_result_and_an_openai_tool_message_read_as_text() -> None:
    messages = [
        {"role": "user", "content": "What is 1/0?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: division by zero"},
    ]
    plain = plain_tool_turns(messages)
    assert [m["role"] for m in plain] == ["user", "assistant", "user"]
    assert plain[2]["content"] == "Tool result of calculator: the tool could not run: division by zero"


def test_a_template_with_tool_turns_keeps_them() -> None:
    tok = tokenizer(TOOL_CHATML)
    question = [{"role": "user", "content": "What is 17*23?"}]
    parsed = Parsed("", (Call("calculator", {"expression": "17*23"}),))
    rendered = text(tok, follow_up(question, "", parsed, turn(), as_text=False))
    assert "<call>calculator</call>" in rendered and "<|im_start|>tool\n391" in rendered


def test_turning_the_tool_prompt_off_leaves_a_template_without_tools_as_it_was() -> None:
    view = Registry(builtin_tools()).only(["calculator"])
    on, off = Request("a", (), tool_prompt=True), Request("b", (), tool_prompt=False)

    def model(template: str | None = None) -> Any:
        return SimpleNamespace(tokenizer=tokenizer(template), context_length=8192)

    assert prompt_schemas(on, view, model())
    assert prompt_schemas(off, view, model()) is None
    assert prompt_schemas(off, view, model(TOOL_CHATML)), "a template with tools always gets them"
    assert prompt_schemas(on, None, model()) is None


def test_a_small_context_keeps_its_room(schemas: list[dict[str, Any]]) -> None:
    question = [{"role": "user", "content": "What is 2+2?"}]
    tok = tokenizer()
    small = build_prompt(tok, question, context=512, max_tokens=8, tools=schemas)
    assert small.ids == build_prompt(tok, question, context=512, max_tokens=8).ids, "no room for the tool prompt"
    large = build_prompt(tok, question, context=8192, max_tokens=8, tools=schemas)
    assert "<tool_call>" in tok.decode(large.ids)
    tooled = tokenizer(TOOL_CHATML)
    assert "Tools: calculator" in tooled.decode(build_prompt(tooled, question, 512, 8, tools=schemas).ids)
