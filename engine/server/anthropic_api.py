"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, in the shapes of
the ``anthropic`` SDK (``anthropic.types.Message``, ``RawMessageStreamEvent``), for coding agents and editors
that speak it to a local server (as they do to llama.cpp's server and LM Studio).

Each request is read into the same :class:`~engine.api.Request` as ``/v1/chat/completions`` (the
messages, tools and sampling go through ``engine.server.shapes``) and answered by the same engine and
loaded model (:func:`routes` hangs the paths on ``engine.server.app``'s handlers: the API key, the model rule,
the hub), so a greedy reply is the same text on both paths.

* ``system`` (a text, or text blocks) is the first, system turn; ``messages`` are ``user`` / ``assistant``
  turns whose content is a text or blocks: ``text``, ``tool_use`` (an assistant's call: its ``input`` the
  arguments) and ``tool_result`` (a user turn's answer to a call: a tool turn; ``is_error`` says
  ``Error:`` before its text).  An assistant turn's ``thinking`` and ``redacted_thinking`` blocks are left
  out of the prompt (as thinking models' templates leave earlier thinking out).  Other blocks (images,
  documents) are a 400 that names them.
* ``thinking`` ``{"type": "enabled", "budget_tokens": N}`` or ``{"type": "disabled"}`` is a thinking model's
  template switch (``enable_thinking``); a reply's thinking comes back as a ``thinking`` block before the
  text (streamed as ``thinking_delta`` events), its ``signature`` empty (nothing signs it here).
* ``tools`` (``name``, ``description``, ``input_schema``) are the client's tools; ``tool_choice`` ``auto``,
  ``any`` (a call is forced), ``tool`` (that tool's call is forced) or ``none``.
* ``max_tokens`` is required (as Anthropic's API has it); ``temperature`` (0 to 1), ``top_p``, ``top_k`` and
  ``stop_sequences`` are honoured; a field left out takes the window's value (greedy), as on the OpenAI
  path.  ``metadata`` and ``service_tier`` are taken and named in ``X-Brisk-Ignored``; any other field
  is a 400 that names it.  ``cache_control`` on a block is taken: Brisk's prefix cache reuses every
  prompt's KV without being asked.
* The answer is a ``message`` whose ``content`` holds a ``text`` block and one ``tool_use`` block per call,
  ``stop_reason`` ``end_turn``, ``max_tokens``, ``stop_sequence`` (with the ``stop_sequence`` that ended
  it) or ``tool_use``.  ``usage.input_tokens`` counts the prompt tokens the model computed and
  ``cache_read_input_tokens`` those whose KV came from the prefix cache (Anthropic's split: the two add up
  to the prompt); ``cache_creation_input_tokens`` is 0.  ``brisk`` (on the message, and on the stream's
  ``message_delta``) is Brisk's timings phase by phase, as on the OpenAI path (``shapes.brisk_figures``).
* Streamed (``stream: true``): ``message_start``, ``ping``, then for each block ``content_block_start``,
  ``content_block_delta`` (``text_delta``; a tool call's whole ``input`` as one ``input_json_delta`` once
  the call is complete) and ``content_block_stop``, then ``message_delta`` (``stop_reason``, ``usage``) and
  ``message_stop``; each SSE event is named after its ``type``, as the SDK reads them.  A failure after
  the start is an ``error`` event.
* ``count_tokens`` takes the same fields less the sampling ones and answers ``{"input_tokens": N}``: the
  prompt the engine builds for them (the chat template with the tools); a 503 without a local model.

Errors are Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` with the status the
OpenAI path gives (400 invalid_request_error, 401 authentication_error, 404 not_found_error, 413
request_too_large, 503 api_error ...).  The key is taken as ``x-api-key`` (the SDK's) or a bearer token.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.api import Done, Error, Metrics, Request, Started, Thinking, Token
from engine.server import shapes
from engine.server.shapes import ApiError, bad

if TYPE_CHECKING:
    from engine.server.app import Handlers

MAX_STOPS = 16
HABITS = frozenset({"metadata", "service_tier"})  # taken, changing nothing here; said in X-Brisk-Ignored
PROMPT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice"})
FIELDS = PROMPT_FIELDS | {"max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream", "thinking"}
STOP_REASONS = {"length": "max_tokens", "context": "max_tokens"}  # the rest end the turn
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}

Handler = Callable[[HttpRequest], Awaitable[Response]]


def routes(handlers: Handlers) -> list[Route]:
    api = AnthropicApi(handlers)
    out = []
    for path, handler in (("/messages", api.messages), ("/messages/count_tokens", api.count_tokens)):
        wrapped = _anthropic_errors(handler)
        out += [Route("/v1" + path, wrapped, methods=["POST"]), Route(path, wrapped, methods=["POST"])]
    return out


def error_body(error: ApiError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _anthropic_errors(handler: Handler) -> Handler:
    """``handler`` with its ``ApiError`` answered in Anthropic's shape (the app's own handler writes OpenAI's)."""

    async def wrapped(http: HttpRequest) -> Response:
        try:
            return await handler(http)
        except ApiError as error:
            return JSONResponse(error_body(error), status_code=error.status)

    return wrapped


@dataclass(frozen=True)
class Asked:
    """One ``/v1/messages`` request as read: what goes to the engine and how to answer."""

    request: Request
    model: str
    stream: bool
    tools: bool
    ignored: tuple[str, ...]


class AnthropicApi:
    def __init__(self, handlers: Handlers) -> None:
        self.h = handlers
        self.s = handlers.s

    def _check_key(self, http: HttpRequest) -> None:
        """The SDK sends its key as ``x-api-key``; ``auth_token`` (and other clients) as a bearer token."""
        given = http.headers.get("x-api-key")
        if given is None or not self.s.api_key:
            self.h.check_key(http)
            return
        if not secrets.compare_digest(given.strip().encode("latin-1"), self.s.api_key.encode()):
            raise ApiError(401, "Wrong API key: send 'x-api-key: KEY'.", code="invalid_api_key")

    async def _body(
        self, http: HttpRequest, fields: frozenset[str], endpoint: str
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        from engine.server.app import read_json

        self._check_key(http)
        body = await read_json(http, self.s.max_body)
        return body, shapes.checked_fields(body, fields, endpoint, habits=HABITS)

    def read(self, body: Mapping[str, Any], ignored: tuple[str, ...], sampled: bool) -> Asked:
        """The body as Brisk's request; ``sampled``: a ``/v1/messages`` body (``max_tokens`` required)."""
        model = self.h.chat_model(body)
        messages = shapes.messages_from(_messages(body.get("system"), body.get("messages")))
        shapes.within_context(len(messages), sum(len(m["content"]) for m in messages), self.s.context, "messages")
        tools, forced = shapes.tools_from(_tools(body))
        sampling = self.s.defaults
        if sampled:
            if body.get("max_tokens") is None:
                raise bad("max_tokens: Field required", "max_tokens", "missing_field")
            # Anthropic's sampling fields are OpenAI's (temperature from 0 to 1 only)
            shapes.number(body, "temperature", 0.0, 1.0, 0.0)
            known = {k: body.get(k) for k in ("max_tokens", "temperature", "top_p", "top_k")}
            sampling = replace(
                shapes.sampling_from(known, sampling, self.s.context), stop=_stops(body.get("stop_sequences"))
            )
        if forced:
            sampling = replace(sampling, format=forced)
            shapes.usable(forced, "tools")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise bad(f"'stream' must be true or false, not {stream!r}.", "stream", "invalid_type")
        request = Request(
            shapes.new_id("srv"),
            messages,
            sampling,
            speculative=self.s.speculative,
            client_tools=tools,
            origin="server",
            thinking=_thinking(body.get("thinking")),
        )
        return Asked(request, model, bool(stream), bool(tools), ignored)

    # -- endpoints -----------------------------------------------------------------------------------------
    async def count_tokens(self, http: HttpRequest) -> Response:
        body, ignored = await self._body(http, PROMPT_FIELDS, "/v1/messages/count_tokens")
        asked = self.read(body, ignored, sampled=False)
        ids = await asyncio.to_thread(self.s.vocab.prompt_ids, asked.request) if self.s.vocab is not None else None
        if ids is None:
            raise ApiError(
                503, "This server has no local model's tokenizer to count with (a remote engine, or a load under way)."
            )
        return JSONResponse({"input_tokens": len(ids)}, headers=_ignored(ignored))

    async def messages(self, http: HttpRequest) -> Response:
        body, ignored = await self._body(http, FIELDS, "/v1/messages")
        asked = self.read(body, ignored, sampled=True)
        stream = self._stream(asked) if asked.stream else None
        out = await self.h.run(http, asked.request, "/v1/messages", stream, _ignored(ignored), marker=False, named=True)
        if isinstance(out, Response):
            return out
        done = out.done
        text, calls = _split(done.text) if asked.tools else (done.text, [])
        content: list[dict[str, Any]] = [_thought(done.thinking)] if done.thinking else []
        content += [{"type": "text", "text": text}] if text or not calls else []
        content += [_tool_use(call) for call in calls]
        reason, sequence = await self._stop(asked, done, [i for t in out.tokens for i in t.ids], bool(calls))
        message = _message(asked, content, reason, sequence, usage(done.metrics))
        message["brisk"] = shapes.brisk_figures(done.metrics)  # Brisk's timings, as on the OpenAI path
        return JSONResponse(message, headers=_ignored(ignored))

    # -- answers -------------------------------------------------------------------------------------------
    def _stream(self, asked: Asked) -> Any:
        from engine.server.app import sendable

        async def events(started: Started | None, queue: asyncio.Queue[Any]) -> AsyncIterator[dict[str, Any]]:
            first = Metrics(
                prompt_tokens=started.prompt_tokens if started else 0,
                cached_tokens=started.cached_tokens if started else 0,
            )
            yield {"type": "message_start", "message": _message(asked, [], None, None, usage(first))}
            yield {"type": "ping"}
            index = 0  # the open block's index
            text_open = False
            held = ""  # text that may open a tool call, not sent yet
            ids: list[int] = []
            thinking_open = False
            while True:
                event = await queue.get()
                if isinstance(event, Thinking) and event.text:
                    if not thinking_open:
                        yield _block_start(index, _thought(""))
                        thinking_open = True
                    yield _delta(index, {"type": "thinking_delta", "thinking": event.text})
                    continue
                if thinking_open and isinstance(event, Token | Done):
                    yield _delta(index, {"type": "signature_delta", "signature": ""})
                    yield {"type": "content_block_stop", "index": index}
                    index += 1
                    thinking_open = False
                if isinstance(event, Token):
                    ids.extend(event.ids)
                    send = event.text
                    if asked.tools:
                        send, held = sendable(held + event.text)
                    if send:
                        if not text_open:
                            yield _block_start(index, {"type": "text", "text": ""})
                            text_open = True
                        yield _delta(index, {"type": "text_delta", "text": send})
                elif isinstance(event, Done):
                    event = replace(event, metrics=await self.h.counted(asked.request, event.metrics))
                    prose, calls = _split(held) if held else ("", [])
                    if prose or (not text_open and not calls):
                        if not text_open:
                            yield _block_start(index, {"type": "text", "text": ""})
                            text_open = True
                        if prose:
                            yield _delta(index, {"type": "text_delta", "text": prose})
                    if text_open:
                        yield {"type": "content_block_stop", "index": index}
                        index += 1
                    for call in calls:
                        block = _tool_use(call)
                        yield _block_start(index, {**block, "input": {}})
                        yield _delta(index, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
                        yield {"type": "content_block_stop", "index": index}
                        index += 1
                    reason, sequence = await self._stop(asked, event, ids, bool(calls))
                    yield {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(event.metrics),
                        "brisk": shapes.brisk_figures(event.metrics),
                    }
                    yield {"type": "message_stop"}
                    return
                elif isinstance(event, Error):
                    yield error_body(ApiError(500, event.message))
                    return

        return events

    async def _stop(self, asked: Asked, done: Done, ids: list[int], called: bool) -> tuple[str, str | None]:
        """The ``stop_reason`` and ``stop_sequence``: which of the stop texts, if any, follows the reply's text
        in its decoded tokens (the engine cuts the text before it)."""
        if called:
            return "tool_use", None
        if done.finish_reason in STOP_REASONS:
            return STOP_REASONS[done.finish_reason], None
        stops = asked.request.sampling.stop
        model = await asyncio.to_thread(self.s.vocab.model) if stops and self.s.vocab is not None else None
        if model is not None and done.finish_reason == "stop":
            whole = await asyncio.to_thread(lambda: str(model.tokenizer.decode(ids, skip_special_tokens=True)))
            rest = whole[len(done.text) :] if whole.startswith(done.text) else ""
            for stop in stops:
                if rest.startswith(stop):
                    return "stop_sequence", stop
        return "end_turn", None


# -- reading ------------------------------------------------------------------------------------------------


def _messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Anthropic's ``system`` and ``messages`` as OpenAI chat messages (checked again by ``shapes``)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": _texts(system, "system")})
    if not isinstance(messages, list) or not messages:
        raise bad("messages: must be a non-empty list.", "messages", "invalid_type")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad(f"{where} must be an object.", where, "invalid_type")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role must be user or assistant, not {role!r}.", where)
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content must be a text or a list of content blocks.", where, "invalid_type")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # earlier thinking is not part of the next prompt
            elif kind == "tool_use" and role == "assistant":
                calls.append(_call(block, at))
            elif kind == "tool_result" and role == "user":
                if texts:  # text before a result is a user turn of its own, in order
                    out.append({"role": "user", "content": "".join(texts)})
                    texts = []
                out.append(_result(block, at))
            else:
                raise bad(
                    f"{at}: a {kind!r} block is not supported here ({role} turns take text"
                    f"{', tool_use' if role == 'assistant' else ', tool_result'} blocks).",
                    at,
                    "unsupported_content",
                )
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        elif texts or not content:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def _thinking(value: Any) -> str:
    """Anthropic's ``thinking`` field as ``Request.thinking``: "on", "off", or "auto" when not sent."""
    if value is None:
        return "auto"
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in ("enabled", "disabled"):
        raise bad('thinking: must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}.', "thinking")
    return "on" if kind == "enabled" else "off"


def _thought(text: str) -> dict[str, Any]:
    """A ``thinking`` content block (its ``signature`` empty: nothing signs a local model's thinking)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def _texts(value: Any, where: str) -> str:
    """A text, or a list of text blocks, as one text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in value
    ):
        return "".join(b["text"] for b in value)
    raise bad(f"{where} must be a text or a list of text blocks.", where, "invalid_type")


def _call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
        raise bad(f"{where}: a tool_use block needs an 'id' and a 'name'.", where)
    arguments = block.get("input", {})
    if not isinstance(arguments, Mapping):
        raise bad(f"{where}.input must be an object.", where, "invalid_type")
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": dict(arguments)}}


def _result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    text = _texts(content, f"{where}.content") if content else ""
    if block.get("is_error"):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}


def _tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's ``tools`` and ``tool_choice`` in OpenAI's shape, for ``shapes.tools_from``."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad("tools: must be a list.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise bad(f"tools[{i}]: {kind!r} tools are not supported here; send client tools.", f"tools[{i}]")
        schema = tool.get("input_schema")
        if not isinstance(schema, Mapping):
            raise bad(f"tools[{i}].input_schema must be a JSON schema object.", f"tools[{i}]", "invalid_type")
        function = {"name": tool.get("name"), "description": tool.get("description") or "", "parameters": schema}
        out.append({"type": "function", "function": function})
    choice = body.get("tool_choice")
    converted: Any = "auto" if out else "none"
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, Mapping) else None
        if kind == "auto":
            converted = "auto"
        elif kind == "any":
            converted = "required"
        elif kind == "none":
            converted = "none"
        elif kind == "tool":
            converted = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            raise bad("tool_choice: 'type' must be auto, any, tool or none.", "tool_choice")
    return {"tools": out, "tool_choice": converted}


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise bad("stop_sequences: must be a list of non-empty texts.", "stop_sequences", "invalid_type")
    if len(value) > MAX_STOPS:
        raise bad(f"stop_sequences: at most {MAX_STOPS} here, not {len(value)}.", "stop_sequences")
    return tuple(value)


# -- writing ------------------------------------------------------------------------------------------------


def usage(metrics: Metrics) -> dict[str, int]:
    """Anthropic's usage: the prompt tokens computed, those read from the prefix cache, the reply's."""
    return {
        "input_tokens": metrics.prompt_tokens - metrics.cached_tokens,
        "output_tokens": metrics.completion_tokens,
        "cache_read_input_tokens": metrics.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _message(
    asked: Asked, content: list[dict[str, Any]], reason: str | None, sequence: str | None, used: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": asked.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": used,
    }


def _block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _split(text: str) -> tuple[str, list[dict[str, Any]]]:
    from engine.server.app import split_calls

    return split_calls(text)


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI-shaped call (``app.split_calls``) as a ``tool_use`` block."""
    function = call["function"]
    return {
        "type": "tool_use",
        "id": "toolu_" + call["id"].removeprefix("call-"),
        "name": function["name"],
        "input": json.loads(function["arguments"]),
    }


def _ignored(ignored: tuple[str, ...]) -> dict[str, str]:
    from engine.server.app import ignored_header

    return ignored_header(ignored)
