"""Brisk's own tool prompt, for chat templates that cannot carry tools.

Many chat templates (the bundled SmolLM2's among them) ignore the ``tools``
argument or drop tool turns (:mod:`engine.model.tool_template` probes which).
For such a template :func:`with_tool_prompt` puts the schemas and a call format
that :func:`engine.tools.parse.parse_model_output` reads into the system
message (a new one, or the first user message when the template has no system
role): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the
Hermes/Qwen format (SmolLM2's instruct data wrote its calls in these tags too),
whose JSON the engine's tool-call grammar (``engine.runtime.grammar``) keeps valid.
:func:`plain_tool_turns` writes earlier tool rounds as text in that format: the
assistant's calls in its own turn, the results as one user message per round
(:func:`result_text`, also what a user's ``/NAME`` lines leave in their message).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.tools.run import result_text


def _function(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = schema.get("function")
    return inner if isinstance(inner, Mapping) else schema


def _example(schemas: list[dict[str, Any]]) -> str:
    """A call of the first tool, with a placeholder for each of its required arguments."""
    tool = _function(schemas[0])
    parameters = tool.get("parameters") or {}
    properties = parameters.get("properties") or {}
    names = list(parameters.get("required") or properties)[:2]
    return json.dumps({"name": tool.get("name", ""), "arguments": {n: f"<{n}>" for n in names}})


def tool_instructions(schemas: list[dict[str, Any]]) -> str:
    """The system prompt text that gives a model without a tool template the tools and how to call them."""
    tools = [
        {"name": f.get("name", ""), "description": f.get("description", ""), "parameters": f.get("parameters", {})}
        for f in map(_function, schemas)
    ]
    return (
        "You have access to the following tools:\n"
        f"<tools>{json.dumps(tools, ensure_ascii=False)}</tools>\n\n"
        "To call a tool, reply with only the call, in this format, and nothing else:\n"
        f"<tool_call>{_example(schemas)}</tool_call>\n"
        "The results come back in the next message, starting with 'Tool result'. "
        "If no tool is needed, answer directly."
    )


def with_tool_prompt(
    messages: list[dict[str, Any]], schemas: list[dict[str, Any]], system_role: bool
) -> list[dict[str, Any]]:
    """``messages`` with :func:`tool_instructions` after the system message's text (a new system message
    when there is none; the start of the first user message when the template takes no system role)."""
    text = tool_instructions(schemas)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        content = str(first.get("content") or "")
        return [{**first, "content": f"{content}\n\n{text}" if content else text}, *messages[1:]]
    if system_role:
        return [{"role": "system", "content": text}, *messages]
    at = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if at is None:
        return messages
    first = messages[at]
    return [*messages[:at], {**first, "content": f"{text}\n\n{first.get('content') or ''}"}, *messages[at + 1 :]]


def _arguments(fn: Mapping[str, Any]) -> Any:
    """A call's arguments, those an OpenAI client sent as JSON text read back (text that is not JSON as it is)."""
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return args
    return args


def call_text(calls: list[Mapping[str, Any]]) -> str:
    """An assistant's tool calls (OpenAI shape) in Brisk's call format."""
    out = []
    for call in calls:
        fn = _function(call)
        out.append({"name": fn.get("name", ""), "arguments": _arguments(fn)})
    return "\n".join(f"<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>" for call in out)


def has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def plain_tool_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each assistant's tool calls written into its text (Brisk's call format) and each run
    of ``tool`` messages as one user message of :func:`result_text` parts (a result finds its call by its
    ``tool_call_id``, else in call order)."""
    out: list[dict[str, Any]] = []
    by_id: dict[str, tuple[str, Any]] = {}
    pending: list[tuple[str, Any]] = []  # the last assistant turn's calls not yet answered, in order
    results: list[str] = []
    for message in messages:
        if message.get("role") == "tool":
            call = by_id.get(str(message.get("tool_call_id") or ""))
            if call is None and pending:
                call = pending[0]
            if call in pending:
                pending.remove(call)
            name = str(message.get("name") or (call[0] if call else "") or "tool")
            content = str(message.get("content") or "(no output)")
            failed = content.startswith("error: ")
            results.append(result_text(name, call[1] if call else None, content.removeprefix("error: "), not failed))
            continue
        if results:
            out.append({"role": "user", "content": "\n\n".join(results)})
            results = []
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            pending = []
            for call_message in calls:
                fn = _function(call_message)
                entry = (str(fn.get("name", "")), _arguments(fn))
                if call_message.get("id"):
                    by_id[str(call_message["id"])] = entry
                pending.append(entry)
            content = str(message.get("content") or "").strip()
            text = call_text(list(calls))
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
            continue
        out.append({k: v for k, v in message.items() if k != "tool_calls"})
    if results:
        out.append({"role": "user", "content": "\n\n".join(results)})
    return out
