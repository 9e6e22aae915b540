"""OpenAI's request and response shapes, read into Brisk's and written back: no I/O, no torch.

:func:`chat_request` / :func:`completion_request` read a parsed JSON body into an
:class:`~engine.api.Request` and the :class:`Reply` options the server needs to
answer (stream, usage in the stream, n); anything Brisk cannot honour is an
:class:`ApiError` (a 400 with the field named in ``param``), never silently
ignored: a field outside the endpoint's list (``CHAT_FIELDS``,
``COMPLETION_FIELDS``, ``EMBEDDING_FIELDS``) is a 400 that names it
(:func:`checked_fields`), except the few in :data:`HABITS`, which clients send
by habit and which change nothing in a reply Brisk can give: those are taken
and named back in the answer's ``X-Brisk-Ignored`` header (``Reply.ignored``).
A field sent as ``null`` counts as left out.  A field left out takes the window's value (``Settings``: greedy,
repetition penalty 1.1, stop on a repeated block), so a client and the window
get the same replies.  :func:`chat_response`, :func:`chat_chunk`,
:func:`completion_response` and :func:`usage` build the answers from a ``Done``'s
fields, and :func:`chat_logprobs` / :func:`completion_logprobs` a reply's ``logprobs`` from its
``Token.logprobs``; :func:`brisk_figures` is Brisk's own timings in the one extra field
``brisk``, with the reply's time phase by phase (:func:`phases`: queue, prompt, cache lookup,
prefill, decode, drafting).  The field names follow the ``openai`` SDK's types
(``openai.types.chat.ChatCompletion``, ``ChatCompletionChunk``,
``openai.types.Completion``, ``CreateEmbeddingResponse``).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.api import MAX_TOP_LOGPROBS, Logprob, Metrics, Request, Sampling, Token, reply_format

ROLES = ("system", "developer", "user", "assistant", "tool")
# finish reasons Brisk gives, as OpenAI's clients know them
FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop", "repetition": "stop"}
MAX_STOP = 4  # OpenAI's own limit on stop sequences
MAX_BIAS = 300  # OpenAI's own limit on logit_bias entries
MAX_N = 8  # choices per request: siblings decoded together, each a request of its own (engine.server.app)
CHARS_PER_TOKEN = 32  # more than any tokenizer's tokens average: a prompt over context x this cannot fit

# Fields that the openai SDK, LangChain, litellm and agents send by habit and that change nothing in a reply
# Brisk can give (who the end user is, tags and storage at OpenAI, a latency tier, a cache key, the effort of
# a reasoning model, whether several tool calls may come at once): taken, and named in X-Brisk-Ignored.
HABITS = frozenset(
    {
        "user",
        "safety_identifier",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "parallel_tool_calls",
        "reasoning_effort",
    }
)
# what sampling_from reads, each honoured (n: checked here, the siblings are the app's; see Reply.n)
SAMPLING_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "repeat_penalty",  # llama.cpp's name for it (Brisk's own remote backend sends both)
        "seed",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "response_format",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
    }
)
# llama-server's, on its OpenAI paths too: prompt_progress chunks before the first token, timings on every
# chunk (engine.server.live)
LIVE_FIELDS = ("return_progress", "timings_per_token")
# llama-server's on its chat path: a constraint as on /completion (``json_schema``, ``grammar``: GBNF or
# Lark, read by grammar_format) and ``verbose`` (the prompt as rendered, under ``__verbose``)
LLAMA_CHAT_FIELDS = ("json_schema", "grammar", "verbose")
# llama-server's slot to run on: Brisk has no slots to pin (its batch takes every request), so like HABITS
# it changes nothing in the reply; taken on chat and named in X-Brisk-Ignored
CHAT_HABITS = HABITS | {"id_slot"}
CHAT_FIELDS = SAMPLING_FIELDS | {
    "model",
    "messages",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "chat_template_kwargs",  # llama.cpp's and vLLM's: {"enable_thinking": bool} is the template's switch
    "reasoning_format",  # llama.cpp's: "none" keeps the thinking in content; else it is reasoning_content
    *LIVE_FIELDS,
    *LLAMA_CHAT_FIELDS,
}
REASONING_FORMATS = ("auto", "deepseek", "none")
COMPLETION_FIELDS = (SAMPLING_FIELDS - {"response_format", "max_completion_tokens", "top_logprobs"}) | {
    "model",
    "prompt",
    "stream",
    "stream_options",
    "echo",
    "suffix",
    "best_of",
    *LIVE_FIELDS,
}
EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions"})


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def kind(self) -> str:
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
            503: "server_error",
        }.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


@dataclass(frozen=True)
class Reply:
    """How to answer one request, beside the engine's ``Request``."""

    model: str
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage and no choices
    tools: bool = False  # the client sent tools: tool calls come back as ``tool_calls``
    echo: bool = False  # /v1/completions: the prompt before the completion
    n: int = 1  # choices: siblings of the request, seeds seed + i when it has one (siblings())
    ignored: tuple[str, ...] = ()  # fields of HABITS the request sent: the answer's X-Brisk-Ignored header
    # a thinking model's thinking: apart as ``reasoning_content`` (llama.cpp's and vLLM's field), or (False:
    # reasoning_format "none") left in ``content`` inside <think>...</think> as the model wrote it
    reasoning_apart: bool = True
    progress: bool = False  # return_progress: streamed prompt_progress chunks before the first token
    per_token: bool = False  # timings_per_token: llama.cpp's timings on every chunk (and the whole answer)
    verbose: bool = False  # llama-server's ``verbose``: the prompt as rendered under ``__verbose`` (chat)
    prompt_text: str = ""  # that prompt, filled in by the server (engine.server.app) when ``verbose``


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# -- reading requests --------------------------------------------------------------------------------------


def checked_fields(
    body: Mapping[str, Any], known: frozenset[str], endpoint: str, habits: frozenset[str] = HABITS
) -> tuple[str, ...]:
    """The fields of ``habits`` that ``body`` sends (to say in ``X-Brisk-Ignored``); a 400 naming every
    field that is neither ``known`` nor a habit, since taking it would silently ignore what it asks."""
    sent = [name for name, value in body.items() if value is not None]
    unknown = [name for name in sent if name not in known and name not in habits]
    if unknown:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise bad(
            f"{names} {'is' if len(unknown) == 1 else 'are'} not supported by {endpoint} on this server (Brisk "
            "would ignore it, and the reply would not do what it asks); leave it out. Supported: "
            f"{', '.join(sorted(known))}.",
            unknown[0],
            "unsupported_parameter",
        )
    return tuple(sorted(name for name in sent if name in habits))


def number(body: Mapping[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"'{name}' must be a number, not {value!r}.", name, "invalid_type")
    if not low <= value <= high:
        raise bad(f"'{name}' must be from {low:g} to {high:g}, not {value!r}.", name)
    return float(value)


def whole(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be a whole number, not {value!r}.", name, "invalid_type")
    if not low <= value <= high:
        raise bad(f"'{name}' must be from {low} to {high}, not {value!r}.", name)
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("'stop' must be a text or a list of non-empty texts.", "stop", "invalid_type")
    if len(stops) > MAX_STOP:
        raise bad(f"'stop' takes at most {MAX_STOP} sequences, not {len(stops)}.", "stop")
    return tuple(stops)


def sampling_from(body: Mapping[str, Any], defaults: Sampling, context: int, chat: bool = True) -> Sampling:
    """The request's sampling; a field left out keeps ``defaults`` (the window's settings).  ``chat``: OpenAI's
    chat ``logprobs`` (a flag, with ``top_logprobs``), else the legacy completions' (a count)."""
    n = whole(body, "n", 1, 128)
    if n is not None and n > MAX_N:
        raise bad(f"'n' must be at most {MAX_N} here; send several requests (they are served together).", "n")
    limit = whole(body, "max_completion_tokens", 1, 1 << 30)
    if limit is None:
        limit = whole(body, "max_tokens", 1, 1 << 30)
    if limit is not None and context and limit > context:
        raise bad(f"'max_tokens' {limit} is more than the model's context of {context} tokens.", "max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f"'seed' must be a whole number, not {seed!r}.", "seed", "invalid_type")
    return replace(
        defaults,
        temperature=number(body, "temperature", 0.0, 2.0, defaults.temperature),
        top_p=number(body, "top_p", 0.0, 1.0, defaults.top_p) or defaults.top_p,
        top_k=int(whole(body, "top_k", 0, 1 << 20) or defaults.top_k),
        repetition_penalty=number(body, _penalty_name(body), 0.01, 10.0, defaults.repetition_penalty),
        seed=None if seed is None else seed % 2**63,
        max_tokens=limit if limit is not None else defaults.max_tokens,
        stop=_stop(body),
        format=_format(body.get("response_format")),
        logit_bias=bias_from(body.get("logit_bias")),
        presence_penalty=number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        **_logprobs(body, chat),
    )


def bias_from(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (``{"token id": bias}``, -100 to 100) as ``Sampling.logit_bias``."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise bad("'logit_bias' must be an object of token ids to biases.", "logit_bias", "invalid_type")
    if len(value) > MAX_BIAS:
        raise bad(f"'logit_bias' takes at most {MAX_BIAS} tokens, not {len(value)}.", "logit_bias")
    out = []
    for key, bias in value.items():
        token = str(key).strip()
        if not token.isdigit():
            raise bad(f"'logit_bias' keys must be token ids (whole numbers), not {key!r}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
            raise bad(f"'logit_bias' values must be numbers, not {bias!r}.", "logit_bias", "invalid_type")
        if not -100 <= bias <= 100:
            raise bad(f"'logit_bias' values must be from -100 to 100, not {bias!r}.", "logit_bias")
        out.append((int(token), float(bias)))
    return tuple(sorted(out))


def _logprobs(body: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` (chat: a flag and a count; legacy completions: one count)."""
    top = None if chat else whole(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    if not chat:
        return {"logprobs": top is not None, "top_logprobs": top or 0}
    wanted = _flag(body, "logprobs")
    top = whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise bad("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    return {"logprobs": wanted, "top_logprobs": top or 0}


def _penalty_name(body: Mapping[str, Any]) -> str:
    """Which name the request gives Brisk's repetition penalty: OpenAI servers' or llama.cpp's."""
    return "repetition_penalty" if body.get("repetition_penalty") is not None else "repeat_penalty"


def usable(format_json: str, param: str) -> None:
    """A reply format the grammar library refuses is a 400 in its words, before the request reaches the engine."""
    if not format_json:
        return
    from engine.runtime.grammar import format_problems

    problems = format_problems(format_json)
    if problems:
        raise bad(problems[0], param, "invalid_format")


def grammar_format(body: Mapping[str, Any]) -> str:
    """llama.cpp's ``json_schema`` or ``grammar`` (GBNF, or llguidance's Lark) as a ``Sampling.format``,
    checked; "" when the body sends neither (``/completion`` and llama-server's chat path take both)."""
    schema, grammar = body.get("json_schema"), body.get("grammar") or None
    if schema is not None and grammar is not None:
        raise bad("Send 'json_schema' or 'grammar', not both.", "grammar")
    if schema is not None:
        if not isinstance(schema, Mapping):
            raise bad("'json_schema' must be a JSON schema object.", "json_schema", "invalid_type")
        format_json = reply_format("json_schema", dict(schema)) if schema else reply_format("json_object")
        usable(format_json, "json_schema")
        return format_json
    if grammar is None:
        return ""
    if not isinstance(grammar, str):
        raise bad("'grammar' must be the grammar's text (GBNF or Lark).", "grammar", "invalid_type")
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(grammar)
    except Exception as exc:  # the converter raises its own error types for a grammar it cannot read
        raise bad(f"'grammar' could not be read as GBNF or Lark ({short(exc)}).", "grammar") from None
    format_json = reply_format("lark", lark)
    usable(format_json, "grammar")
    return format_json


def short(exc: Exception) -> str:
    """An exception's first line, at most 200 characters: for a 400's message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _format(value: Any) -> str:
    """OpenAI's ``response_format`` as a ``Sampling.format``."""
    if value is None:
        return ""
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise bad("'response_format' must be an object with a 'type'.", "response_format", "invalid_type")
    kind = value["type"]
    if kind == "text":
        return ""
    if kind == "json_object":
        return reply_format("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise bad("'response_format.json_schema.schema' must be a JSON schema object.", "response_format")
        return reply_format("json_schema", dict(schema))
    raise bad(f"'response_format.type' must be text, json_object or json_schema, not {kind!r}.", "response_format")


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (joined); other parts are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad(f"{where}: only text parts are supported, not {kind!r}.", where, "unsupported_content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}.content must be a text or a list of text parts.", where, "invalid_type")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls`` (arguments as JSON text) in the chat template's shape (a dict)."""
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls must be a list.", where, "invalid_type")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad(f"{where}.tool_calls: each call needs a function with a name.", where)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise bad(f"{where}.tool_calls: arguments are not JSON ({exc.msg}).", where) from None
        out.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def messages_from(value: Any) -> tuple[dict[str, Any], ...]:
    """OpenAI chat messages as Brisk's (text content; ``developer`` is a system turn; tool turns kept)."""
    if not isinstance(value, list) or not value:
        raise bad("'messages' must be a non-empty list.", "messages", "invalid_type")
    names: dict[str, str] = {}  # tool_call_id -> function name, for the tool turns that answer them
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad(f"{where} must be an object.", where, "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}, not {role!r}.", where)
        turn: dict[str, Any] = {"role": "system" if role == "developer" else role}
        turn["content"] = _text(message.get("content"), where)
        if role == "assistant" and message.get("tool_calls"):
            turn["tool_calls"] = _tool_calls(message["tool_calls"], where)
            for call, raw in zip(turn["tool_calls"], message["tool_calls"], strict=True):
                if isinstance(raw.get("id"), str):
                    names[raw["id"]] = call["function"]["name"]
        if role == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id")), "")
            if name:
                turn["name"] = name
        out.append(turn)
    if not out[-1]["content"].strip():
        raise bad("The last message is empty.", f"messages[{len(out) - 1}]")
    return tuple(out)


def tools_from(body: Mapping[str, Any]) -> tuple[tuple[dict[str, Any], ...], str]:
    """The client's tools, and the reply format ``tool_choice`` asks for ("" free; a call forced otherwise)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("'tools' must be a list.", "tools", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(function, Mapping):
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}.", f"tools[{i}]")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"tools[{i}].function.name must be a non-empty text.", f"tools[{i}]")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise bad(f"tools[{i}].function.parameters must be a JSON schema object.", f"tools[{i}]")
        entry: dict[str, Any] = {
            "name": name,
            "description": str(function.get("description") or ""),
            "parameters": dict(parameters),
        }
        out.append({"type": "function", "function": entry})
    _bounded_tools(out)
    choice = body.get("tool_choice", "auto" if out else "none")
    if choice == "none":
        return (), ""
    if not out:
        raise bad("'tool_choice' needs 'tools'.", "tool_choice")
    if choice == "auto":
        return tuple(out), ""
    names = [t["function"]["name"] for t in out]
    if choice == "required":
        forced = names
    elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        wanted = choice["function"].get("name")
        if wanted not in names:
            raise bad(f"'tool_choice' names {wanted!r}, which is not in 'tools' ({', '.join(names)}).", "tool_choice")
        forced = [wanted]
    else:
        raise bad("'tool_choice' must be none, auto, required or {'type': 'function', ...}.", "tool_choice")
    return tuple(out), forced_call_format([t for t in out if t["function"]["name"] in forced])


def _bounded_tools(tools: list[dict[str, Any]]) -> None:
    """Each tool's schema within the reply-format bounds (``engine.runtime.format_limits``), else a 400: a
    call the model opens is compiled under them, and past them the grammar library can end the process."""
    if not tools:
        return
    from engine.runtime.format_limits import FormatError, check_grammar, check_schema, check_size
    from engine.runtime.grammar import tool_call_grammar

    try:
        for i, tool in enumerate(tools):
            check_schema(tool["function"]["parameters"], f"tools[{i}].function.parameters")
        grammar = tool_call_grammar(tools)
        check_size(grammar, "The tools' schemas together")
        check_grammar(grammar)
    except FormatError as exc:
        raise bad(str(exc), "tools", "invalid_format") from None


def forced_call_format(tools: list[dict[str, Any]]) -> str:
    """A ``Sampling.format`` whose only replies are one Hermes tool call of one of ``tools``: the reply
    opens ``<tool_call>``, writes ``{"name": ..., "arguments": ...}`` under that tool's schema (the grammar
    a call the model opens by itself is decoded under), and closes it."""
    from engine.runtime.grammar import OPEN_CALL, tool_call_grammar

    grammar = tool_call_grammar(tools)
    assert grammar.startswith("start: ")
    return reply_format("lark", f'start: "{OPEN_CALL}" ' + grammar.removeprefix("start: "))


def chat_request(
    body: Mapping[str, Any], model: str, defaults: Sampling, context: int, speculative: str
) -> tuple[Request, Reply]:
    """A ``/v1/chat/completions`` body as Brisk's request and how to answer it."""
    ignored = checked_fields(body, CHAT_FIELDS, "/v1/chat/completions", CHAT_HABITS)
    messages = messages_from(body.get("messages"))
    if len(messages) > 1 and messages[-1]["role"] == messages[-2]["role"] == "assistant":
        where = f"messages[{len(messages) - 1}]"  # llama-server's refusal too: which one would the reply go on?
        raise bad(f"{where}: two assistant messages end the list; the reply may continue one at most.", where)
    within_context(len(messages), sum(len(m["content"]) for m in messages), context, "messages")
    tools, forced = tools_from(body)
    sampling = sampling_from(body, defaults, context)
    constraint = grammar_format(body)
    if constraint:
        if sampling.format:
            raise bad("Send 'response_format' or llama.cpp's 'json_schema' / 'grammar', not both.", "grammar")
        sampling = replace(sampling, format=constraint)
    if forced:
        if sampling.format:
            raise bad("'tool_choice' that forces a call cannot go with 'response_format'.", "tool_choice")
        sampling = replace(sampling, format=forced)
    usable(sampling.format, "tools" if forced else "response_format")
    stream, include_usage = _streaming(body)
    request = Request(
        new_id("srv"),
        messages,
        sampling,
        speculative=speculative,
        client_tools=tools,
        # a cached answer keeps no logprobs, and reads no prompt whose progress return_progress would show
        answer_cache=not sampling.logprobs and not _flag(body, "return_progress"),
        origin="server",
        thinking=thinking_switch(body),
    )
    apart = reasoning_apart(body)
    reply = Reply(
        model,
        stream,
        include_usage,
        bool(tools),
        ignored=ignored,
        n=_n(body),
        reasoning_apart=apart,
        verbose=_flag(body, "verbose"),
    )
    return request, live_options(reply, body)


def live_options(reply: Reply, body: Mapping[str, Any]) -> Reply:
    """``reply`` with llama-server's ``return_progress`` and ``timings_per_token`` as the body sends them."""
    return replace(reply, progress=_flag(body, "return_progress"), per_token=_flag(body, "timings_per_token"))


def thinking_switch(body: Mapping[str, Any]) -> str:
    """``chat_template_kwargs.enable_thinking`` as ``Request.thinking``: "on", "off", or "auto" when not sent."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return "auto"
    if not isinstance(kwargs, Mapping):
        field = "chat_template_kwargs"
        raise bad(f"'{field}' must be an object, e.g. {{\"enable_thinking\": false}}.", field)
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise bad(
            f"'chat_template_kwargs' may hold only 'enable_thinking' here, not {unknown[0]!r}.", "chat_template_kwargs"
        )
    value = kwargs.get("enable_thinking")
    if value is None:
        return "auto"
    if not isinstance(value, bool):
        raise bad("'chat_template_kwargs.enable_thinking' must be true or false.", "chat_template_kwargs")
    return "on" if value else "off"


def reasoning_apart(body: Mapping[str, Any]) -> bool:
    """Whether the thinking goes out as ``reasoning_content`` (``reasoning_format`` other than "none")."""
    value = body.get("reasoning_format")
    if value is None:
        return True
    if value not in REASONING_FORMATS:
        allowed = ", ".join(REASONING_FORMATS)
        raise bad(f"'reasoning_format' must be one of {allowed}, not {value!r}.", "reasoning_format")
    return value != "none"


def completion_request(
    body: Mapping[str, Any], model: str, defaults: Sampling, context: int, speculative: str
) -> tuple[Request, Reply]:
    """A ``/v1/completions`` body: the prompt as it is, no chat template."""
    ignored = checked_fields(body, COMPLETION_FIELDS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("'prompt' must be one text (token lists and batches are not supported).", "prompt")
    if not prompt:
        raise bad("'prompt' is empty.", "prompt")
    within_context(1, len(prompt), context, "prompt")
    if body.get("suffix"):
        raise bad("'suffix' is not supported by this server.", "suffix", "unsupported_value")
    if body.get("best_of") not in (None, 1):
        raise bad("'best_of' must be 1 here.", "best_of")
    sampling = sampling_from(body, defaults, context, chat=False)
    if sampling.logprobs and _flag(body, "echo"):
        raise bad("'echo' with 'logprobs' would need the prompt's logprobs, which Brisk does not give.", "echo")
    stream, include_usage = _streaming(body)
    request = Request(
        new_id("srv"),
        ({"role": "user", "content": prompt},),
        sampling,
        speculative=speculative,
        raw=True,
        answer_cache=not sampling.logprobs,  # a cached answer keeps no logprobs
        origin="server",
    )
    reply = Reply(model, stream, include_usage, echo=_flag(body, "echo"), ignored=ignored, n=_n(body))
    return request, live_options(reply, body)


def _n(body: Mapping[str, Any]) -> int:
    return whole(body, "n", 1, MAX_N) or 1


def siblings(request: Request, n: int) -> list[Request]:
    """``request`` and ``n - 1`` copies of it, each an id of its own; with a seed, the i-th draws with seed + i
    (so each choice equals the request sent alone with that seed)."""
    seed = request.sampling.seed
    return [request] + [
        replace(
            request,
            id=new_id("srv"),
            sampling=replace(request.sampling, seed=None if seed is None else (seed + i) % 2**63),
        )
        for i in range(1, n)
    ]


def within_context(count: int, chars: int, context: int, param: str) -> None:
    """Refuse a prompt far over the model's context before any of it is rendered or tokenized.

    The engine fits a long conversation by dropping its oldest turns and cutting the last one, but it
    must render and tokenize the whole first: a 7 MB prompt held it for minutes.  No message takes
    less than one token and no tokenizer's tokens average ``CHARS_PER_TOKEN`` characters, so a prompt
    past either bound could never fit; one within them is fitted by the engine as before."""
    if not context:
        return
    if count > context:
        raise bad(
            f"'{param}' holds {count:,} messages, more than the model's context of {context:,} tokens can hold "
            "(each takes at least one token); send the recent ones only.",
            param,
            "context_length_exceeded",
        )
    if chars > context * CHARS_PER_TOKEN:
        what = "The prompt" if param == "prompt" else "The messages"
        raise bad(
            f"{what} hold{'s' if param == 'prompt' else ''} {chars:,} characters, far more than the model's "
            f"context of {context:,} tokens can read (at most about {context * CHARS_PER_TOKEN:,}); shorten it.",
            param,
            "context_length_exceeded",
        )


def _streaming(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """``stream``, and whether ``stream_options.include_usage`` asks for a last chunk with the usage."""
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise bad("'stream_options' must be an object.", "stream_options", "invalid_type")
    return stream, bool(stream and options and options.get("include_usage"))


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is not None and not isinstance(value, bool):
        raise bad(f"'{name}' must be true or false, not {value!r}.", name, "invalid_type")
    return bool(value)


# -- writing answers ----------------------------------------------------------------------------------------


def usage(metrics: Metrics) -> dict[str, Any]:
    return {
        "prompt_tokens": metrics.prompt_tokens,
        "completion_tokens": metrics.completion_tokens,
        "total_tokens": metrics.prompt_tokens + metrics.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens},
    }


def usage_of(metrics: list[Metrics]) -> dict[str, Any]:
    """The ``usage`` of ``n`` sibling replies to one prompt: the prompt once (the first's), every completion."""
    return summed(usage(m) for m in metrics)


def summed(usages: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sibling ``usage`` objects as one: the first's prompt, the completions added up."""
    items = list(usages)
    first = dict(items[0])
    first["completion_tokens"] = sum(u["completion_tokens"] for u in items)
    first["total_tokens"] = first["prompt_tokens"] + first["completion_tokens"]
    return first


def brisk_figures(metrics: Metrics) -> dict[str, Any]:
    """Brisk's own timings of one reply, in the answer's extra ``brisk`` field: the headline figures (seconds)
    and ``phases``, the reply's time phase by phase (:func:`phases`)."""
    return {
        "ttft_s": metrics.ttft_s,
        "tpot_s": metrics.tpot_s,
        "tokens_per_s": metrics.tokens_per_s,
        "queue_s": metrics.queue_s,
        "prefill_s": metrics.prefill_s,
        "total_s": metrics.total_s,
        "cached_tokens": metrics.cached_tokens,
        "drafted": metrics.drafted,
        "accepted": metrics.accepted,
        "forced": metrics.forced,
        "answer_cache": metrics.answer_cache,
        "phases": phases(metrics),
    }


def phases(m: Metrics) -> dict[str, Any]:
    """One reply's time, phase by phase, as the engine measured it (``engine.api.Metrics``), in milliseconds;
    a phase that did not run (an answer-cache hit has no prefill) has ``ms`` null.

    ``queue``: submission to the engine taking the request; ``prompt``: the chat template and tokenizing;
    ``cache_lookup``: finding the longest cached prefix (``cached_tokens`` of the prompt) and copying it;
    ``prefill``: computing the other ``computed_tokens`` (the chunks' own time: the batch's other requests
    step between chunks); ``decode``: the first token to the last (``tokens`` in all, ``tokens_per_s`` after
    the first, ``tpot_ms`` and its p50/p95); ``drafting``: speculative drafts (``drafted``, ``accepted``,
    ``acceptance``, per ``sources``) and ``forced`` tokens a format allowed alone.  ``ttft_ms`` and
    ``total_ms`` count from submission, so ``prefill.ms + decode.ms <= total_ms``.  With a thinking model,
    ``thinking`` is the first token to the thinking's end, inside ``decode``."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000

    computed = m.computed_tokens
    out: dict[str, Any] = {
        "queue": {"ms": ms(m.queue_s)},
        "prompt": {"ms": ms(m.prompt_s), "tokens": m.prompt_tokens, "truncated": m.truncated},
        "cache_lookup": {"ms": ms(m.lookup_s), "cached_tokens": m.cached_tokens},
        "prefill": {
            "ms": ms(m.prefill_s),
            "computed_tokens": computed,
            "cached_tokens": m.cached_tokens,
            "tokens_per_s": computed / m.prefill_s if computed and m.prefill_s else None,
        },
        "decode": {
            "ms": ms(m.decode_s),
            "tokens": m.completion_tokens,
            "tokens_per_s": m.tokens_per_s,
            "tpot_ms": ms(m.tpot_s),
            "tpot_p50_ms": ms(m.tpot_p50_s),
            "tpot_p95_ms": ms(m.tpot_p95_s),
        },
        "drafting": {
            "drafted": m.drafted,
            "accepted": m.accepted,
            "acceptance": m.acceptance,
            "accepted_per_step": m.accepted_per_step,
            "forced": m.forced,
            "speedup": m.speedup,
            "sources": {
                name: {"drafted": s.drafted, "accepted": s.accepted, "steps": s.steps}
                for name, s in m.draft_sources.items()
            },
        },
        "ttft_ms": ms(m.ttft_s),
        "total_ms": ms(m.total_s),
    }
    if m.thinking_tokens:
        out["thinking"] = {"ms": ms(m.thinking_s), "tokens": m.thinking_tokens}
    return out


def tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Parsed calls (``engine.tools.Call``) as OpenAI's ``tool_calls``, arguments as JSON text."""
    return [
        {
            "id": new_id("call"),
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)},
        }
        for c in calls
        if not c.error
    ]


def logprobs_of(tokens: list[Token]) -> list[Logprob]:
    """The ``Logprob`` of every token of these events, in order."""
    return [lp for token in tokens for lp in token.logprobs]


def _choice(lp: Logprob) -> dict[str, Any]:
    return {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.bytes)}


def chat_logprobs(numbers: list[Logprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``content`` with each token's number and its ``top_logprobs``."""
    content = [{**_choice(lp), "top_logprobs": [_choice(alt) for alt in lp.top]} for lp in numbers]
    return {"content": content, "refusal": None}


def completion_logprobs(numbers: list[Logprob], offset: int = 0) -> dict[str, Any]:
    """A legacy completion's ``logprobs``: parallel lists, ``top_logprobs`` as {token: logprob} with the
    sampled token among them (OpenAI's "up to logprobs + 1"), ``text_offset`` from ``offset`` on."""
    offsets = []
    for lp in numbers:
        offsets.append(offset)
        offset += len(lp.token)
    return {
        "tokens": [lp.token for lp in numbers],
        "token_logprobs": [lp.logprob for lp in numbers],
        "top_logprobs": [{alt.token: alt.logprob for alt in (*lp.top, lp)} for lp in numbers],
        "text_offset": offsets,
    }


def chat_response(
    reply_id: str,
    reply: Reply,
    text: str,
    calls: list[dict[str, Any]],
    finish: str,
    metrics: Metrics,
    logprobs: dict[str, Any] | None = None,
    thinking: str = "",
) -> dict[str, Any]:
    """A whole chat reply; ``thinking`` (a thinking model's, apart from ``text``) as ``reasoning_content``, or
    before the text inside <think>...</think> when ``reply.reasoning_apart`` is false."""
    if thinking and not reply.reasoning_apart:
        text, thinking = f"<think>{thinking}</think>{text}", ""
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if thinking:
        message["reasoning_content"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {
        "id": reply_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else FINISH.get(finish, "stop"),
                "logprobs": logprobs,
            }
        ],
        "usage": usage(metrics),
        "brisk": brisk_figures(metrics),
    }


def chat_chunk(
    reply_id: str,
    reply: Reply,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    metrics: Metrics | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk: a delta, a last delta with ``finish_reason``, or (``delta`` None) the usage chunk."""
    chunk: dict[str, Any] = {
        "id": reply_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": reply.model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
    }
    if metrics is not None:
        chunk["brisk"] = brisk_figures(metrics)
        if delta is None:
            chunk["usage"] = usage(metrics)
    return chunk


def verbose(reply: Reply, text: str, metrics: Metrics) -> dict[str, Any]:
    """llama-server's ``__verbose`` for ``verbose: true``: the prompt the model read, as text, and the reply
    in its own words (the last chunk of a stream carries it)."""
    return {
        "prompt": reply.prompt_text,
        "content": text,
        "tokens_evaluated": metrics.prompt_tokens,
        "tokens_cached": metrics.cached_tokens,
        "tokens_predicted": metrics.completion_tokens,
    }


def completion_response(
    reply_id: str,
    reply: Reply,
    text: str,
    finish: str | None,
    metrics: Metrics | None,
    chunk: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` answer, or one streamed piece of it (``chunk``; ``finish`` None until the last)."""
    out: dict[str, Any] = {
        "id": reply_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": reply.model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}],
    }
    if metrics is not None:
        out["brisk"] = brisk_figures(metrics)
        if not chunk:
            out["usage"] = usage(metrics)
    return out


def finish_reason(finish: str) -> str:
    return FINISH.get(finish, "stop")
