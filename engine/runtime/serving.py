"""Serving one request on the engine thread: prompt, draft sources, prefix cache, decode, tools, ``Done``.

:class:`Serving` is the request path: a plain object given the engine's
:class:`Resources` (the model, its caches and the rest a reply is made with;
the engine switches the model's part at a load).  The scheduler
(``engine.runtime.scheduler``) calls ``serve(request, reply, cancelled)`` in a
greenlet of the batch; it ends the request with exactly one ``Done`` or ``Error``
whatever raises (an ``Error`` carries the text streamed so far); a request
that arrives before a model is loaded, or with invalid values, gets an
``Error`` before any prefill.  Each model round looks the prompt up in the
prefix cache (preferring the conversation's own entry), prefills and decodes
through ``engine.runtime.decode``, then keeps the conversation's KV and its
system prompt's KV under a key of its own (saved to disk for a warm restart
when ``persist_prefixes``); a cache that cannot be kept is a
``Warning("cache", ...)``, never the reply's end.  Tools
(``engine.runtime.tool_turns``): the user's ``/NAME`` lines run first, then
the model's calls, for at most ``ToolSettings.max_rounds`` rounds of up to
``max_tokens`` each.  After ``Done`` a complete reply without tools goes to
the answer cache (else to the draft memory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import traceback
from collections.abc import Callable
from typing import Any

from engine.answer_cache import ModelIdentity
from engine.api import SOURCES, Done, Metrics, Request, Sampling, Started, Token, Warning
from engine.model.kv import KVState, common_prefix
from engine.model.loader import LoadedModel
from engine.model.template import template_switches, thinking_switches
from engine.runtime import batching, tool_turns
from engine.runtime.answer_lookup import AnswerLookup, said
from engine.runtime.answers import AnswerMemory
from engine.runtime.decode import Decoder, DecodeResult
from engine.runtime.hints import HINT_CHARS_PER_TOKEN, Hints, hint_tokens
from engine.runtime.loading import kv_file
from engine.runtime.options import EngineOptions, request_problems
from engine.runtime.prefix_cache import HINT, PERSISTED, PrefixCache, kv_layout
from engine.runtime.prompt import OVERFLOW, Prompt, build_prompt, has_system_role, prompt_budget, raw_prompt, render
from engine.runtime.prompt_documents import (
    MARGIN,
    PROMPT_SHARE,
    WHOLE_SHARE,
    Applied,
    Documents,
    document_key,
    document_kv_file,
)
from engine.runtime.reply_events import ReplyEvents
from engine.runtime.reply_metrics import request_metrics
from engine.runtime.speculative import AnswerDrafts, Drafter, DraftModel, HistoryDrafts, HistoryIndex, PromptLookup
from engine.runtime.tool_turns import Rounds, ToolBox
from engine.tools import Parsed

CONVERSATION = "conv:"  # the key prefix of a conversation's own (live) prefix cache entry


def conversation_key(conversation_id: str) -> str:
    """The prefix cache key of a conversation's own (live) entry."""
    return f"{CONVERSATION}{conversation_id}"


def system_key(tokens: list[int]) -> str:
    """The prefix cache key of a system prompt's entry (saved to disk: it starts with ``PERSISTED``)."""
    return PERSISTED + hashlib.sha256(str(tokens).encode()).hexdigest()[:16]


@dataclasses.dataclass
class Prepared:
    """A request's documents and prompt as a hint rendered them (``Engine._start_hint``), for its Send."""

    key: str  # ``Serving.request_key`` of the request
    tokenizer: Any
    applied: Applied | None
    prompt: Prompt


@dataclasses.dataclass
class Resources:
    """What requests are served with.  The engine sets the model's part (``loaded`` to ``draft``) at a load and
    the memories at a change of tokenizer; everything runs on the engine thread."""

    options: EngineOptions
    tools: ToolBox
    answer_lookup: AnswerLookup
    hints: Hints
    documents: Documents
    loaded: LoadedModel | None = None
    identity: ModelIdentity | None = None  # the loaded model, as the answer cache knows it
    decoder: Decoder | None = None
    prefix_cache: PrefixCache | None = None
    draft: DraftModel | None = None
    answers: AnswerMemory = dataclasses.field(default_factory=AnswerMemory)  # seeded and uncached replies
    history: HistoryIndex = dataclasses.field(default_factory=HistoryIndex)  # every reply's n-grams


class Serving:
    """The request path over ``res``; events go to ``on_event``."""

    def __init__(self, res: Resources, on_event: Callable[[object], None]) -> None:
        self.res = res
        self.on_event = on_event
        self.prepared: Prepared | None = None  # the last hint's rendering of its request: see _prepare
        self._base_memo: tuple[Any, str, list[int]] | None = None  # (tokenizer, messages, their prompt): _base_ids

    def serve(self, request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        """Serve ``request`` to its end; ``cancelled()`` says whether it was cancelled (looked at every step)."""
        try:
            if not reply.muted:  # the answer cache answered it while it waited
                with self._switches(request):  # the chat's thinking choice, for every render of its prompts
                    self._serve_checked(request, reply, cancelled)
        except Exception as exc:  # whatever raised, the request ends with one Error
            traceback.print_exc()
            if self.res.draft is not None:
                self.res.draft.state = KVState()  # a step that failed half-way may have left its KV uneven
            reply.fail(
                f"The reply failed ({type(exc).__name__}: {exc}). Try again; if it keeps failing, "
                "reload the model or pick another in Settings."
            )

    def _serve_checked(self, request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        t_taken = reply.since()
        if self.res.loaded is None or self.res.decoder is None or self.res.prefix_cache is None:
            reply.fail("No model is loaded yet. Wait for loading to finish or pick a model in Settings.")
            return
        problems = request_problems(request)
        if problems:
            reply.fail("Cannot send this request: " + "; ".join(problems) + ".")
            return
        view, schemas = self._tool_view(request)
        messages: list[dict[str, Any]] = list(request.messages)
        applied: Applied | None = None
        try:
            if request.raw:
                text, context = messages[0]["content"], self.res.loaded.context_length
                if request.prompt_ids:  # the server's own tokens (/infill), kept whole: it checked they fit
                    prompt = Prompt(list(request.prompt_ids), False, 0)
                else:
                    prompt = raw_prompt(self.res.loaded.tokenizer, text, context, request.sampling.max_tokens)
            else:
                applied, prompt = self._prepare(request, messages, schemas)
            messages, whole = with_applied(applied, messages)
            drafters = self._drafters(request, len(prompt.ids))
        except ValueError as exc:
            reply.fail(str(exc))
            return
        first_prompt = prompt
        t_prompt = reply.since()
        rounds = Rounds()
        started = False
        kept, calls = tool_turns.slash_calls(messages, view) if view is not None else ("", ())
        if view is not None and calls:  # the user's own /NAME lines run first; the model sees the results
            reply.emit(Started(request.id, t_prompt, len(prompt.ids), prompt.truncated, 0))
            started = True
            # the tools run away from the batch (on a thread of their own): its other requests keep streaming
            rounds.turns.append(
                batching.away(functools.partial(tool_turns.run_turn, calls, view, request, reply.emit, *self._fit()))
            )
            messages = tool_turns.with_slash_results(messages, kept, rounds.turns[-1])
            prompt = self._prompt(messages, request.sampling.max_tokens, schemas, whole)
            drafters = self._drafters(request, len(prompt.ids))
        first: Metrics | None = None
        model_turns, as_text = 0, False
        thinking: list[str] = []  # each round's thinking (Done.text holds the answers alone)
        while True:  # each round may write up to max_tokens; at most max_rounds rounds of tool calls
            result, lookup_at = self._decode(
                request, reply, prompt, request.sampling, drafters, started, cancelled, schemas
            )
            started = True
            rounds.decodes.append((result.metrics, lookup_at))
            thinking += [result.thinking] if result.thinking else []
            if first is None:
                first = request_metrics(result.metrics, t_taken, t_prompt, lookup_at, 0, prompt.truncated)
                first = dataclasses.replace(first, dropped=prompt.dropped)
            finish = result.finish_reason
            parsed = tool_turns.model_calls(result.text) if view is not None else Parsed(result.text)
            if (
                not parsed.calls
                or finish in ("cancelled", "context")
                or model_turns >= self.res.options.tools.max_rounds
            ):
                break
            assert view is not None
            model_turns += 1
            turn = batching.away(
                functools.partial(tool_turns.run_turn, parsed.calls, view, request, reply.emit, *self._fit())
            )
            rounds.turns.append(turn)
            if cancelled():
                finish = "cancelled"
                break
            reply.emit(Token(request.id, reply.since(), "\n\n"))  # the next round's text starts apart
            messages, prompt, as_text = tool_turns.next_prompt(
                lambda m: self._prompt(m, request.sampling.max_tokens, schemas, whole),
                messages,
                result.text,
                parsed,
                turn,
                as_text,
            )
            drafters = self._drafters(request, len(prompt.ids))
        assert first is not None
        metrics = dataclasses.replace(rounds.metrics(first), cache_bytes=self.res.prefix_cache.nbytes())
        text = result.text if len(rounds.decodes) == 1 else "".join(reply.text)
        if applied is not None:
            metrics = _with_document_metrics(metrics, applied, first_prompt, first.cached_tokens, text)
        if applied is not None:  # an index write: after the reply's tokens, not before its first
            self.res.documents.touch(applied.found_ids)
        with self.res.answer_lookup.keeping():  # a process that ends on this Done waits until it is kept
            reply.emit(Done(request.id, reply.since(), text, finish, metrics, "\n\n".join(thinking)))
            self._keep_answer(request, result, finish, rounds, metrics)  # before the next request is taken in

    def hint_tokens(self, request: Request) -> list[int]:
        """:meth:`_hint_tokens`, rendered with the chat's thinking choice (as its Send will be)."""
        with self._switches(request):
            return self._hint_tokens(request)

    def _switches(self, request: Request) -> contextlib.AbstractContextManager[None]:
        """The template's variables for ``request``'s thinking choice (``Request.thinking``), set while inside."""
        if self.res.loaded is None or request.raw:
            return contextlib.nullcontext()
        return template_switches(thinking_switches(self.res.loaded.tokenizer, request.thinking))

    def _hint_tokens(self, request: Request) -> list[int]:
        """The tokens of ``request``'s prompt that no keystroke in its last message can change (``Engine.hint``):
        none for an empty draft, one far longer than the context, or one that may not be sent.  Its rendering is
        kept for a Send of this very text (:meth:`_prepare`)."""
        loaded = self.res.loaded
        assert loaded is not None
        text = str(request.messages[-1].get("content", "")) if request.messages else ""
        # a draft far longer than the context can hold is cut at Send: nothing of it is stable, and rendering it
        # five times (hint_tokens' probes) would hold the interpreter, and the window, for most of a second a pause
        fits = len(text) <= loaded.context_length * HINT_CHARS_PER_TOKEN
        if not (fits and text.strip() and request.prefix_cache and not request_problems(request)):
            return []
        _view, schemas = self._tool_view(request)
        max_tokens = request.sampling.max_tokens
        refuses = request.overflow != OVERFLOW[0]  # a "stop" chat: a prompt that does not fit is never sent
        request = dataclasses.replace(request, overflow=OVERFLOW[0])  # a prompt that fits is the same either way
        # whole documents only: the passages depend on the words still being typed
        messages = list(request.messages)
        applied, prompt = self._render(request, messages, schemas, passages=False)
        if refuses and prompt.truncated:
            return []
        messages, whole = with_applied(applied, messages)
        tokens = hint_tokens(lambda m: prompt if m is messages else self._prompt(m, max_tokens, schemas, whole),
                             messages)  # fmt: skip
        # a Send of this very text takes this rendering (_prepare)
        self.prepared = Prepared(self.request_key(request, schemas), loaded.tokenizer, applied, prompt)
        if whole:  # a restart's document KV, read while the question is typed
            self._documents_kv(prompt)
        return tokens

    def _tool_view(self, request: Request) -> tuple[Any, list[dict[str, Any]] | None]:
        """The tools ``request`` may call, and their schemas for the chat template (None: no tools).  A reply
        and the draft prefilled before it (``Engine.hint``) render their prompts from the same schemas."""
        if request.client_tools:  # a server client's own tools: in the prompt, calls handed back, never run
            return None, [dict(tool) for tool in request.client_tools]
        view = self.res.tools.view(request.tools)
        return view, tool_turns.prompt_schemas(request, view, self.res.loaded)

    def _prompt(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int,
        schemas: list[dict[str, Any]] | None,
        documents: tuple[str, ...] = (),
        overflow: str = OVERFLOW[0],
    ) -> Prompt:
        """The prompt of ``messages``; ``documents``: the ids of the whole documents its system message holds;
        ``overflow``: the chat's policy when it outgrows the context (``Request.overflow``)."""
        assert self.res.loaded is not None
        context = self.res.loaded.context_length
        prompt = build_prompt(self.res.loaded.tokenizer, messages, context, max_tokens, schemas, overflow)
        return dataclasses.replace(prompt, documents=documents) if documents and prompt.system_tokens else prompt

    def request_key(self, request: Request, schemas: list[dict[str, Any]] | None) -> str:
        """What a request's documents and prompt are rendered from (the model's tokenizer aside): its messages,
        documents, tools and reply length, the context and the prefix cache's size (which documents fit whole)."""
        assert self.res.loaded is not None
        budget = self.res.prefix_cache.budget_bytes if self.res.prefix_cache is not None else 0
        parts = [request.messages, request.documents, schemas, request.sampling.max_tokens,
                 self.res.loaded.context_length, budget, request.thinking]  # fmt: skip
        return json.dumps(parts, sort_keys=True, default=str)

    def _prepare(
        self, request: Request, messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None
    ) -> tuple[Applied | None, Prompt]:
        """The request's documents and prompt: the last hint's rendering where it was of this very request
        (a Send of the text typed: the same messages, documents, tools and reply length, on the same model;
        every document whole and still in the index), else rendered now."""
        assert self.res.loaded is not None
        memo = self.prepared
        same = memo is not None and memo.tokenizer is self.res.loaded.tokenizer
        if (
            memo is None
            or not same
            or memo.key != self.request_key(request, schemas)
            or (memo.prompt.truncated and request.overflow != OVERFLOW[0])  # a hint's prompt drops the middle
        ):
            return self._render(request, messages, schemas)
        applied = memo.applied
        if applied is None:
            return None, memo.prompt
        indexed = set(applied.found_ids) == set(request.documents) and not applied.searched
        with contextlib.suppress(Exception):  # an index that cannot be read: rendered again, which says so
            store = self.res.documents.store()
            if indexed and all(store.get(doc_id) is not None for doc_id in applied.found_ids):
                return applied, memo.prompt
        return self._render(request, messages, schemas)

    def _render(
        self,
        request: Request,
        messages: list[dict[str, Any]],
        schemas: list[dict[str, Any]] | None,
        passages: bool = True,
    ) -> tuple[Applied | None, Prompt]:
        """The request's documents (``_with_documents``; ``passages`` False: a draft's) and its prompt."""
        applied = self._with_documents(request, messages, schemas, passages) if request.documents else None
        messages, whole = with_applied(applied, messages)
        return applied, self._prompt(messages, request.sampling.max_tokens, schemas, whole, request.overflow)

    def _with_documents(
        self,
        request: Request,
        messages: list[dict[str, Any]],
        schemas: list[dict[str, Any]] | None,
        passages: bool = True,
    ) -> Applied:
        """``messages`` with the request's documents (engine.runtime.prompt_documents), fitted to what the prompt
        leaves; a document that is gone is a warning (only for a reply: a draft being typed says nothing), an
        index that cannot be read a ``ValueError`` (the reply fails saying so)."""
        assert self.res.loaded is not None
        tokenizer, context = self.res.loaded.tokenizer, self.res.loaded.context_length
        budget = prompt_budget(context, request.sampling.max_tokens)
        base_ids = self._base_ids(messages, schemas)
        if len(base_ids) > budget and request.overflow == OVERFLOW[0]:  # the middle turns go for the documents
            newest = [m for m in messages[:-1][:1] if m["role"] == "system"] + messages[-1:]
            base_ids = self._base_ids(newest, schemas)
        room = budget - len(base_ids) - MARGIN
        whole_limit = min(int(budget * PROMPT_SHARE), self._cache_tokens(WHOLE_SHARE))
        try:
            applied = self.res.documents.apply(
                request.documents,
                messages,
                tokenizer,
                room,
                whole_limit,
                _question_vector,
                passages,
                into_user=not has_system_role(tokenizer),
            )
        except Exception as exc:
            if type(exc).__name__ != "StoreError":
                traceback.print_exc()
            raise ValueError(f"The attached documents could not be read ({exc}).") from exc
        for message in applied.warnings if passages else ():
            self.on_event(Warning("documents", message))
        applied.base_ids = base_ids
        return applied

    def _base_ids(self, messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None) -> list[int]:
        """The prompt of ``messages`` without documents (what they leave room for), the last one remembered:
        the hints of a draft and its Send ask for the same."""
        assert self.res.loaded is not None
        tokenizer = self.res.loaded.tokenizer
        key = json.dumps([messages, schemas], sort_keys=True, default=str)
        memo = self._base_memo
        if memo is not None and memo[0] is tokenizer and memo[1] == key:
            return list(memo[2])
        ids = render(tokenizer, messages, tools=schemas)
        self._base_memo = (tokenizer, key, list(ids))
        return ids

    def _cache_tokens(self, share: float) -> int:
        """How many positions of KV ``share`` of the prefix cache holds (a large number when not known)."""
        assert self.res.loaded is not None
        layout = kv_layout(self.res.loaded.model)
        cache = self.res.prefix_cache
        if layout is None or cache is None:
            return 1 << 30
        layers, heads, dim = layout
        itemsize = getattr(getattr(self.res.loaded.model, "dtype", None), "itemsize", 4) or 4
        return int(cache.budget_bytes * share) // max(1, 2 * layers * heads * dim * itemsize)

    def _documents_kv(self, prompt: Prompt) -> None:
        """Before a lookup: read the KV of the prompt's whole documents from disk when it is not in memory.
        A file that does not check out is deleted (the reply computes the KV again and saves a new one)."""
        cache = self.res.prefix_cache
        if not prompt.documents or cache is None or cache.budget_bytes <= 0 or self.res.loaded is None:
            return
        if not self.res.options.persist_prefixes:
            return
        key = document_key(prompt.ids[: prompt.system_tokens])
        if key in cache.entries:
            return
        path = document_kv_file(cache.identity, key)
        if path.is_file() and not cache.load_entry(path, key, kv_layout(self.res.loaded.model)):
            why = "; ".join(cache.load_problems) or f"{path.name} does not fit the prompt cache's size"
            if cache.load_problems:
                with contextlib.suppress(OSError):
                    path.unlink()
            self.on_event(Warning("cache", f"{why} (the documents are read again)."))

    def _fit(self) -> tuple[Any, int]:
        """What tool results are measured and cut against: the tokenizer and the context length."""
        assert self.res.loaded is not None
        return self.res.loaded.tokenizer, self.res.loaded.context_length

    def _drafters(self, request: Request, prompt_length: int) -> list[Drafter]:
        """The draft sources for this request, best first (``auto``: all that are available)."""
        source = request.speculative
        if source not in SOURCES:
            raise ValueError(f"Unknown speculative source {source!r}; choose one of {', '.join(SOURCES)}.")
        if source == "off":
            return []
        if source == "draft" and self.res.draft is None:
            raise ValueError("Speculative source 'draft' needs a draft model: set one in Settings or --draft-model.")
        drafters: list[Drafter] = []
        if source in ("auto", "answers"):
            similar = self._answer_drafts(str(request.messages[-1].get("content", "")))
            if similar:
                drafters.append(AnswerDrafts(similar, prompt_length))
        if source in ("auto", "lookup"):
            drafters.append(PromptLookup())
        if source == "auto" and len(self.res.history):
            drafters.append(HistoryDrafts(self.res.history))
        if source in ("auto", "draft") and self.res.draft is not None:
            drafters.append(self.res.draft)
        return drafters

    def _answer_drafts(self, question: str, limit: int = 3) -> list[list[int]]:
        """Earlier answers to similar questions: the answer cache's nearest, then seeded ones."""
        found: list[list[int]] = []
        if self.res.identity is not None:
            try:
                found = self.res.answer_lookup.drafts(question, self.res.identity, limit)
            except Exception:  # drafts only save time
                traceback.print_exc()
        for ids in self.res.answers.similar(question, limit):
            if ids not in found:
                found.append(ids)
        return found[:limit]

    def _decode(
        self,
        request: Request,
        reply: ReplyEvents,
        prompt: Prompt,
        sampling: Sampling,
        drafters: list[Drafter],
        started: bool,
        cancelled: Callable[[], bool],
        schemas: list[dict[str, Any]] | None = None,
    ) -> tuple[DecodeResult, float]:
        """One model round: cache lookup, prefill, decode (its events sent); returns its result and lookup end."""
        assert self.res.loaded is not None and self.res.decoder is not None and self.res.prefix_cache is not None
        conversation = conversation_key(request.conversation_id or request.id)
        state, known = KVState(), None
        if request.prefix_cache:
            self._documents_kv(prompt)
            # a draft prefilled to its end while typed, exactly this prompt: its last logits come with it
            found = self.res.prefix_cache.finished(prompt.ids)
            reuse = self.res.options.cache_reuse if request.raw else 0  # a chat's prompt only grows at its end
            model = self.res.loaded.model
            state, known = found or (self.res.prefix_cache.lookup(prompt.ids, conversation, reuse, model), None)
        typed = len(state) if request.prefix_cache and (self.res.prefix_cache.last_key or "").startswith(HINT) else 0
        # a draft this prompt holds is sent: its prefill is done with
        self.res.hints.sent(self.res.prefix_cache, prompt.ids)
        t_lookup, computed = reply.since(), state.computed
        if not started:
            reply.emit(Started(request.id, t_lookup, len(prompt.ids), prompt.truncated, len(state) - computed))
        result = None
        for item in self.res.decoder.stream(
            request.id,
            prompt.ids,
            state,
            sampling,
            cancelled,
            request.submitted_at,
            drafters,
            self.res.loaded.context_length,
            schemas,
            known,
            thinking=not request.raw,
        ):
            if isinstance(item, DecodeResult):
                result = item
            else:
                reply.emit(item)
        assert result is not None, "the decode stream ends with its result"
        if typed:
            result.metrics = dataclasses.replace(result.metrics, typed_tokens=typed)
        if computed:  # cache reuse computed these before the prefill (engine.runtime.prefix_cache): not cached
            m = result.metrics
            result.metrics = dataclasses.replace(
                m, cached_tokens=m.cached_tokens - computed, computed_tokens=m.computed_tokens + computed
            )
        if request.prefix_cache:
            try:
                self._remember(state, prompt.system_tokens, conversation, prompt.documents)
            except Exception as exc:  # a cache that cannot be kept costs speed next time, never the reply
                traceback.print_exc()
                self.on_event(Warning("cache", f"The prompt cache could not be saved ({exc}); replies still work."))
        return result, t_lookup

    def _remember(
        self, state: KVState, system_tokens: int, conversation_key: str, documents: tuple[str, ...] = ()
    ) -> None:
        """Keep this conversation's KV, and its system prompt's KV under a key of its own (with ``documents``:
        the prefix of whole documents, in a file of its own)."""
        cache = self.res.prefix_cache
        assert cache is not None
        if system_tokens and documents:
            self._remember_documents(state, system_tokens, documents)
        elif system_tokens:
            self._remember_system(state, system_tokens)
        cache.insert(conversation_key, state, live=True)

    def _remember_documents(self, state: KVState, system_tokens: int, documents: tuple[str, ...]) -> None:
        """Keep the prefix of whole documents; save it to a file of its own when no file holds it yet."""
        cache = self.res.prefix_cache
        assert cache is not None
        key = document_key(state.tokens[:system_tokens])
        cache.insert(key, state, system_tokens)
        path = document_kv_file(cache.identity, key)
        if self.res.options.persist_prefixes and key in cache.entries and not path.is_file():
            cache.save_entry(key, path, {"documents": json.dumps(sorted(documents))})

    def _remember_system(self, state: KVState, system_tokens: int) -> None:
        """Keep the first ``system_tokens`` of ``state`` as a system prompt's entry; save a new one to disk."""
        cache = self.res.prefix_cache
        assert cache is not None
        key = system_key(state.tokens[:system_tokens])
        is_new = key not in cache.entries
        cache.insert(key, state, system_tokens)
        if is_new and self.res.options.persist_prefixes and key in cache.entries:
            cache.save(kv_file(cache.identity))

    def _keep_answer(
        self, request: Request, result: DecodeResult, finish: str, rounds: Rounds, metrics: Metrics
    ) -> None:
        """After ``Done``: a complete reply without tools goes to the answer cache (else to the draft memory)."""
        if finish != "cancelled" and not rounds.tools_ran:
            self.res.history.add(result.ids)  # drafts for any later question
        # a raw prompt or a client's tools are not what the answer cache keys on: not kept there
        # nor are replies about documents: their sources are not kept with an answer
        kept_elsewhere = request.raw or bool(request.client_tools) or bool(request.documents)
        # nor a reply that thought, or one made with thinking switched: its key does not hold the choice
        kept_elsewhere = kept_elsewhere or bool(result.thinking) or request.thinking != "auto"
        if (
            finish not in ("stop", "length", "repetition")
            or rounds.tools_ran
            or kept_elsewhere
            or not self.res.identity
        ):
            if finish != "cancelled" and not rounds.tools_ran:
                self.res.answers.add(str(request.messages[-1].get("content", "")), result.ids)
            return
        generation_s = (metrics.total_s or 0.0) - (metrics.queue_s or 0.0)
        try:
            kept = self.res.answer_lookup.put(self.res.identity, request, result.text, result.ids, generation_s)
        except Exception as exc:  # the answer cache only saves time
            said(exc)  # on stderr too: a command that ends on this reply's Done reads no more events
            self.on_event(Warning("cache", f"The answer could not be kept in the answer cache ({exc})."))
            kept = False
        if not kept:
            self.res.answers.add(str(request.messages[-1].get("content", "")), result.ids)


def with_applied(
    applied: Applied | None, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The messages a prompt is rendered from and its whole documents' ids: ``applied``'s where the request has
    documents, else ``messages`` as they are and none."""
    return (applied.messages, applied.whole) if applied is not None else (messages, ())


def _question_vector(question: str) -> Any:
    """The question's embedding for passage search, when the process's embedder is already running and
    ready (it is started beside the model's load); else None: the search ranks by words alone."""
    from engine.answer_cache.embed import shared_embedder

    embedder = shared_embedder(start=False)
    if not embedder.started or not embedder.ready:
        return None
    return embedder.embed_one(question)


def _with_document_metrics(metrics: Metrics, applied: Applied, prompt: Prompt, cached: int, text: str) -> Metrics:
    """``metrics`` with the documents' tokens, those whose KV was reused, and the sources, each marked with
    whether the reply's ``text`` can be tied to it."""
    reused = 0
    if applied.whole_tokens and prompt.documents:
        start = common_prefix(applied.base_ids, prompt.ids)  # where the documents begin: the prompts part there
        reused = applied.reused(max(0, min(cached, prompt.system_tokens) - start))
    sources = applied.sources_for(text)
    return dataclasses.replace(metrics, document_tokens=applied.tokens, document_reused=reused, sources=sources)
