"""Parsers of tool calls: model output (Hermes/Qwen, JSON lists, Llama 3) and the user's slash lines."""

from __future__ import annotations

from engine.tools import Call, builtin_tools, parse_model_output, parse_slash_lines


def test_hermes_several_calls_and_the_prose_around_them() -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>\n'
        '<tool_call>{"name": "clock", "arguments": "{\\"zone\\": \\"Asia/Tokyo\\"}"}</tool_call>'
    )
    parsed = parse_model_output(text)
    assert parsed.text == "Let me check."
    assert [(c.name, dict(c.arguments), c.error) for c in parsed.calls] == [
        ("calculator", {"expression": "2*3"}, ""),
        ("clock", {"zone": "Asia/Tokyo"}, ""),
    ]


def test_hermes_malformed_calls_become_errors() -> None:
    parsed = parse_model_output(
        '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
        "<tool_call>[1, 2]</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "x", "arguments": 5}</tool_call>'
        '<tool_call>{"name": "units", "arguments": {"quantity": "3 m'
    )
    assert len(parsed.calls) == 6  # the list [1, 2] is two (bad) calls
    assert all(c.error for c in parsed.calls)
    assert "not valid JSON" in parsed.calls[0].error
    assert "must be a JSON object" in parsed.calls[1].error
    assert "no 'name'" in parsed.calls[3].error
    assert "must be a JSON object" in parsed.calls[4].error
    assert "ended before </tool_call>" in parsed.calls[5].error


def test_json_list_of_calls_fenced_or_not() -> None:
    body = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "parameters": {}}]'
    for text in (body, f"```json\n{body}\n```", f"[TOOL_CALLS] {body}"):
        parsed = parse_model_output(text)
        assert [(c.name, dict(c.arguments)) for c in parsed.calls] == [("a", {"x": 1}), ("b", {})], text
        assert parsed.text == ""
    openai = parse_model_output('[{"type": "function", "function": {"name": "a", "arguments": "{\\"x\\": 2}"}}]')
    assert openai.calls == (Call("a", {"x": 2}, raw=openai.calls[0].raw),)


def test_llama3_python_tag_and_bare_json() -> None:
    tagged = parse_model_output('<|python_tag|>{"name": "clock", "parameters": {"zone": "UTC"}}<|eom_id|>')
    assert [(c.name, dict(c.arguments)) for c in tagged.calls] == [("clock", {"zone": "UTC"})]
    two = parse_model_output('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}')
    assert [c.name for c in two.calls] == ["a", "b"]
    builtin = parse_model_output('<|python_tag|>brave_search.call(query="weather in Paris")')
    assert [(c.name, dict(c.arguments)) for c in builtin.calls] == [("brave_search", {"query": "weather in Paris"})]
    bare = parse_model_output('{"name": "units", "parameters": {"quantity": "3 mi to km"}}')
    assert [(c.name, dict(c.arguments)) for c in bare.calls] == [("units", {"quantity": "3 mi to km"})]


def test_llama3_malformed_and_plain_prose() -> None:
    assert parse_model_output("<|python_tag|>").calls[0].error
    assert parse_model_output('<|python_tag|>{"name": "a", "parameters": {').calls[0].error
    assert parse_model_output("<|python_tag|>import os; os.system('x')").calls[0].error
    for prose in ("The answer is 42.", '{"answer": 42}', "{not json at all", "[1, 2, 3]", ""):
        parsed = parse_model_output(prose)
        assert parsed.calls == () and parsed.text == prose


def test_slash_lines_plain_text_json_and_errors() -> None:
    tools = {t.name: t for t in builtin_tools()}
    parsed = parse_slash_lines(
        "Tell me about these.\n/calculator 2*(3+4)\n/clock Asia/Tokyo\n"
        '/units {"quantity": "3 mi", "to": "km"}\n/clock\n/nosuch thing\n/units {broken\n'
        "a /line in the middle stays\n/etc/hosts is a path",
        tools,
    )
    assert parsed.text == "Tell me about these.\na /line in the middle stays\n/etc/hosts is a path"
    calls = parsed.calls
    assert [(c.name, dict(c.arguments), bool(c.error)) for c in calls[:5]] == [
        ("calculator", {"expression": "2*(3+4)"}, False),
        ("clock", {"zone": "Asia/Tokyo"}, False),
        ("units", {"quantity": "3 mi", "to": "km"}, False),
        ("clock", {}, False),
        ("nosuch", {"text": "thing"}, False),  # the runner reports the unknown tool
    ]
    assert "not valid JSON" in calls[5].error
    assert len(calls) == 6
