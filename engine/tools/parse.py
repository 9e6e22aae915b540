"""Tool calls found in model output and in the user's slash lines.

:func:`parse_model_output` reads the formats common instruct models emit:

* Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number per turn (an unclosed last one, cut off by the token limit, too);
* a JSON list of calls ``[{"name": ..., "arguments": {...}}, ...]`` (also after
  Mistral's ``[TOOL_CALLS]``, or inside a fenced code block);
* Llama 3: ``<|python_tag|>`` followed by a JSON call (or several separated by
  ``;``) or a built-in call ``name.call(key="value")``, and a bare JSON object
  ``{"name": ..., "parameters": {...}}`` that is the whole reply.

:func:`parse_slash_lines` reads lines ``/NAME ARGS`` from the user, where ARGS
is a JSON object or plain text for the tool's text argument.

Nothing here raises on bad input: a malformed call is a :class:`Call` whose
``error`` says what is wrong, which the runner turns into an error result.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.tools.registry import Tool

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json|tool_call|tool_code)?\s*(.*?)\s*```$", re.DOTALL)
_SLASH = re.compile(r"^/([A-Za-z_][\w.-]*)(?:[ \t]+(.*))?$")
PYTHON_TAG = "<|python_tag|>"
_LLAMA_END = ("<|eom_id|>", "<|eot_id|>")


@dataclass(frozen=True)
class Call:
    """One requested call.  ``error`` non-empty: the call could not be read and will not run."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""
    raw: str = ""  # the text the call was read from


@dataclass(frozen=True)
class Parsed:
    """A reply split into its prose (``text``, the calls taken out) and its ``calls``, in order."""

    text: str
    calls: tuple[Call, ...] = ()


def _call_from(obj: object, raw: str) -> Call:
    if not isinstance(obj, Mapping):
        return Call(
            "", error=f"a tool call must be a JSON object with 'name' and 'arguments', not {raw[:80]!r}", raw=raw
        )
    if "function" in obj and isinstance(obj["function"], Mapping):  # OpenAI's {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return Call("", error=f"the tool call has no 'name': {raw[:80]!r}", raw=raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return Call(name, error=f"the arguments of {name!r} are not valid JSON: {args[:80]!r}", raw=raw)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return Call(name, error=f"the arguments of {name!r} must be a JSON object, not {args!r:.80}", raw=raw)
    return Call(name.strip(), dict(args), raw=raw)


def _calls_from_json(text: str) -> list[Call]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return [Call("", error=f"the tool call is not valid JSON ({exc.msg} at {exc.pos}): {text[:80]!r}", raw=text)]
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        return []
    return [_call_from(item, json.dumps(item) if len(items) > 1 else text) for item in items]


def _looks_like_call(obj: object) -> bool:
    if isinstance(obj, Mapping) and isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    return isinstance(obj, Mapping) and isinstance(obj.get("name"), str) and ("arguments" in obj or "parameters" in obj)


def _unfence(text: str) -> str:
    match = _FENCE.match(text.strip())
    return match.group(1) if match else text.strip()


def _python_call(code: str) -> Call:
    """Llama 3.1's built-in form ``brave_search.call(query="...")``."""
    try:
        node = ast.parse(code.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("not a call with named arguments")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "call" and isinstance(func.value, ast.Name):
            name = func.value.id
        elif isinstance(func, ast.Name):
            name = func.id
        else:
            raise ValueError("not a tool name")
        args = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
    except (SyntaxError, ValueError) as exc:
        return Call("", error=f"cannot read the tool call {code[:80]!r}: {exc}", raw=code)
    return Call(name, args, raw=code)


def _llama(body: str) -> list[Call]:
    for end in _LLAMA_END:
        body = body.replace(end, "")
    body = _unfence(body)
    if not body:
        return [Call("", error="<|python_tag|> was not followed by a tool call", raw=PYTHON_TAG)]
    if body.startswith(("{", "[")):
        try:
            json.loads(body)
        except json.JSONDecodeError:
            parts = [p.strip() for p in body.split(";") if p.strip()]  # "{...}; {...}"
            if len(parts) > 1:
                return [c for p in parts for c in _calls_from_json(p)]
        return _calls_from_json(body)
    return [_python_call(body)]


def parse_model_output(text: str) -> Parsed:
    """The calls in one model reply, in order, and the reply's text without them."""
    if "<tool_call>" in text:
        calls = [c for m in _HERMES.finditer(text) for c in _hermes_calls(m.group(0), m.group(1))]
        return Parsed(_HERMES.sub("", text).strip(), tuple(calls))
    if PYTHON_TAG in text:
        before, _, body = text.partition(PYTHON_TAG)
        return Parsed(before.strip(), tuple(_llama(body)))
    body = _unfence(text)
    if body.startswith("[TOOL_CALLS]"):
        return Parsed("", tuple(_calls_from_json(body.removeprefix("[TOOL_CALLS]").strip())))
    if body.startswith(("{", "[")):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return Parsed(text)  # prose that happens to start with a brace
        items = obj if isinstance(obj, list) else [obj]
        if items and all(_looks_like_call(item) for item in items):
            return Parsed("", tuple(_call_from(item, json.dumps(item)) for item in items))
    return Parsed(text)


def _hermes_calls(whole: str, body: str) -> list[Call]:
    if not whole.rstrip().endswith("</tool_call>"):
        if not body.strip():
            return [Call("", error="the reply ended inside an empty <tool_call>", raw=whole)]
        calls = _calls_from_json(_unfence(body))
        if calls and calls[0].error:
            return [Call(calls[0].name, error="the reply ended before </tool_call>: " + calls[0].error, raw=whole)]
        return calls
    if not body.strip():
        return [Call("", error="an empty <tool_call></tool_call>", raw=whole)]
    return _calls_from_json(_unfence(body))


def parse_slash_lines(text: str, lookup: Callable[[str], Tool | None] | Mapping[str, Tool]) -> Parsed:
    """The ``/NAME ARGS`` lines of a user's message as calls, and the message without them.

    ``lookup`` finds a tool by name (``registry.get``, or a dict) so plain-text
    ARGS can go to the tool's text argument.  Every ``/NAME`` line is a call,
    even of an unknown tool: running it gives an error result saying so.
    """
    find = lookup.get if isinstance(lookup, Mapping) else lookup
    calls: list[Call] = []
    kept: list[str] = []
    for line in text.splitlines():
        match = _SLASH.match(line.strip())
        if match is None:
            kept.append(line)
            continue
        name, args = match.group(1), (match.group(2) or "").strip()
        calls.append(_slash_call(name, args, find(name), line.strip()))
    return Parsed("\n".join(kept).strip(), tuple(calls))


def _slash_call(name: str, args: str, tool: Tool | None, raw: str) -> Call:
    if args.startswith("{"):
        try:
            obj = json.loads(args)
        except json.JSONDecodeError as exc:
            return Call(name, error=f"the arguments after /{name} are not valid JSON ({exc.msg})", raw=raw)
        return _call_from({"name": name, "arguments": obj}, raw)
    if tool is None:
        return Call(name, {"text": args} if args else {}, raw=raw)  # the runner reports the unknown tool
    key = tool.text_argument()
    if not args:
        return Call(name, {}, raw=raw)
    if key is None:
        return Call(name, error=f"/{name} takes a JSON object of its arguments, e.g. /{name} {{...}}", raw=raw)
    return Call(name, {key: args}, raw=raw)
