"""The OpenAI-compatible HTTP API: a Starlette app, streamed with sse-starlette, served by uvicorn.

Endpoints: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``),
``POST /v1/chat/completions`` (streamed or not), ``POST /v1/completions``,
``POST /v1/embeddings`` (the all-MiniLM-L6-v2 model the answer cache ships);
each of OpenAI's paths also without the ``/v1`` (a client given the base URL
``http://host:port`` posts to ``/chat/completions``, as llama-server answers);
and llama.cpp's own ``/completion``, ``/infill``, ``/tokenize``, ``/detokenize``,
``/apply-template``, ``/props``, ``/slots`` and ``/chat/completions/input_tokens``
(``engine.server.llama_api``); and Anthropic's
``POST /v1/messages`` and ``/v1/messages/count_tokens`` (``engine.server.anthropic_api``, which answers
its errors in Anthropic's shape).
A field an endpoint does not know is a 400 that names it, except those clients
send by habit (``shapes.HABITS``: ``user``, ``metadata``, ``store`` ...), which
are taken and named in the answer's ``X-Brisk-Ignored`` header.
Every error is OpenAI's shape ``{"error": {"message", "type", "param",
"code"}}`` with its status: 400 for a body Brisk cannot honour (named field),
401 without the right key, 404 for an unknown path (and, with ``strict_model``,
for a model this server does not have: otherwise a request that names another
model, as agents send ``gpt-4o-mini``, is answered by the loaded model, whose
id the reply's ``model`` gives, as llama-server does), 405, 413 for a
body over ``max_body`` bytes, 503 while no model is loaded, 500 when the reply
itself failed.  A request whose client disconnects is cancelled at once
(streamed: sse-starlette ends the generator; not streamed: a watcher sees the
``http.disconnect``).

A streamed reply's status comes from its first event: the response starts
only once the engine has taken the request (``Started``), so a request the
engine refuses is a plain 4xx/5xx, never a 200 with an error inside.  After
that a failure is one last ``data: {"error": ...}`` event (as OpenAI sends).
With client tools, text from a ``<tool_call>`` marker on is held back and sent
as ``tool_calls`` deltas once the call is whole (Brisk's own parser).
llama-server's ``return_progress`` (streamed: ``prompt_progress`` chunks before
the first token) and ``timings_per_token`` (``timings`` on every chunk) are
taken on the OpenAI paths as on its own (``engine.server.live``); every answer's
``brisk`` field carries Brisk's timings, phase by phase (``shapes.phases``).
A stream opens with llama-server's and OpenAI's role chunk (``content: null``, no
``timings``).  The chat path also takes llama-server's ``grammar`` /
``json_schema`` (the constraint ``/completion`` applies), ``verbose`` (the prompt
the model read, under ``__verbose``) and ``id_slot`` (taken and said: Brisk has
no slots to pin).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.answer_cache.embed import MAX_CHARS as MAX_TEXT_CHARS
from engine.api import Done, Error, Logprob, Metrics, PrefillProgress, Request, Sampling, Started, Thinking, Token
from engine.server import anthropic_api, llama_api, shapes
from engine.server.hub import Entry, Hub
from engine.server.live import Live, timings
from engine.server.shapes import ApiError, Reply
from engine.server.vocab import Vocab

MAX_BODY = 8 << 20  # bytes of one request body
MAX_DEPTH = 100  # levels of nesting in one body (a schema's own depth is checked where it is compiled)
EMBED_WAIT_S = 60.0  # the embedding model's load, at most, before a 503
EMBED_MAX_INPUTS = 2048  # texts in one /v1/embeddings request (OpenAI's limit)
EMBED_MAX_CHARS = 1 << 20  # characters of them all, each counted once cut (about 250,000 tokens: OpenAI takes 300,000)
EMBED_BATCH = 16  # texts the embedder encodes at once: its memory, and how soon a client that left stops it
TOOL_OPEN = "<tool_call>"
IGNORED_HEADER = "X-Brisk-Ignored"
# what a 404 lists: OpenAI's paths answer with and without the /v1 in front
ENDPOINTS = (
    "[/v1]/chat/completions, [/v1]/completions, [/v1]/embeddings, [/v1]/models, /health; llama.cpp's "
    "/completion, /infill, /tokenize, /detokenize, /apply-template, /props, /slots, "
    "[/v1]/chat/completions/input_tokens; Anthropic's [/v1]/messages, "
    "[/v1]/messages/count_tokens"
)


@dataclass
class Service:
    """What the handlers share: the hub, the loaded model as clients name it, the defaults, the key."""

    hub: Hub
    defaults: Sampling = field(default_factory=Sampling)
    speculative: str = "auto"
    api_key: str | None = None
    model: str | None = None  # the loaded model's id (model_id); None while loading
    aliases: tuple[str, ...] = ()  # other names a request may give it (the name the window shows)
    context: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    loading: str = "loading the model"  # what /health says while model is None
    max_body: int = MAX_BODY
    embedder: Callable[[], Any] | None = None  # the process's embedder (engine.answer_cache.shared_embedder)
    # a request naming a model this server does not have: a 404 (True), or answered by the loaded model (False)
    strict_model: bool = False
    vocab: Vocab | None = None  # the loaded model's tokenizer (None: the server has no backend to read it from)

    def model_ids(self) -> list[str]:
        ids = [self.model] if self.model else []
        if self.embedder is not None:
            ids.append(EMBED_MODEL)
        return ids


EMBED_MODEL = "all-MiniLM-L6-v2"


def model_id(name: str) -> str:
    """The id clients send for a loaded model: its name without notes in brackets, spaces as dashes
    ("SmolLM2-135M-Instruct (bundled)" is "SmolLM2-135M-Instruct")."""
    return re.sub(r"\s+", "-", re.sub(r"\s*\([^)]*\)", "", name).strip()) or "brisk"


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def read_json(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The body as a JSON object, refused past ``limit`` bytes (counted as it arrives, not just announced)
    or ``MAX_DEPTH`` levels of nesting (every later reader of it may recurse)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"The request body is over {limit >> 20} MiB.", code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"The request body is over {limit >> 20} MiB.", code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:  # the client left, or the guard closed it at the body's deadline: nobody reads this
        raise ApiError(408, "The request's body did not arrive whole.", code="request_timeout") from None
    try:
        body = json.loads(b"".join(chunks) or b"null")
    except RecursionError:
        raise shapes.bad(f"The body nests more than {MAX_DEPTH} levels deep.", code="invalid_json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise shapes.bad(f"The body is not valid JSON ({_short(exc)}).", code="invalid_json") from None
    except ValueError:  # Python reads no integer over 4,300 digits
        raise shapes.bad("The body holds a number over 4,300 digits long.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise shapes.bad("The body must be a JSON object.", code="invalid_json")
    if _depth_over(body, MAX_DEPTH):
        raise shapes.bad(f"The body nests more than {MAX_DEPTH} levels deep.", code="invalid_json")
    return body


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``limit`` levels (counted without recursion)."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def client_name(request: HttpRequest) -> str:
    host = request.client.host if request.client else "?"
    agent = request.headers.get("user-agent", "").split(" ")[0].split("/")[0]
    return f"{agent} ({host})" if agent else host


def ignored_header(ignored: tuple[str, ...]) -> dict[str, str]:
    """``X-Brisk-Ignored``: the fields of ``shapes.HABITS`` a request sent, which the answer did not use."""
    return {IGNORED_HEADER: ", ".join(ignored)} if ignored else {}


def engine_error(message: str) -> ApiError:
    """An engine ``Error`` that came before the reply started, as an HTTP error."""
    if message.startswith("No model"):
        return ApiError(503, message, code="model_not_loaded")
    if message.startswith("The reply failed"):
        return ApiError(500, message, code="engine_error")
    return shapes.bad(message, code="invalid_request")


class Handlers:
    def __init__(self, service: Service) -> None:
        self.s = service

    # -- checks ---------------------------------------------------------------------------
    def check_key(self, request: HttpRequest) -> None:
        if not self.s.api_key:
            return
        # headers arrive as latin-1 text: back to their bytes, compared in constant time with the key's
        given = request.headers.get("authorization", "").encode("latin-1")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.s.api_key.encode()):
            raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY'.", code="invalid_api_key")

    def chat_model(self, body: Mapping[str, Any]) -> str:
        if self.s.model is None:
            raise ApiError(
                503, f"No model is loaded yet ({self.s.loading}); try again shortly.", code="model_not_loaded"
            )
        asked = body.get("model")
        if asked in (None, "", self.s.model, *self.s.aliases):
            return self.s.model
        if not isinstance(asked, str):
            raise shapes.bad("'model' must be a text.", "model", "invalid_type")
        if not self.s.strict_model:  # agents send fixed names (gpt-4o-mini): the loaded model answers, and says so
            return self.s.model
        raise ApiError(
            404,
            f"The model {asked!r} is not loaded here; this server has {self.s.model!r} (GET /v1/models).",
            "model",
            "model_not_found",
        )

    # -- endpoints ------------------------------------------------------------------------
    async def health(self, request: HttpRequest) -> Response:
        if self.s.model is None:
            return JSONResponse({"status": "loading", "message": self.s.loading}, status_code=503)
        running, _, served = self.s.hub.log.snapshot()
        return JSONResponse({"status": "ok", "model": self.s.model, "in_flight": len(running), "served": served})

    async def models(self, request: HttpRequest) -> Response:
        self.check_key(request)
        data = [
            {"id": m, "object": "model", "created": self.s.created, "owned_by": "brisk"} for m in self.s.model_ids()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: HttpRequest) -> Response:
        self.check_key(request)
        name = request.path_params["name"]
        if name not in self.s.model_ids():
            raise ApiError(404, f"No model {name!r} here (GET /v1/models lists them).", "model", "model_not_found")
        return JSONResponse({"id": name, "object": "model", "created": self.s.created, "owned_by": "brisk"})

    async def chat(self, request: HttpRequest) -> Response:
        self.check_key(request)
        body = await read_json(request, self.s.max_body)
        model = self.chat_model(body)
        req, reply = shapes.chat_request(body, model, self.s.defaults, self.s.context, self.s.speculative)
        if reply.verbose:
            reply = dataclasses.replace(reply, prompt_text=await self.prompt_text(req))
        return await self.answer(request, req, reply, "/v1/chat/completions", chat=True)

    async def prompt_text(self, req: Request) -> str:
        """``req``'s prompt as the engine builds it, as text (llama-server's ``verbose``); "" without a local
        tokenizer (a remote engine)."""
        vocab = self.s.vocab
        if vocab is None:
            return ""

        def run() -> str:
            model = vocab.model()
            ids = vocab.prompt_ids(req) if model is not None else None
            return "" if ids is None or model is None else vocab.detokenize(model, ids)

        return await asyncio.to_thread(run)

    async def completions(self, request: HttpRequest) -> Response:
        self.check_key(request)
        body = await read_json(request, self.s.max_body)
        model = self.chat_model(body)
        req, reply = shapes.completion_request(body, model, self.s.defaults, self.s.context, self.s.speculative)
        return await self.answer(request, req, reply, "/v1/completions", chat=False)

    async def embeddings(self, request: HttpRequest) -> Response:
        self.check_key(request)
        body = await read_json(request, self.s.max_body)
        ignored = shapes.checked_fields(body, shapes.EMBEDDING_FIELDS, "/v1/embeddings")
        if self.s.embedder is None:
            raise ApiError(404, "This server has no embedding model.", "model", "model_not_found")
        if body.get("model") not in (None, "", EMBED_MODEL) and (
            self.s.strict_model or not isinstance(body.get("model"), str)
        ):
            raise ApiError(
                404,
                f"The embedding model here is {EMBED_MODEL!r}, not {body.get('model')!r}.",
                "model",
                "model_not_found",
            )
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise shapes.bad(
                "'input' must be a text or a non-empty list of texts (token lists are not taken).", "input"
            )
        if len(texts) > EMBED_MAX_INPUTS:
            raise shapes.bad(f"'input' takes at most {EMBED_MAX_INPUTS} texts, not {len(texts)}.", "input")
        chars = sum(min(len(t), MAX_TEXT_CHARS) for t in texts)  # each as the embedder cuts it
        if chars > EMBED_MAX_CHARS:
            raise shapes.bad(
                f"'input' holds {chars:,} characters; one request takes at most {EMBED_MAX_CHARS:,} "
                "(send the texts in several requests).",
                "input",
                "input_too_large",
            )
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise shapes.bad("'encoding_format' must be float or base64.", "encoding_format", "unsupported_value")
        if body.get("dimensions") not in (None, 384):
            raise shapes.bad("'dimensions' must be 384 for this model.", "dimensions", "unsupported_value")
        embedder = self.s.embedder()
        if not await asyncio.to_thread(embedder.wait, EMBED_WAIT_S):
            raise ApiError(503, f"The embedding model is not available ({embedder.error or 'still loading'}).")
        vectors: list[Any] = []
        tokens = 0
        watch = Watch(request)
        try:  # a few texts at a time: bounded memory, and a client that leaves stops the work within one batch
            for start in range(0, len(texts), EMBED_BATCH):
                batch = texts[start : start + EMBED_BATCH]
                future = embedder.submit(batch)
                if future is None:
                    raise ApiError(503, "The embedding model is closing; try again.")
                done = await watch.wait(asyncio.wrap_future(future))
                if done is None:
                    future.cancel()
                    return Response(status_code=499)
                vectors.extend(done)
                tokens += await asyncio.to_thread(embedder.count_tokens, batch)
        finally:
            watch.stop()
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, encoding)} for i, v in enumerate(vectors)]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": EMBED_MODEL,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
            headers=ignored_header(ignored),
        )

    # -- replies --------------------------------------------------------------------------
    async def answer(self, http: HttpRequest, req: Request, reply: Reply, endpoint: str, chat: bool) -> Response:
        await self.biased_within_vocab(req.sampling)
        stream = self._chat_stream if chat else self._completion_stream
        headers = ignored_header(reply.ignored)
        if reply.n > 1:
            return await self.answer_siblings(http, shapes.siblings(req, reply.n), reply, endpoint, chat)
        out = await self.run(
            http,
            req,
            endpoint,
            (lambda started, events: self._live(stream(req, reply, events, Live(started)), reply))
            if reply.stream
            else None,
            headers,
        )
        if isinstance(out, Response):
            return out
        reply_id = shapes.new_id("chatcmpl" if chat else "cmpl")
        body = self.whole(req, reply, out, chat, reply_id)
        if reply.per_token:
            body["timings"] = timings(out.done.metrics)
        return JSONResponse(body, headers=headers)

    @staticmethod
    def whole(req: Request, reply: Reply, out: Outcome, chat: bool, reply_id: str) -> dict[str, Any]:
        """A reply that is not streamed: the answer's body."""
        done = out.done
        numbers = shapes.logprobs_of(out.tokens) if req.sampling.logprobs else None
        if not chat:
            text = (req.messages[0]["content"] if reply.echo else "") + done.text
            finish = shapes.finish_reason(done.finish_reason)
            lp = None if numbers is None else shapes.completion_logprobs(numbers)
            return shapes.completion_response(reply_id, reply, text, finish, done.metrics, logprobs=lp)
        text, calls = split_calls(done.text) if reply.tools else (done.text, [])
        lp = None if numbers is None else shapes.chat_logprobs(numbers)
        body = shapes.chat_response(reply_id, reply, text, calls, done.finish_reason, done.metrics, lp, done.thinking)
        if reply.verbose:
            body["__verbose"] = shapes.verbose(reply, done.text, done.metrics)
        return body

    async def answer_siblings(
        self, http: HttpRequest, reqs: list[Request], reply: Reply, endpoint: str, chat: bool
    ) -> Response:
        """``n`` choices: the siblings run as requests of their own, submitted at once so the engine decodes
        them together; choice i is sibling i's reply.  ``usage`` counts the prompt once (as OpenAI does) and
        the completions of all."""
        headers = ignored_header(reply.ignored)
        reply_id = shapes.new_id("chatcmpl" if chat else "cmpl")
        if reply.stream:
            return await self.stream_siblings(http, reqs, reply, endpoint, chat, reply_id, headers)
        outs = await asyncio.gather(*(self.run(http, r, endpoint, None) for r in reqs), return_exceptions=True)
        for out in outs:
            if isinstance(out, BaseException):
                raise out
            if isinstance(out, Response):
                return out
        bodies = [self.whole(r, reply, o, chat, reply_id) for r, o in zip(reqs, outs, strict=True)]  # type: ignore[arg-type]
        body = bodies[0]
        body["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        body["usage"] = shapes.usage_of([o.done.metrics for o in outs])  # type: ignore[union-attr]
        return JSONResponse(body, headers=headers)

    async def stream_siblings(
        self,
        http: HttpRequest,
        reqs: list[Request],
        reply: Reply,
        endpoint: str,
        chat: bool,
        reply_id: str,
        headers: Mapping[str, str],
    ) -> Response:
        """``n`` streamed choices: each sibling's chunks as it makes them, under one id with its index; the
        response starts once every sibling has started (a refusal is a plain 4xx/5xx), and one usage chunk
        for them all ends it when asked for."""
        queues = [self.s.hub.open(r, Entry(r.id, client_name(http), endpoint, time.time())) for r in reqs]
        ids = tuple(r.id for r in reqs)
        watch = Watch(http)
        streaming = False
        try:
            lives = []
            for events in queues:
                first = await self._until(watch, events, Started | Error | Done)
                if first is None:
                    return Response(status_code=499)
                if isinstance(first, Error):
                    raise engine_error(first.message)
                if isinstance(first, Done):
                    events.put_nowait(first)
                lives.append(Live(first if isinstance(first, Started) else None))
            one = dataclasses.replace(reply, include_usage=True)  # each sibling's usage, summed here
            make = self._chat_stream if chat else self._completion_stream
            streams = [self._live(make(r, one, q, live), one) for r, q, live in zip(reqs, queues, lives, strict=True)]
            merged = self._merged(streams, reply, reply_id)
            streaming = True
            return EventSourceResponse(self._guarded(ids, merged), ping=15, send_timeout=None, headers=headers)
        finally:
            watch.stop()
            if not streaming:
                for request_id in ids:
                    self.s.hub.close(request_id)

    @staticmethod
    async def _merged(
        streams: list[AsyncIterator[dict[str, Any]]], reply: Reply, reply_id: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The siblings' chunks as they come, choice i's ``index`` i, all under ``reply_id``; their usage
        chunks held back and summed into one at the end (when ``reply.include_usage``)."""
        queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()

        async def pump(i: int, chunks: AsyncIterator[dict[str, Any]]) -> None:
            try:
                async for chunk in chunks:
                    await queue.put((i, chunk))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, chunks)) for i, chunks in enumerate(streams)]
        usages: list[dict[str, Any]] = []
        left = len(tasks)
        try:
            while left:
                i, chunk = await queue.get()
                if chunk is None:
                    left -= 1
                    continue
                if "error" in chunk:
                    yield chunk
                    return
                if not chunk["choices"] and "usage" in chunk:
                    usages.append(chunk)
                    continue
                chunk["id"] = reply_id
                chunk["choices"] = [{**c, "index": i} for c in chunk["choices"]]
                yield chunk
            if reply.include_usage and usages:
                yield {**usages[0], "id": reply_id, "usage": shapes.summed(u["usage"] for u in usages)}
        finally:
            for task in tasks:
                task.cancel()

    async def run(
        self,
        http: HttpRequest,
        req: Request,
        endpoint: str,
        stream: Callable[[Started | None, asyncio.Queue[Any]], AsyncIterator[dict[str, Any]]] | None,
        headers: Mapping[str, str] | None = None,
        marker: bool = True,
        named: bool = False,
    ) -> Response | Outcome:
        """Submit ``req`` and wait for it to start: a refusal is a plain 4xx/5xx.  With ``stream``, its
        chunks (made from the ``Started`` and the request's events) are the SSE response, ``[DONE]`` last
        when ``marker``, each event named after its chunk's ``type`` when ``named`` (Anthropic's stream);
        without, the request's :class:`Outcome` once it ends (its usage counted)."""
        entry = Entry(req.id, client_name(http), endpoint, time.time())
        events = self.s.hub.open(req, entry)
        watch = Watch(http)
        streaming = False
        tokens: list[Token] = []
        try:
            first = await self._until(watch, events, Started | Error | Done)
            if first is None:  # the client left before the reply started
                return Response(status_code=499)
            if isinstance(first, Error):
                raise engine_error(first.message)
            if isinstance(first, Done):  # an answer-cache hit still sends Started first; kept for safety
                events.put_nowait(first)
            started = first if isinstance(first, Started) else None
            if stream is not None:  # from here sse-starlette watches the connection and the stream closes it
                streaming = True
                return EventSourceResponse(
                    self._guarded((req.id,), stream(started, events), marker, named),
                    ping=15,
                    send_timeout=None,
                    headers=headers,
                )
            done = await self._until(watch, events, Done | Error, tokens)
        finally:
            watch.stop()
            if not streaming:
                self.s.hub.close(req.id)
        if done is None:
            return Response(status_code=499)
        if isinstance(done, Error):
            raise ApiError(500, done.message, code="engine_error")
        done = dataclasses.replace(done, metrics=await self.counted(req, done.metrics))
        return Outcome(started, tokens, done)

    async def biased_within_vocab(self, sampling: Sampling) -> None:
        """A 400 for a ``logit_bias`` id past the loaded tokenizer's (the engine would fail the reply), and for
        the fields only the local engine honours when the server answers from a remote one."""
        local = {
            "logit_bias": sampling.logit_bias,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "logprobs": sampling.logprobs,
        }
        asked = [name for name, value in local.items() if value]
        if not asked or self.s.vocab is None:
            return
        model = await asyncio.to_thread(self.s.vocab.model)
        if model is None:
            raise shapes.bad(
                f"'{asked[0]}' needs Brisk's own engine; this server answers from a remote one. Leave it out.",
                asked[0],
                "unsupported_value",
            )
        size = len(model.tokenizer)
        outside = [token for token, _ in sampling.logit_bias if token >= size]
        if outside:
            raise shapes.bad(
                f"'logit_bias' names token {outside[0]}; this model's token ids go from 0 to {size - 1}.",
                "logit_bias",
            )

    async def counted(self, req: Request, metrics: Metrics) -> Metrics:
        """A reply's metrics with an answer-cache hit's prompt counted: the engine ran no prefill for it, so
        its ``Done`` says 0; the prompt the model would have read is counted here and, since none of it was
        computed, all of it is cached (clients' cost tracking reads ``usage``)."""
        if not metrics.answer_cache or metrics.prompt_tokens or self.s.vocab is None:
            return metrics
        ids = await asyncio.to_thread(self.s.vocab.prompt_ids, req)
        if not ids:
            return metrics
        return dataclasses.replace(metrics, prompt_tokens=len(ids), cached_tokens=len(ids))

    @staticmethod
    async def _until(watch: Watch, events: asyncio.Queue[Any], kinds: Any, tokens: list[Token] | None = None) -> Any:
        """The request's next event of ``kinds`` (those before it are skipped, its ``Token`` events kept in
        ``tokens`` when given); None when the client left first."""
        while True:
            event = await watch.next(events)
            if event is None or isinstance(event, kinds):
                return event
            if tokens is not None and isinstance(event, Token):
                tokens.append(event)

    async def _guarded(
        self,
        request_ids: tuple[str, ...],
        chunks: AsyncIterator[dict[str, Any]],
        marker: bool = True,
        named: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream's events (``named``: each with its chunk's ``type`` as the SSE event), then ``[DONE]``
        (``marker``); the request is cancelled when the client stops reading."""
        try:
            async for chunk in chunks:
                data = json.dumps(chunk, ensure_ascii=False)
                yield {"event": chunk["type"], "data": data} if named else {"data": data}
            if marker:
                yield {"data": "[DONE]"}
        finally:
            for request_id in request_ids:
                self.s.hub.close(request_id)

    @staticmethod
    async def _live(
        chunks: AsyncIterator[tuple[dict[str, Any], Live | Metrics]], reply: Reply
    ) -> AsyncIterator[dict[str, Any]]:
        """A stream's chunks, each with llama.cpp's ``timings`` (``reply.per_token``): the figures so far, the
        reply's own ``Metrics`` on its last chunks."""
        async for chunk, figures in chunks:
            role = any("role" in c.get("delta", ()) for c in chunk.get("choices", ()))
            if reply.per_token and "error" not in chunk and not role:  # none on a role chunk, as llama-server
                chunk["timings"] = figures.timings() if isinstance(figures, Live) else timings(figures)
            yield chunk

    @staticmethod
    def _progress(live: Live, reply: Reply, event: Any) -> dict[str, Any] | None:
        """``prompt_progress`` for ``event`` when the client asked for it (``engine.server.live``); the live
        figures follow every event either way."""
        progress = None
        if isinstance(event, PrefillProgress):
            progress = live.prefilled(event)
        elif isinstance(event, Token | Thinking) and event.ids:
            live.token(event)
        return progress if reply.progress else None

    async def _chat_stream(
        self, req: Request, reply: Reply, events: asyncio.Queue[Any], live: Live
    ) -> AsyncIterator[tuple[dict[str, Any], Live | Metrics]]:
        reply_id = shapes.new_id("chatcmpl")
        yield shapes.chat_chunk(reply_id, reply, {"role": "assistant", "content": None}), live
        held = ""  # text that may open a tool call, not sent yet
        numbers = Numbers(req.sampling.logprobs, shapes.chat_logprobs)  # go out with the next chunk sent
        thinking = ""  # a thinking model's: "open" while its thinking is sent as content (reasoning_format none)
        progress = live.start() if reply.progress else None
        while True:
            if progress is not None:  # llama-server's progress chunk: the role again, no content
                chunk = shapes.chat_chunk(reply_id, reply, {"role": "assistant", "content": None})
                yield {**chunk, "prompt_progress": progress}, live
            event = await events.get()
            progress = self._progress(live, reply, event)
            if isinstance(event, Thinking) and event.text:
                if reply.reasoning_apart:
                    yield shapes.chat_chunk(reply_id, reply, {"reasoning_content": event.text}), live
                else:
                    text = ("" if thinking else "<think>") + event.text
                    yield shapes.chat_chunk(reply_id, reply, {"content": text}), live
                    thinking = "open"
                continue
            if thinking == "open" and isinstance(event, Token | Done):
                yield shapes.chat_chunk(reply_id, reply, {"content": "</think>"}), live
                thinking = "closed"
            if isinstance(event, Token):
                numbers.add(event)
            if isinstance(event, Token) and event.text:
                if not reply.tools:
                    yield shapes.chat_chunk(reply_id, reply, {"content": event.text}, logprobs=numbers.take()), live
                    continue
                held += event.text
                send, held = sendable(held)
                if send:
                    yield shapes.chat_chunk(reply_id, reply, {"content": send}, logprobs=numbers.take()), live
            elif isinstance(event, Done):
                event = dataclasses.replace(event, metrics=await self.counted(req, event.metrics))
                calls: list[dict[str, Any]] = []
                if reply.tools and held:
                    prose, calls = split_calls(held)
                    if prose:
                        yield shapes.chat_chunk(reply_id, reply, {"content": prose}, logprobs=numbers.take()), live
                for i, call in enumerate(calls):
                    yield shapes.chat_chunk(reply_id, reply, {"tool_calls": [{"index": i, **call}]}), live
                finish = "tool_calls" if calls else shapes.finish_reason(event.finish_reason)
                last = shapes.chat_chunk(reply_id, reply, {}, finish, event.metrics, numbers.take())
                if reply.verbose:
                    last["__verbose"] = shapes.verbose(reply, event.text, event.metrics)
                yield last, event.metrics
                if reply.include_usage:
                    yield shapes.chat_chunk(reply_id, reply, None, None, event.metrics), event.metrics
                return
            elif isinstance(event, Error):
                yield ApiError(500, event.message, code="engine_error").body(), live
                return

    async def _completion_stream(
        self, req: Request, reply: Reply, events: asyncio.Queue[Any], live: Live
    ) -> AsyncIterator[tuple[dict[str, Any], Live | Metrics]]:
        reply_id = shapes.new_id("cmpl")
        if reply.echo:
            yield shapes.completion_response(reply_id, reply, req.messages[0]["content"], None, None, chunk=True), live
        offset = 0  # characters of the completion sent: the next token's text_offset

        def legacy(numbers: list[Logprob]) -> dict[str, Any]:
            nonlocal offset
            out = shapes.completion_logprobs(numbers, offset)
            offset += sum(len(lp.token) for lp in numbers)
            return out

        numbers = Numbers(req.sampling.logprobs, legacy)
        progress = live.start() if reply.progress else None
        while True:
            if progress is not None:  # llama-server's progress chunk: an empty text
                chunk = shapes.completion_response(reply_id, reply, "", None, None, chunk=True)
                yield {**chunk, "prompt_progress": progress}, live
            event = await events.get()
            progress = self._progress(live, reply, event)
            if isinstance(event, Token):
                numbers.add(event)
            if isinstance(event, Token) and event.text:
                yield (
                    shapes.completion_response(
                        reply_id, reply, event.text, None, None, chunk=True, logprobs=numbers.take()
                    ),
                    live,
                )
            elif isinstance(event, Done):
                event = dataclasses.replace(event, metrics=await self.counted(req, event.metrics))
                finish = shapes.finish_reason(event.finish_reason)
                yield (
                    shapes.completion_response(
                        reply_id, reply, "", finish, event.metrics, chunk=True, logprobs=numbers.take()
                    ),
                    event.metrics,
                )
                if reply.include_usage:
                    usage = {
                        "id": reply_id,
                        "object": "text_completion",
                        "created": int(time.time()),
                        "model": reply.model,
                        "choices": [],
                        "usage": shapes.usage(event.metrics),
                    }
                    yield usage, event.metrics
                return
            elif isinstance(event, Error):
                yield ApiError(500, event.message, code="engine_error").body(), live
                return


class Numbers:
    """A stream's logprobs not sent yet (with ``Sampling.logprobs``): each chunk takes those gathered before
    it, in the shape ``shape`` gives them (None when none were asked for, or none are waiting)."""

    def __init__(self, wanted: bool, shape: Callable[[list[Logprob]], dict[str, Any]]) -> None:
        self.wanted = wanted
        self.shape = shape
        self.waiting: list[Logprob] = []

    def add(self, token: Token) -> None:
        self.waiting.extend(token.logprobs)

    def take(self) -> dict[str, Any] | None:
        if not self.wanted or not self.waiting:
            return None
        numbers, self.waiting = self.waiting, []
        return self.shape(numbers)


@dataclass(frozen=True)
class Outcome:
    """A request that ended well: its ``Started`` (None if the engine sent none), its tokens, its ``Done``."""

    started: Started | None
    tokens: list[Token]
    done: Done


class Watch:
    """Notices the client's ``http.disconnect`` while a handler waits for events (the body is read by then, so
    every message ``receive`` still gives is the disconnect).  Stopped before a streamed response starts:
    sse-starlette listens for it from there."""

    def __init__(self, http: HttpRequest) -> None:
        self._task = asyncio.ensure_future(self._listen(http))

    @staticmethod
    async def _listen(http: HttpRequest) -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    async def next(self, events: asyncio.Queue[Any]) -> Any:
        """The next event, or None as soon as the client disconnects."""
        return await self.wait(events.get())

    async def wait(self, awaitable: Any) -> Any:
        """What ``awaitable`` gives, or None as soon as the client disconnects (it is cancelled then)."""
        getter = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            return getter.result() if getter.done() else None
        finally:
            if not getter.done():
                getter.cancel()

    def stop(self) -> None:
        self._task.cancel()


def _encoded(vector: Any, encoding: str) -> Any:
    """One embedding as a list of floats, or (``base64``, the SDK's default) its little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def sendable(held: str) -> tuple[str, str]:
    """Split streamed text into what can go out now and what must wait: from a tool-call marker (or the
    start of one at the very end) on, the text is held until the reply ends."""
    at = held.find(TOOL_OPEN)
    if at >= 0:
        return held[:at], held[at:]
    for size in range(min(len(TOOL_OPEN) - 1, len(held)), 0, -1):
        if TOOL_OPEN.startswith(held[-size:]):
            return held[:-size], held[-size:]
    return held, ""


def split_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """A reply's prose and its tool calls in OpenAI's shape (Brisk's parser, ``engine.tools``)."""
    from engine.tools.parse import parse_model_output

    parsed = parse_model_output(text)
    calls = shapes.tool_calls(parsed.calls)
    return (parsed.text.strip() if calls else text), calls


def build_app(service: Service) -> Starlette:
    handlers = Handlers(service)

    async def api_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = {
            404: f"No endpoint {request.url.path} (this server has {ENDPOINTS}).",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(exc.status_code, message, code=code))

    async def server_error(request: HttpRequest, exc: Exception) -> Response:
        import traceback

        traceback.print_exception(exc)
        return error_response(ApiError(500, f"The server failed ({type(exc).__name__}: {exc}).", code="server_error"))

    routes = [Route("/health", handlers.health, methods=["GET"]), Route("/v1/health", handlers.health, methods=["GET"])]
    for path, handler, method in (
        ("/models", handlers.models, "GET"),
        ("/models/{name:path}", handlers.model, "GET"),
        ("/chat/completions", handlers.chat, "POST"),
        ("/completions", handlers.completions, "POST"),
        ("/embeddings", handlers.embeddings, "POST"),
    ):  # each under /v1 and without it: clients given a base URL without /v1 post to /chat/completions
        routes += [Route("/v1" + path, handler, methods=[method]), Route(path, handler, methods=[method])]
    routes += llama_api.routes(handlers)
    routes += anthropic_api.routes(handlers)
    middleware: list[Middleware] = []
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: server_error},
    )
