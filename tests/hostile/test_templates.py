"""Hostile chat templates in a model folder: each is refused at load, or its reply fails, with a message
naming the template's file, in bounded time and memory, and Brisk goes on; real templates render
byte for byte as transformers renders them.

In-process cases check the bounded renderer itself (``engine.model.template``) on many templates,
with the peak memory of the render measured; the command-line cases run the real ``brisk`` on a
tiny model folder whose template was replaced.
"""

from __future__ import annotations

import json
import shutil
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.model.source import ModelLoadError
from engine.model.template import TRIAL_TOOLS, ChatTemplateError, check_template, render_chat
from tests.hostile.conftest import Run
from tests.support.tiny import CHATML, make_tiny_model, make_tokenizer

HANG = 60  # seconds: a run past this would have hung a user (a bound on hangs, not a speed test)
PEAK_BYTES = 256 << 20  # a render may not allocate more than this at once (the defect took 6 GB)

HOSTILE = {
    "nested_range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "repeat_1gb": "{{ 'x' * 10**9 }}",
    "doubling_concat": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    "{{ ns.s }}",
    "doubling_plus": "{% set ns = namespace(s='xy') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list_of_big_strings": "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}"
    "{% set ns.l = ns.l + ['x' * 100000] %}{% endfor %}",
    "deep_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "exponential_macros": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "silent_macro_loops": "{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}{% endmacro %}{% set x = f() %}",
    "loop_over_characters": "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "center_width": "{{ 'x'.center(10**10) }}",
    "center_filter": "{{ 'x' | center(10**10) }}",
    "format_width": "{{ '%999999999d' % 1 }}",
    "format_method_width": "{{ '{:>999999999}'.format(1) }}",
    "replace_bomb": "{{ ('x' * 100000).replace('', 'yyyyyyyyyy' * 1000) }}",
    "join_bomb": "{{ ('y' * 100000).join(range(100000) | map('string')) }}",
    "nested_json": "{% set ns = namespace(x=[1]) %}{% for i in range(200) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
    "{{ ns.x | tojson(indent=4) }}",
    "int_power": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "raise_exception": "{{ raise_exception('This template refuses everything.') }}",
    "syntax_error": "{% for m in messages %}{{ m.content }",
    "huge_template": "{{ 'x' }}" * 200_000,
}
WORD = "detonate"  # the in-reply template blows up only when the newest message holds this word
ON_WORD = (
    "{% if '" + WORD + "' in messages[-1].content %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}" + CHATML
)

QWEN_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- "# Tools\\n\\nFunction signatures are inside <tools></tools>:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nCall one as <tool_call>{\\"name\\": ..., \\"arguments\\": ...}</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "system" and loop.first %}{%- continue %}{%- endif %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content | default('', true) %}
        {%- if message.reasoning_content is defined and loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' }}
        {%- endif %}
        {{- content.split('</think>')[-1].lstrip('\\n') }}
        {%- for tool_call in message.tool_calls | default([]) %}
            {%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
            {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}{{- tool_call.arguments }}
            {%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
LLAMA_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- 'Answer with JSON {"name": function name, "parameters": arguments}. The functions:\\n\\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message ~ "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception('Unknown role ' ~ message.role) }}
    {%- elif 'tool_calls' in message %}
        {%- if message.tool_calls | length != 1 %}{{- raise_exception("One tool call at a time.") }}{%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson(sort_keys=true) }}{{- "}<|eot_id|>" }}
    {%- elif message.role == "tool" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping %}{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim }}
        {{- '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 * (3 + 4)"}}}
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "  You are a pirate.\n\n"},
        {"role": "user", "content": "\n\n Café — naïve 日本語 😀\t"},
        {"role": "assistant", "content": "Arr! <b>bold</b> {{ not a template }} {% raw %}"},
        {"role": "user", "content": "and then?   "},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2 * (3 + 4)?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "\nMultiply.\n"},
        {"role": "tool", "content": "14"},
        {"role": "assistant", "content": "<think>done</think>\n\nIt is 14."},
        {"role": "user", "content": "Thanks."},
    ],
]

LONG = [{"role": "system", "content": "Be thorough. " * 400}] + [  # a long chat: the bounds scale with it
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "words and more words " * 500}
    for i in range(101)
]
CONVERSATIONS.append(LONG)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("templates") / "tiny")


def folder_with(base: Path, where: Path, template: str, field: bool = False) -> Path:
    """A copy of the model folder ``base`` at ``where`` whose chat template is ``template``
    (in ``chat_template.jinja``, or with ``field`` in ``tokenizer_config.json``'s chat_template)."""
    shutil.copytree(base, where)
    if field:
        (where / "chat_template.jinja").unlink()
        config = json.loads((where / "tokenizer_config.json").read_text())
        (where / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    else:
        (where / "chat_template.jinja").write_text(template)
    return where


def within_bound(work: Callable[[], object]) -> BaseException | None:
    """What ``work`` raised (None if nothing), run on a helper thread so that a hang fails the test."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001  # handed to the test
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG)
    if worker.is_alive():
        pytest.fail(f"still running after {HANG} s: a template hung the renderer")
    return raised[0]


def tokenizer_with(template: str) -> Any:
    tokenizer = make_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def bundled_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from engine.model.loader import bundled_model_path, converted_dir

    return AutoTokenizer.from_pretrained(converted_dir(bundled_model_path(), lambda _f, _m: None))


@pytest.mark.parametrize("template", ["bundled", "chatml", "qwen_style", "llama_style"])
def test_real_templates_render_byte_for_byte(template: str) -> None:
    templates = {"chatml": CHATML, "qwen_style": QWEN_STYLE, "llama_style": LLAMA_STYLE}
    tokenizer = bundled_tokenizer() if template == "bundled" else tokenizer_with(templates[template])
    check_template(tokenizer, template)  # real templates pass the trial at load
    rendered = 0
    for messages in CONVERSATIONS:
        for tools in (None, TRIAL_TOOLS):
            for prompt in (True, False):
                try:
                    theirs = tokenizer.apply_chat_template(
                        messages, tools=tools, add_generation_prompt=prompt, tokenize=False
                    )
                except Exception:  # a conversation this template does not take fails in ours too
                    with pytest.raises(ChatTemplateError):
                        render_chat(tokenizer, messages, prompt, tools)
                    continue
                assert render_chat(tokenizer, messages, prompt, tools).encode() == theirs.encode()
                rendered += 1
    assert rendered >= 6, "most conversations must render, or the comparison says little"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_stops_in_bounds(name: str) -> None:
    tokenizer = tokenizer_with(HOSTILE[name])
    where = f"/models/{name}/chat_template.jinja"
    tracemalloc.start()
    try:
        refused = within_bound(lambda: check_template(tokenizer, where))
        failed = within_bound(lambda: render_chat(tokenizer, CONVERSATIONS[1]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(refused, ModelLoadError) and "cannot be used" in str(refused), refused
    assert isinstance(failed, ChatTemplateError), failed
    assert peak < PEAK_BYTES, f"{name} allocated {peak / 1e6:.0f} MB"
    for message in (str(refused), str(failed)):
        assert f"The chat template ({where})" in message
        assert "pick another model" in message
    if name == "raise_exception":
        assert "This template refuses everything." in str(failed)


def test_template_that_fails_only_on_a_word_passes_load_and_fails_that_reply() -> None:
    tokenizer = tokenizer_with(ON_WORD)
    check_template(tokenizer, "/models/word/chat_template.jinja")  # the trial conversations hold no such word
    normal = [{"role": "user", "content": "hello"}]
    assert render_chat(tokenizer, normal) == tokenizer.apply_chat_template(
        normal, add_generation_prompt=True, tokenize=False
    )
    failed = within_bound(lambda: render_chat(tokenizer, [{"role": "user", "content": f"please {WORD} it"}]))
    assert isinstance(failed, ChatTemplateError), failed
    assert str(failed).startswith("The chat template (/models/word/chat_template.jinja) was stopped: it ")


def test_template_that_refuses_a_system_role_loads_and_says_so_in_that_reply() -> None:
    no_system = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    tokenizer = tokenizer_with(no_system + CHATML)
    check_template(tokenizer, "/models/gemma-like/chat_template.jinja")  # a plain question renders
    failed = within_bound(lambda: render_chat(tokenizer, CONVERSATIONS[1]))
    assert isinstance(failed, ChatTemplateError) and not failed.stopped
    assert "(/models/gemma-like/chat_template.jinja) failed: System role not supported." in str(failed)


def test_prompt_builder_fails_with_the_template_message() -> None:
    from engine.runtime.prompt import build_prompt

    tokenizer = tokenizer_with(HOSTILE["repeat_1gb"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    failed = within_bound(lambda: build_prompt(tokenizer, messages, 512, 16))
    assert isinstance(failed, ValueError) and "The chat template (" in str(failed), failed
    assert "system prompt" not in str(failed)  # the defect blamed the system prompt


@pytest.mark.parametrize(("name", "field"), [("nested_range", False), ("doubling_concat", False), ("repeat_1gb", True)])
def test_cli_refuses_the_model_at_load(
    name: str, field: bool, tiny_folder: Path, tmp_path: Path, data: Path, cli: Callable[..., Run]
) -> None:
    folder = folder_with(tiny_folder, tmp_path / "model", HOSTILE[name], field)
    run = cli("ask", "hi", "--model", str(folder), "--json", "--max-tokens", "4", data_dir=data, timeout=HANG)
    assert run.returncode != 0
    named = "tokenizer_config.json" if field else "chat_template.jinja"
    message = json.loads(run.stdout.splitlines()[-1])["message"]
    assert message.startswith("This model cannot be used: The chat template (") and str(folder / named) in message
    assert "Traceback" not in run.stderr
    (folder / "chat_template.jinja").write_text(CHATML)  # the user fixes the file: the next run works
    again = cli("ask", "hi", "--model", str(folder), "--json", "--max-tokens", "4", data_dir=data, timeout=HANG)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.splitlines()[-1])["type"] == "done"


def test_cli_reply_fails_then_the_next_is_answered(
    tiny_folder: Path, tmp_path: Path, data: Path, cli: Callable[..., Run]
) -> None:
    folder = folder_with(tiny_folder, tmp_path / "model", ON_WORD)
    lines = f"please {WORD} it\nhello there\n"
    run = cli("chat", "--model", str(folder), "--json", "--max-tokens", "4", data_dir=data, stdin=lines, timeout=HANG)
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    ends = [e for e in events if e["type"] in ("done", "error")]
    assert [e["type"] for e in ends] == ["error", "done"], run.stdout[-2000:] + run.stderr[-2000:]
    assert f"The chat template ({folder / 'chat_template.jinja'}) was stopped" in ends[0]["message"]
    assert ends[1]["text"] is not None
    assert "Traceback" not in run.stderr
