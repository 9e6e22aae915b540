"""llama.cpp's own HTTP API where its clients use it: ``/completion``, ``/infill``, ``/tokenize``,
``/detokenize``, ``/apply-template`` and ``/props``, in the shapes of llama.cpp's ``tools/server/README.md``.

Editor plug-ins, SillyTavern and scripts written for ``llama-server`` call these
rather than OpenAI's paths.  Each is answered from the same engine and the same
loaded model as ``/v1/...`` (:func:`routes` hangs them on ``engine.server.app``'s
handlers: the API key, the model rule, the hub):

* ``POST /completion`` -- the prompt as it is (a text, or token ids that the
  tokenizer gives back exactly), as ``/v1/completions`` sends it, so a greedy
  reply is the same text.  Taken: ``prompt``, ``n_predict`` (-1 or left out: up
  to the rest of the context; 0 is refused), ``stream``, ``stop``,
  ``temperature`` (below 0: greedy, as llama.cpp), ``top_k``, ``top_p``,
  ``seed`` (-1: random), ``repeat_penalty``, ``cache_prompt`` (False: this reply
  neither reads nor keeps prompt KV), ``json_schema``, ``grammar`` (GBNF or
  Lark, through llguidance's converter), ``return_tokens``, ``model``,
  ``presence_penalty`` / ``frequency_penalty`` (OpenAI's meaning: over the
  whole reply, not llama.cpp's last ``repeat_last_n`` tokens), ``logit_bias``
  (token ids, or a text: each of its tokens; ``false`` bans), ``n_probs`` (``completion_probabilities``:
  each token's ``logprob`` and its ``n_probs`` likeliest, as the OpenAI paths
  give them; at most 20), ``return_progress`` (streamed: ``prompt_progress``
  pieces before the first token, with no text and no tokens;
  ``engine.server.live``) and ``timings_per_token`` (streamed: ``timings`` on
  every piece).  The
  sampler fields Brisk lacks are taken only at the value that turns them off
  (:data:`OFF`, e.g. ``min_p: 0``, ``mirostat: 0``); any other value, and any
  other field, is a 400 that names it.  Streamed, each piece is
  ``data: {"content", "tokens", "stop": false, ...}`` and the last one carries
  ``stop: true`` with ``timings``, ``tokens_predicted``, ``tokens_evaluated``,
  ``stop_type`` and ``generation_settings``; no ``[DONE]`` (llama.cpp sends
  none on this path).
* ``POST /tokenize`` (``content``, ``add_special``, ``parse_special``,
  ``with_pieces``), ``POST /detokenize`` (``tokens``), ``POST /apply-template``
  (``messages``, ``tools``, ``add_generation_prompt``: the prompt text a reply
  renders), ``POST [/v1]/chat/completions/input_tokens`` (a chat body: its
  prompt's token count, ``{"input_tokens": N}``), ``GET /slots`` (the batch as
  slots, as many ``is_processing`` as requests in flight) -- the loaded
  model's own tokenizer and chat template (``engine.server.vocab``); a 503 while
  the server has no local model to read them from.
* ``POST /infill`` -- ``input_prefix``, ``input_suffix``, ``input_extra``
  chunks and ``prompt`` in the model's fill-in-the-middle tokens, laid out as
  llama-server does (``engine.server.infill``), then answered as
  ``/completion`` (its fields too); a 400 for a model without FIM tokens.
* ``GET /props`` -- ``default_generation_settings`` (``n_ctx`` and the
  ``params`` a field left out takes), ``total_slots`` (replies decoded
  together), ``model_path``, ``model_alias``, ``chat_template``.

Timings are Brisk's own measurements of the reply (``engine.api.Metrics``), in
llama.cpp's names; the ``brisk`` field carries them all.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.api import (
    MAX_TOP_LOGPROBS,
    Done,
    Error,
    Logprob,
    PrefillProgress,
    Request,
    Sampling,
    Started,
    Token,
)
from engine.server import infill, shapes
from engine.server.live import Live, timings
from engine.server.shapes import ApiError, bad
from engine.server.vocab import Model, Vocab

if TYPE_CHECKING:
    from engine.server.app import Handlers

INFILL_FIELDS = frozenset({"input_prefix", "input_suffix", "input_extra"})
# what editors send to /infill besides /completion's fields (llama.vim, llama.vscode)
EDITOR_FIELDS = frozenset({"samplers", "t_max_prompt_ms", "response_fields"})
IN_INFILL = frozenset({"n_indent", "t_max_predict_ms", "id_slot"})  # in OFF, taken at any value on /infill
# llama.cpp's sampler names (and aliases) for the samplers Brisk has
SAMPLERS = {
    "top_k": "top_k",
    "top-k": "top_k",
    "top_p": "top_p",
    "top-p": "top_p",
    "nucleus": "top_p",
    "temperature": "temperature",
    "temp": "temperature",
    "penalties": "penalties",
}
RANDOM_SEEDS = (-1, 0xFFFFFFFF)  # llama.cpp's "pick a random seed" (its /props shows the second)
MAX_STOPS = 16
REPEAT_WINDOW = 64  # Brisk's repetition penalty counts the reply's last 64 tokens (engine.runtime.sampling)
TAKEN = frozenset(
    {
        "prompt",
        "n_predict",
        "stream",
        "stop",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "repeat_penalty",
        "repeat_last_n",
        "cache_prompt",
        "json_schema",
        "grammar",
        "return_tokens",
        "model",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "n_probs",
        "return_progress",
        "timings_per_token",
    }
)
# llama.cpp's fields for what Brisk does not have, each at the value that turns it off: a client that sends
# its defaults (SillyTavern sends most of them) is served; any other value is a 400 that names the field
OFF: dict[str, Any] = {
    "min_p": 0,
    "typical_p": 1,
    "typ_p": 1,
    "tfs_z": 1,
    "top_n_sigma": -1,
    "mirostat": 0,
    "dry_multiplier": 0,
    "xtc_probability": 0,
    "dynatemp_range": 0,
    "ignore_eos": False,
    "n_keep": 0,
    "n_indent": 0,
    "n_cmpl": 1,
    "t_max_predict_ms": 0,
    "id_slot": -1,
    "post_sampling_probs": False,
    "lora": [],
}
_OFF_WHY = {
    "min_p": "Brisk's sampler has temperature, top_k and top_p",
    "n_cmpl": "send one request per completion (they are decoded together)",
}


def routes(handlers: Handlers) -> list[Route]:
    api = LlamaApi(handlers)
    return [
        Route("/completion", api.completion, methods=["POST"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/apply-template", api.apply_template, methods=["POST"]),
        Route("/props", api.props, methods=["GET"]),
        Route("/slots", api.slots, methods=["GET"]),
        Route("/chat/completions/input_tokens", api.input_tokens, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", api.input_tokens, methods=["POST"]),
        Route("/infill", api.infill, methods=["POST"]),
    ]


@dataclass(frozen=True)
class Asked:
    """One ``/completion`` request as read: what goes to the engine and how to answer."""

    request: Request
    prompt: str  # the prompt's text (token ids decoded)
    stream: bool
    return_tokens: bool
    settings: dict[str, Any]  # llama.cpp's generation_settings, as taken
    progress: bool = False  # return_progress: prompt_progress chunks before the first token (streamed)
    per_token: bool = False  # timings_per_token: timings on every streamed chunk


@dataclass(frozen=True)
class Edit:
    """What ``/infill`` does to a finished reply: llama-server's ``n_indent`` cut, and an empty reply for
    ``n_predict`` 0 (the one token Brisk decoded to read the prompt not given)."""

    n_indent: int = 0
    warm_only: bool = False

    def apply(self, result: dict[str, Any]) -> None:
        if self.warm_only:
            result.update(content="", tokens=[], tokens_predicted=0, stop_type="limit", has_new_line=False)
            result["timings"] = {**result["timings"], "predicted_n": 0}
            return
        text, cut = infill.cut_indent(result["content"], self.n_indent)
        if cut:
            result.update(content=text, stop_type="limit", stopping_word="", has_new_line="\n" in text)


class LlamaApi:
    def __init__(self, handlers: Handlers) -> None:
        self.h = handlers
        self.s = handlers.s

    # -- the loaded model's tokenizer -----------------------------------------------------------------------
    async def _model(self) -> Model:
        self.h.chat_model({})  # a 503 while no model is loaded
        model = await asyncio.to_thread(self.s.vocab.model) if self.s.vocab is not None else None
        if model is None:
            raise ApiError(
                503,
                "This server has no local model's tokenizer to use (a remote engine, or a load under way).",
                code="model_not_loaded",
            )
        return model

    async def _body(self, http: HttpRequest, fields: frozenset[str], endpoint: str) -> dict[str, Any]:
        from engine.server.app import read_json

        self.h.check_key(http)
        body = await read_json(http, self.s.max_body)
        shapes.checked_fields(body, fields, endpoint, habits=frozenset())  # llama.cpp's clients: no habits listed
        return body

    async def tokenize(self, http: HttpRequest) -> Response:
        body = await self._body(
            http, frozenset({"content", "add_special", "parse_special", "with_pieces"}), "/tokenize"
        )
        content = body.get("content")
        if not isinstance(content, str):
            raise bad("'content' must be the text to tokenize.", "content", "invalid_type")
        add_special = _flag(body, "add_special", False)
        parse_special = _flag(body, "parse_special", True)
        pieces = _flag(body, "with_pieces", False)
        model = await self._model()

        def run() -> list[Any]:
            ids = Vocab.tokenize(model, content, add_special, parse_special)
            return [{"id": i, "piece": Vocab.piece(model, i)} for i in ids] if pieces else ids

        return JSONResponse({"tokens": await asyncio.to_thread(run)})

    async def detokenize(self, http: HttpRequest) -> Response:
        body = await self._body(http, frozenset({"tokens"}), "/detokenize")
        model = await self._model()
        ids = _token_ids(body.get("tokens", []), len(model.tokenizer), "tokens")
        return JSONResponse({"content": await asyncio.to_thread(Vocab.detokenize, model, ids)})

    async def apply_template(self, http: HttpRequest) -> Response:
        fields = frozenset({"messages", "tools", "model", "add_generation_prompt"})
        body = await self._body(http, fields, "/apply-template")
        messages = list(shapes.messages_from(body.get("messages")))
        tools = [dict(t) for t in shapes.tools_from({"tools": body.get("tools") or []})[0]] or None
        generation = _flag(body, "add_generation_prompt", True)
        model = await self._model()
        try:
            text = await asyncio.to_thread(Vocab.template_text, model, messages, tools, generation)
        except ValueError as exc:  # a template that fails or runs too long (engine.model.template)
            raise bad(str(exc), "messages", "template_error") from None
        return JSONResponse({"prompt": text})

    async def input_tokens(self, http: HttpRequest) -> Response:
        """llama-server's ``/chat/completions/input_tokens``: a chat body's prompt, counted as the engine
        builds it (the template, the client's tools), as ``{"input_tokens": N}``; nothing is generated."""
        self.h.check_key(http)
        from engine.server.app import read_json

        body = await read_json(http, self.s.max_body)
        name = self.h.chat_model(body)
        request, _ = shapes.chat_request(body, name, self.s.defaults, self.s.context, self.s.speculative)
        await self._model()  # a 503 without a local tokenizer
        ids = await asyncio.to_thread(self.s.vocab.prompt_ids, request) if self.s.vocab is not None else None
        if ids is None:
            raise bad("The prompt cannot be built for this model (see /apply-template).", "messages")
        return JSONResponse({"input_tokens": len(ids)})

    async def slots(self, http: HttpRequest) -> Response:
        """llama-server's ``GET /slots``: Brisk's batch as ``MAX_ACTIVE`` slots, as many processing as there are
        requests in flight (Brisk gives a request no fixed slot: slot i is the i-th running one)."""
        from engine.runtime.batching import MAX_ACTIVE

        self.h.check_key(http)
        model = await self._model()
        running, _, _ = self.s.hub.log.snapshot()
        context = self.s.context or model.context
        params = generation_settings(self.s.defaults, context, False, self.s.model or "")
        return JSONResponse(
            [
                {"id": i, "id_task": -1, "n_ctx": context, "is_processing": i < len(running), "params": params}
                for i in range(MAX_ACTIVE)
            ]
        )

    async def props(self, http: HttpRequest) -> Response:
        from engine.runtime.batching import MAX_ACTIVE

        self.h.check_key(http)
        model = await self._model()
        running, _, _ = self.s.hub.log.snapshot()
        template = model.tokenizer.chat_template
        if isinstance(template, dict):  # several named templates: the one a reply renders with
            template = template.get("default") or next(iter(template.values()), "")
        return JSONResponse(
            {
                "default_generation_settings": {
                    "id": 0,
                    "id_task": -1,
                    "n_ctx": self.s.context or model.context,
                    "speculative": self.s.speculative != "off",
                    "is_processing": bool(running),
                    "params": generation_settings(
                        self.s.defaults, self.s.context or model.context, False, self.s.model or ""
                    ),
                },
                "total_slots": MAX_ACTIVE,
                "model_path": model.source,
                "model_alias": self.s.model,
                "chat_template": template or "",
                "modalities": {"vision": False, "audio": False},
                "build_info": "brisk",
                "is_sleeping": False,
            }
        )

    # -- /completion ---------------------------------------------------------------------------------------
    async def completion(self, http: HttpRequest) -> Response:
        body = await self._body(http, TAKEN | OFF.keys() | {"samplers", "response_fields"}, "/completion")
        name = self.h.chat_model(body)
        ignored: list[str] = []
        rest = {k: v for k, v in body.items() if k not in ("samplers", "response_fields")}
        rest.update(self._samplers(body.get("samplers"), ignored))
        fields = _response_fields(body.get("response_fields"))
        return await self.answer(http, await self.read(rest, name), name, "/completion", None, fields)

    async def infill(self, http: HttpRequest) -> Response:
        """``/infill``: the code around the cursor in the model's FIM tokens (``engine.server.infill``), then
        as ``/completion`` (whose fields it takes; ``prompt`` is the start of the cursor's line), with what
        llama.vim and llama.vscode send besides: ``n_indent`` (the reply ends at a line indented less),
        ``n_predict`` 0 (only read the prompt into the cache: llama.vim's ring of chunks), and
        ``t_max_prompt_ms``, ``t_max_predict_ms`` and ``id_slot``, taken and named in X-Brisk-Ignored."""
        body = await self._body(http, TAKEN | OFF.keys() | INFILL_FIELDS | EDITOR_FIELDS, "/infill")
        name = self.h.chat_model(body)
        model = await self._model()
        fim = infill.fim_tokens(model.tokenizer)
        if fim is None:
            raise bad(
                f"The model {name!r} has no fill-in-the-middle tokens, so it cannot infill; load a code model "
                "that has them (Qwen2.5-Coder: <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), or send the "
                "code as a /completion prompt.",
                None,
                "model_cannot_infill",
            )
        texts: dict[str, str] = {}
        for field in ("input_prefix", "input_suffix", "prompt"):
            value = body.get(field)
            if value is not None and not isinstance(value, str):
                raise bad(f"'{field}' must be a text.", field, "invalid_type")
            texts[field] = value or ""
        try:
            extra = infill.chunks_from(body.get("input_extra"))
        except ValueError as exc:
            raise bad(str(exc), "input_extra", "invalid_type") from None
        # no deadline in Brisk's request options, one slot per reply: these are taken and said
        ignored = [f for f in ("t_max_prompt_ms", "t_max_predict_ms") if body.get(f) not in (None, 0)]
        ignored += ["id_slot"] if body.get("id_slot") not in (None, -1) else []
        n_indent = shapes.whole(body, "n_indent", 0, 1 << 16) or 0
        warm_only = body.get("n_predict") == 0  # llama.vim's chunk request: read the prompt, write nothing
        rest = {k: v for k, v in body.items() if k not in INFILL_FIELDS and k not in EDITOR_FIELDS | IN_INFILL}
        if warm_only:
            rest["n_predict"] = 1
        context = self.s.context or model.context

        def ids() -> list[int]:
            return infill.fim_ids(
                model.tokenizer, fim, texts["input_prefix"], texts["input_suffix"], texts["prompt"], extra, context
            )

        prompt_ids = await asyncio.to_thread(ids)
        text = await asyncio.to_thread(Vocab.detokenize, model, prompt_ids)
        rest.update(self._samplers(body.get("samplers"), ignored, infill=True))
        asked = await self.read({**rest, "prompt": text}, name, prompt_ids)
        if n_indent and asked.stream:
            ignored.append("n_indent")
        edit = Edit(n_indent=0 if asked.stream else n_indent, warm_only=warm_only)
        fields = _response_fields(body.get("response_fields"))
        return await self.answer(http, asked, name, "/infill", edit, fields, tuple(ignored))

    @staticmethod
    def _samplers(value: Any, ignored: list[str], infill: bool = False) -> dict[str, Any]:
        """llama.cpp's ``samplers``: the ones Brisk has (top_k, top_p, temperature, penalties), each left out
        turned off, as llama.cpp leaves it out of its chain (then it samples at temperature 1); ``infill``
        (llama.cpp's sampler for FIM) on ``/infill`` taken and said in X-Brisk-Ignored; any other a 400."""
        if value is None:
            return {}
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("'samplers' must be a list of sampler names.", "samplers", "invalid_type")
        named = set()
        for sampler in value:
            if sampler in SAMPLERS:
                named.add(SAMPLERS[sampler])
            elif sampler == "infill" and infill:
                ignored.append("samplers: infill")
            else:
                raise bad(
                    f"The sampler {sampler!r} is not supported here: Brisk has top_k, top_p, temperature and "
                    "penalties (repeat_penalty).",
                    "samplers",
                    "unsupported_value",
                )
        off = {"top_k": ("top_k", 0), "top_p": ("top_p", 1.0), "temperature": ("temperature", 1.0)}
        out = {field: value for name, (field, value) in off.items() if name not in named}
        if "penalties" not in named:
            out["repeat_penalty"] = 1.0
        return out

    async def answer(
        self,
        http: HttpRequest,
        asked: Asked,
        name: str,
        endpoint: str,
        edit: Edit | None = None,
        fields: list[str] | None = None,
        ignored: tuple[str, ...] = (),
    ) -> Response:
        from engine.server.app import ignored_header

        headers = ignored_header(ignored)
        stream = self._stream(asked, name) if asked.stream else None
        out = await self.h.run(http, asked.request, endpoint, stream, headers=headers, marker=False)
        if isinstance(out, Response):
            return out
        ids = [i for t in out.tokens for i in t.ids]
        result = await self.result(asked, name, out.done, ids, stream=False)
        if asked.request.sampling.logprobs:
            result["completion_probabilities"] = probabilities(shapes.logprobs_of(out.tokens))
        if edit is not None:
            edit.apply(result)
        if fields is not None:  # llama.cpp: only the fields asked for, each keyed by its path
            result = infill.nested(fields, result)
        return JSONResponse(result, headers=headers)

    async def read(self, body: Mapping[str, Any], name: str, prompt_ids: list[int] | None = None) -> Asked:
        for field, off in OFF.items():
            if field in body and body[field] is not None and not _same(body[field], off):
                why = _OFF_WHY.get(field, "Brisk has no such sampler")
                raise bad(
                    f"'{field}' {body[field]!r} is not supported here ({why}); send {off!r} or leave it out.",
                    field,
                    "unsupported_value",
                )
        text, ids = _prompt(body.get("prompt"))
        model = await asyncio.to_thread(self.s.vocab.model) if self.s.vocab is not None else None
        if ids is not None:  # token ids: served as their text, when the tokenizer gives exactly them back
            if model is None:
                raise ApiError(503, "A prompt of token ids needs the local model's tokenizer.", "prompt")
            checked = _token_ids(ids, len(model.tokenizer), "prompt")
            text = await asyncio.to_thread(Vocab.detokenize, model, checked)
            if await asyncio.to_thread(lambda: list(model.tokenizer(text)["input_ids"])) != checked:
                raise bad(
                    "These token ids are not what this model's tokenizer makes of their text, and Brisk reads a "
                    "prompt as text; send the prompt as text (or ids from /tokenize with add_special true).",
                    "prompt",
                )
        shapes.within_context(1, len(text), self.s.context, "prompt")
        sampling = await self._sampling(body, model, text)
        await self.h.biased_within_vocab(sampling)
        if prompt_ids is not None and self.s.context and len(prompt_ids) + sampling.max_tokens > self.s.context:
            raise bad(
                f"The infill prompt is {len(prompt_ids)} tokens and 'n_predict' {sampling.max_tokens}: more "
                f"than the context of {self.s.context} tokens; send less code around the cursor.",
                "input_prefix",
                "context_length_exceeded",
            )
        stream = _flag(body, "stream", False)
        request = Request(
            shapes.new_id("srv"),
            ({"role": "user", "content": text},),
            sampling,
            prefix_cache=_flag(body, "cache_prompt", True),
            speculative=self.s.speculative,
            raw=True,
            answer_cache=not sampling.logprobs,  # a cached answer keeps no probabilities
            origin="server",
            prompt_ids=tuple(prompt_ids or ()),
        )
        settings = generation_settings(sampling, self.s.context, stream, name)
        return Asked(
            request,
            text,
            stream,
            _flag(body, "return_tokens", False),
            settings,
            progress=_flag(body, "return_progress", False),
            per_token=_flag(body, "timings_per_token", False),
        )

    async def _sampling(self, body: Mapping[str, Any], model: Model | None, text: str) -> Sampling:
        d = self.s.defaults
        temperature = _real(body, "temperature", d.temperature)
        penalty = _real(body, "repeat_penalty", d.repetition_penalty)
        if penalty <= 0:
            raise bad("'repeat_penalty' must be above 0 (1 = off).", "repeat_penalty")
        window = body.get("repeat_last_n")
        if window is not None and penalty != 1.0 and not _same(window, REPEAT_WINDOW):
            raise bad(
                f"'repeat_last_n' must be {REPEAT_WINDOW} here: Brisk's repetition penalty counts the reply's "
                f"last {REPEAT_WINDOW} tokens.",
                "repeat_last_n",
                "unsupported_value",
            )
        top_k = shapes.whole(body, "top_k", 0, 1 << 20)
        probs = shapes.whole(body, "n_probs", 0, MAX_TOP_LOGPROBS)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise bad(f"'seed' must be a whole number, not {seed!r}.", "seed", "invalid_type")
        return replace(
            d,
            temperature=max(0.0, temperature),  # llama.cpp: below 0 is greedy
            top_k=d.top_k if top_k is None else top_k,  # 0: off, in both
            top_p=shapes.number(body, "top_p", 0.0, 1.0, d.top_p) or d.top_p,
            repetition_penalty=penalty,
            seed=None if seed is None or seed in RANDOM_SEEDS else seed % 2**63,
            max_tokens=await self._limit(body, model, text),
            stop=_stops(body.get("stop")),
            format=shapes.grammar_format(body),
            presence_penalty=shapes.number(body, "presence_penalty", -2.0, 2.0, 0.0),
            frequency_penalty=shapes.number(body, "frequency_penalty", -2.0, 2.0, 0.0),
            logit_bias=_bias(body.get("logit_bias"), model),
            logprobs=bool(probs),
            top_logprobs=probs or 0,
        )

    async def _limit(self, body: Mapping[str, Any], model: Model | None, text: str) -> int:
        """``n_predict`` as ``max_tokens``: -1 or left out, the rest of the context after the prompt."""
        limit = body.get("n_predict")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < -1):
            raise bad(f"'n_predict' must be a whole number, -1 or more, not {limit!r}.", "n_predict")
        if limit == 0:
            raise bad(
                "'n_predict' 0 (only read the prompt into the cache) is not supported; send 1 or more.", "n_predict"
            )
        context = self.s.context
        if limit is not None and limit > 0:
            if context and limit > context:
                raise bad(f"'n_predict' {limit} is more than the model's context of {context} tokens.", "n_predict")
            return limit
        if model is None or not context:
            return self.s.defaults.max_tokens
        prompt = await asyncio.to_thread(lambda: len(model.tokenizer(text)["input_ids"]))
        return max(1, context - prompt)

    # -- answers -------------------------------------------------------------------------------------------
    def _stream(self, asked: Asked, name: str) -> Any:
        def piece(text: str, tokens: list[int], predicted: int, evaluated: int) -> dict[str, Any]:
            return {
                "index": 0,
                "content": text,
                "tokens": tokens,
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": predicted,
                "tokens_evaluated": evaluated,
            }

        async def chunks(started: Started | None, events: asyncio.Queue[Any]) -> AsyncIterator[dict[str, Any]]:
            evaluated = started.prompt_tokens if started is not None else 0
            ids: list[int] = []
            live = Live(started)
            progress = live.start() if asked.progress else None
            while True:
                if progress is not None:  # llama.cpp's progress piece: no text, no token
                    chunk = {**piece("", [], 0, evaluated), "prompt_progress": progress}
                    yield {**chunk, "timings": live.timings()} if asked.per_token else chunk
                event = await events.get()
                progress = live.prefilled(event) if isinstance(event, PrefillProgress) else None
                progress = progress if asked.progress else None
                if isinstance(event, Token) and (event.text or event.ids):
                    ids.extend(event.ids)
                    live.token(event)
                    chunk = piece(event.text, list(event.ids), len(ids), evaluated)
                    if asked.request.sampling.logprobs:
                        chunk["completion_probabilities"] = probabilities(list(event.logprobs))
                    if asked.per_token:
                        chunk["timings"] = live.timings()
                    yield chunk
                elif isinstance(event, Done):
                    event = replace(event, metrics=await self.h.counted(asked.request, event.metrics))
                    yield await self.result(asked, name, event, ids, stream=True)
                    return
                elif isinstance(event, Error):
                    yield ApiError(500, event.message, code="engine_error").body()
                    return

        return chunks

    async def result(self, asked: Asked, name: str, done: Done, ids: list[int], stream: bool) -> dict[str, Any]:
        """The last (or only) object of a ``/completion`` answer, in llama.cpp's fields."""
        stop_type, word = await self._stop_type(asked, done, ids)
        m = done.metrics
        return {
            "index": 0,
            "content": "" if stream else done.text,
            "tokens": ids if asked.return_tokens and not stream else [],
            "id_slot": 0,
            "stop": True,
            "model": name,
            "tokens_predicted": m.completion_tokens,
            "tokens_evaluated": m.prompt_tokens,
            "generation_settings": asked.settings,
            "prompt": asked.prompt,
            "has_new_line": "\n" in done.text,
            "truncated": m.truncated,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": m.cached_tokens,
            "timings": timings(m),
            "brisk": shapes.brisk_figures(m),
        }

    async def _stop_type(self, asked: Asked, done: Done, ids: list[int]) -> tuple[str, str]:
        """llama.cpp's ``stop_type`` and ``stopping_word``: the reply's limit, one of the stop texts (found
        after the text the reply was cut at), or the model's end of turn."""
        if done.finish_reason != "stop":
            return "limit", ""
        stops = asked.request.sampling.stop
        model = await asyncio.to_thread(self.s.vocab.model) if stops and self.s.vocab is not None else None
        if model is not None:
            whole = await asyncio.to_thread(lambda: str(model.tokenizer.decode(ids, skip_special_tokens=True)))
            rest = whole[len(done.text) :] if whole.startswith(done.text) else ""
            for stop in stops:
                if rest.startswith(stop):
                    return "word", stop
        return "eos", ""


def generation_settings(sampling: Sampling, context: int, stream: bool, model: str) -> dict[str, Any]:
    """llama.cpp's ``generation_settings`` for what Brisk samples with (its off values for what it lacks)."""
    return {
        "n_ctx": context,
        "n_predict": sampling.max_tokens,
        "model": model,
        "seed": sampling.seed if sampling.seed is not None else RANDOM_SEEDS[1],
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": sampling.repetition_penalty,
        "repeat_last_n": REPEAT_WINDOW,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "mirostat": 0,
        "stop": list(sampling.stop),
        "max_tokens": sampling.max_tokens,
        "n_keep": 0,
        "ignore_eos": False,
        "stream": stream,
        "n_probs": sampling.top_logprobs,
        "logit_bias": [[token, bias] for token, bias in sampling.logit_bias],
        "grammar": "",
        "samplers": ["penalties", "top_k", "top_p", "temperature"],
    }


def probabilities(numbers: list[Logprob]) -> list[dict[str, Any]]:
    """llama.cpp's ``completion_probabilities`` (``n_probs``): each token with its ``top_logprobs``."""

    def one(lp: Logprob) -> dict[str, Any]:
        return {"id": lp.id, "token": lp.token, "bytes": list(lp.bytes), "logprob": lp.logprob}

    return [{**one(lp), "top_logprobs": [one(alt) for alt in lp.top]} for lp in numbers]


def _bias(value: Any, model: Model | None) -> tuple[tuple[int, float], ...]:
    """llama.cpp's ``logit_bias``: ``[[id, bias], ...]`` or ``{"id": bias}``, a bias of ``false`` a ban (-100);
    a key that is a text (``[" the ", -100]``) biases each of its tokens, as llama-server does."""
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, list) or not all(isinstance(p, list | tuple) and len(p) == 2 for p in pairs):
        raise bad("'logit_bias' must be [[token id, bias], ...] or {\"token id\": bias}.", "logit_bias")
    as_openai: dict[str, Any] = {}
    for token, bias in pairs:
        if isinstance(token, str) and not token.strip().isdigit():
            if model is None:
                raise bad(f"'logit_bias' takes token ids here, not texts ({token!r}).", "logit_bias")
            for i in Vocab.tokenize(model, token, False, True):
                as_openai[str(i)] = -100 if bias is False else bias
            continue
        as_openai[str(token)] = -100 if bias is False else bias
    return shapes.bias_from(as_openai)


# -- reading fields ------------------------------------------------------------------------------------------


def _response_fields(value: Any) -> list[str] | None:
    if value is None or value == []:  # llama-server: an empty list is every field
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad("'response_fields' must be a list of field paths (\"timings/prompt_n\").", "response_fields")
    return list(value)


def _same(value: Any, off: Any) -> bool:
    if isinstance(off, bool) or isinstance(value, bool):
        return value is off
    if isinstance(off, list):
        return value in ([], {})
    return isinstance(value, int | float) and value == off


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be true or false, not {value!r}.", name, "invalid_type")
    return value


def _real(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"'{name}' must be a number, not {value!r}.", name, "invalid_type")
    return float(value)


def _prompt(value: Any) -> tuple[str, list[Any] | None]:
    """The prompt as text, or (``""``, its token ids) when it is a list of ids; llama-server's JSON prompt
    ``{"prompt_string": ...}`` is its text (``multimodal_data``, for a model with vision, a 400 here)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list | dict):
        value = value[0]
    if isinstance(value, dict):
        if value.get("multimodal_data"):
            raise bad("'prompt.multimodal_data' needs a model with vision; this one reads text.", "prompt")
        unknown = sorted(set(value) - {"prompt_string", "multimodal_data"})
        if unknown or not isinstance(value.get("prompt_string"), str):
            raise bad("A JSON 'prompt' must be {\"prompt_string\": text}.", "prompt", "invalid_type")
        value = value["prompt_string"]
    if isinstance(value, str):
        if not value:
            raise bad("'prompt' is empty.", "prompt")
        return value, None
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return "", value
    raise bad(
        "'prompt' must be one text or one list of token ids (several prompts, and ids mixed with text, are not "
        "supported).",
        "prompt",
    )


def _token_ids(value: Any, vocabulary: int, param: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise bad(f"'{param}' must be a list of token ids.", param, "invalid_type")
    wrong = [i for i in value if not 0 <= i < vocabulary]
    if wrong:
        raise bad(f"'{param}' holds {wrong[0]}, not a token id of this model (0 to {vocabulary - 1}).", param)
    return list(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("'stop' must be a list of non-empty texts.", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad(f"'stop' takes at most {MAX_STOPS} texts, not {len(stops)}.", "stop")
    return tuple(stops)
