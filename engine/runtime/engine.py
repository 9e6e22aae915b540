"""The engine thread: owns the model and its caches, serves requests in order.

``Engine(on_event)`` starts one daemon thread and implements
:class:`engine.api.Backend`.  ``load(spec)``, ``submit(request)`` and
``cancel(request_id)`` return at once; ``on_event`` is called on the engine
thread with ``LoadProgress``/``Loaded``/``LoadFailed`` (and ``Warning``) for
loads and ``Started``/``PrefillProgress``/``Token``/``Done``/``Error`` for
requests.  Every request ends with exactly one ``Done`` or ``Error``, whatever
raises while it is served (an ``Error`` carries the text streamed so far), and
the thread goes on to the next one.  A request that arrives before a model is
loaded, or with invalid values, gets an ``Error`` at once, before any prefill.
A prompt cache that cannot be saved or read costs speed, not the reply or the
load: a ``Warning("cache", ...)``.  A load switches to the new model only once
all of it is built (on ``LoadFailed`` the old one stays).  ``call(fn)`` runs
``fn(engine)`` in turn with requests (``set_prefix_budget``,
``clear_prefix_cache``, ``remember_answer``); one that raises is reported as
``Warning("engine", ...)``.  The decoding itself is ``engine.runtime.decode``.

Everything submitted passes the answer gate (``engine.runtime.answers_bridge``)
in order: a request the answer cache can answer is answered there at once
(even while a model loads), the rest reach this thread; a complete reply
without tools is kept in the cache after its ``Done``.  Tools
(``engine.runtime.tool_turns``): the tools a request names run from the
user's ``/NAME`` lines first, then from the model's calls, for at most
``ToolSettings.max_rounds`` rounds of up to ``max_tokens`` each; every call
is a ``ToolCall`` event and the text of every round is streamed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import queue
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.answer_cache import ModelIdentity
from engine.api import (
    SOURCES,
    Done,
    Loaded,
    LoadFailed,
    LoadProgress,
    Metrics,
    ModelInfo,
    ModelSpec,
    Request,
    Sampling,
    Started,
    Token,
    Warning,
)
from engine.model.kv import KVState
from engine.model.loader import LoadedModel, ModelLoadError, load_draft, load_model
from engine.paths import cache_dir
from engine.runtime import tool_turns
from engine.runtime.answers import AnswerMemory
from engine.runtime.answers_bridge import AnswerGate
from engine.runtime.decode import Decoder, DecodeResult
from engine.runtime.memory import reserve, tune_malloc
from engine.runtime.options import EngineOptions, check_budget, request_problems
from engine.runtime.prefix_cache import PERSISTED, PrefixCache, kv_layout
from engine.runtime.prompt import Prompt, build_prompt
from engine.runtime.reply_events import ReplyEvents
from engine.runtime.reply_metrics import request_metrics
from engine.runtime.speculative import AnswerDrafts, Drafter, DraftModel, PromptLookup
from engine.runtime.tool_turns import Rounds, ToolBox
from engine.tools import Parsed, tool_schemas

KV_RESERVE_BYTES = 256 << 20  # memory made ready for KV buffers at load (engine.runtime.memory.reserve)


def kv_file(identity: str) -> Path:
    """Where the system-prompt KV of the model ``identity`` is saved."""
    return cache_dir() / "kv" / f"{identity}.safetensors"


def conversation_key(conversation_id: str) -> str:
    """The prefix cache key of a conversation's own (live) entry."""
    return f"conv:{conversation_id}"


__all__ = ["Engine", "EngineOptions", "ModelSpec", "check_budget", "request_problems"]


class Engine:
    def __init__(self, on_event: Callable[[object], None], options: EngineOptions | None = None) -> None:
        tune_malloc()
        self.on_event = on_event
        self.options = options or EngineOptions()
        self.loaded: LoadedModel | None = None
        self.identity: ModelIdentity | None = None  # the loaded model, as the answer cache knows it
        self.decoder: Decoder | None = None
        self.prefix_cache: PrefixCache | None = None
        self.draft: DraftModel | None = None
        self.answers = AnswerMemory()  # drafts seeded by remember_answer (and replies the cache did not keep)
        self.tools = ToolBox(self.options.tools, on_event)
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self.answer_gate = AnswerGate(
            self.options.answer_cache, on_event, self._queue.put, lambda r: not request_problems(r)
        )
        self._thread = threading.Thread(target=self._loop, name="brisk-engine", daemon=True)
        self._thread.start()

    # -- public, thread-safe: every item passes the answer gate, in order --------
    def load(self, spec: ModelSpec) -> None:
        self.answer_gate.put_item("load", spec)

    def submit(self, request: Request) -> None:
        if not request.submitted_at:
            object.__setattr__(request, "submitted_at", time.perf_counter())
        self.answer_gate.put_item("request", request)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.answer_gate.put_item("stop", None)
        self.answer_gate.join(timeout)
        self._thread.join(timeout)
        self.tools.close()

    def call(self, fn: Callable[[Engine], Any]) -> None:
        """Run ``fn(engine)`` on the engine thread, in order with requests."""
        self.answer_gate.put_item("call", fn)

    # -- engine thread ----------------------------------------------------------
    def _loop(self) -> None:
        """Serve the queue until ``shutdown``; nothing that raises here ends the thread."""
        while True:
            kind, item = self._queue.get()
            if kind == "stop":
                return
            try:
                if kind == "load":
                    self._load_reported(*item)
                elif kind == "request":
                    self._serve(item)
                elif kind == "call":
                    self._call(item)
            except Exception:  # a failing on_event callback: nothing left to report it to
                traceback.print_exc()

    def _call(self, fn: Callable[[Engine], Any]) -> None:
        try:
            fn(self)
        except Exception as exc:  # reported, never fatal: the engine goes on with the next item
            traceback.print_exc()
            name = getattr(fn, "__name__", "an engine task")
            self.on_event(Warning("engine", f"{name} failed ({type(exc).__name__}: {exc}); the engine goes on."))

    def _load_reported(self, spec: ModelSpec, number: int = 0) -> None:
        """Load ``spec``; whatever happens, send ``Loaded`` or ``LoadFailed`` (the old model stays on failure)."""
        try:
            self._load(spec, number)
            return
        except ModelLoadError as exc:
            failed = LoadFailed(str(exc))
        except Exception as exc:
            traceback.print_exc()
            failed = LoadFailed(
                f"Unexpected error while loading the model ({type(exc).__name__}: {exc}). "
                "Check the model and the data folder, or pick another model in Settings."
            )
        self.answer_gate.load_failed(number, self.identity)
        self.on_event(failed)

    def _load(self, spec: ModelSpec, number: int = 0) -> None:
        """Build the model and everything that belongs to it, then switch to it all at once."""

        def progress(fraction: float, message: str) -> None:
            self.on_event(LoadProgress(fraction, message))

        loaded = load_model(spec, progress)
        warnings: list[Warning] = []
        decoder = Decoder(loaded.model, loaded.tokenizer, loaded.eos_ids)
        # on this (the engine's) thread, whose malloc arena the KV buffers will come from
        loaded.info["kv_reserved_bytes"] = reserve(min(self.options.prefix_cache_bytes, KV_RESERVE_BYTES))
        prefix_cache = PrefixCache(loaded.identity, self.options.prefix_cache_bytes)
        if self.options.persist_prefixes:
            try:
                loaded.info["warm_prefixes"] = prefix_cache.load(
                    kv_file(loaded.identity), layout=kv_layout(loaded.model)
                )
                if prefix_cache.load_problems:
                    problems = "; ".join(prefix_cache.load_problems)
                    warnings.append(
                        Warning("cache", f"Some saved prompt caches were not used ({problems}); they start cold.")
                    )
            except Exception as exc:  # saved prompt caches only save time: start cold
                traceback.print_exc()
                prefix_cache = PrefixCache(loaded.identity, self.options.prefix_cache_bytes)
                loaded.info["warm_prefixes"] = 0
                message = f"Saved prompt caches were not used ({exc}); the first reply starts cold."
                warnings.append(Warning("cache", message))
        draft = None
        if spec.draft:
            try:
                draft = DraftModel(load_draft(spec, loaded).model)
                loaded.info["draft_model"] = spec.draft
                loaded.info["draft_quant"] = getattr(spec, "draft_quant", "none")
            except Exception as exc:  # the target runs without it
                if not isinstance(exc, ModelLoadError):
                    traceback.print_exc()
                    exc = ModelLoadError(f"{type(exc).__name__}: {exc}")
                warnings.append(Warning("draft", f"Draft model not used: {exc}"))
        dtype = str(loaded.dtype).removeprefix("torch.")
        known = {f.name for f in dataclasses.fields(ModelInfo)}
        info = ModelInfo(**{k: v for k, v in loaded.info.items() if k in known})
        self.loaded, self.decoder, self.prefix_cache, self.draft = loaded, decoder, prefix_cache, draft
        self.answers = AnswerMemory()  # token ids of another tokenizer would be useless drafts
        self.identity = ModelIdentity(loaded.name, loaded.identity, dtype, loaded.quant)
        try:  # before Loaded: a request sent on Loaded meets this model's answers
            self.answer_gate.loaded(spec, number, self.identity)
        except Exception as exc:  # the answer cache only saves time
            traceback.print_exc()
            warnings.append(Warning("cache", f"The answer cache was not updated for this model ({exc})."))
        self.on_event(Loaded(loaded.name, loaded.device.type, dtype, loaded.load_s, info))
        for warning in warnings:
            self.on_event(warning)

    def _drafters(self, request: Request, prompt_length: int) -> list[Drafter]:
        """The draft sources for this request, best first (``auto``: all that are available)."""
        source = request.speculative
        if source not in SOURCES:
            raise ValueError(f"Unknown speculative source {source!r}; choose one of {', '.join(SOURCES)}.")
        if source == "off":
            return []
        if source == "draft" and self.draft is None:
            raise ValueError("Speculative source 'draft' needs a draft model: set one in Settings or --draft-model.")
        drafters: list[Drafter] = []
        if source in ("auto", "answers"):
            similar = self._answer_drafts(str(request.messages[-1].get("content", "")))
            if similar:
                drafters.append(AnswerDrafts(similar, prompt_length))
        if source in ("auto", "lookup"):
            drafters.append(PromptLookup())
        if source in ("auto", "draft") and self.draft is not None:
            drafters.append(self.draft)
        return drafters

    def _answer_drafts(self, question: str, limit: int = 3) -> list[list[int]]:
        """Earlier answers to similar questions: the answer cache's nearest, then seeded ones."""
        found: list[list[int]] = []
        if self.identity is not None:
            try:
                found = self.answer_gate.drafts(question, self.identity, limit)
            except Exception:  # drafts only save time
                traceback.print_exc()
        for ids in self.answers.similar(question, limit):
            if ids not in found:
                found.append(ids)
        return found[:limit]

    def set_prefix_budget(self, budget_bytes: int) -> None:
        """Change the prefix cache's byte budget now (evicting if needed); a bad value raises ``ValueError`` here."""
        check_budget(budget_bytes)

        def apply(engine: Engine) -> None:
            engine.options.prefix_cache_bytes = budget_bytes
            if engine.prefix_cache is not None:
                engine.prefix_cache.budget_bytes = budget_bytes
                engine.prefix_cache.evict()

        self.call(apply)

    def clear_prefix_cache(self) -> None:
        """Forget every prompt's KV in memory (in turn with requests), so the next reply starts cold."""

        def clear_prefix_cache(engine: Engine) -> None:
            if engine.prefix_cache is not None:
                engine.prefix_cache.entries.clear()

        self.call(clear_prefix_cache)

    def remember_answer(self, question: str, answer: str) -> None:
        """Seed the speculative answer drafts (thread-safe: runs on the engine thread); never served as a reply."""

        def add(engine: Engine) -> None:
            if engine.loaded is not None:
                ids = engine.loaded.tokenizer(answer, add_special_tokens=False)["input_ids"]
                engine.answers.add(question, list(ids))

        self.call(add)

    def _remember(self, state: KVState, system_tokens: int, conversation_key: str) -> None:
        """Keep this conversation's KV, and its system prompt's KV under a key of its own."""
        cache = self.prefix_cache
        assert cache is not None
        if system_tokens:
            digest = hashlib.sha256(str(state.tokens[:system_tokens]).encode()).hexdigest()[:16]
            key = f"{PERSISTED}{digest}"
            is_new = key not in cache.entries
            cache.insert(key, state, system_tokens)
            if is_new and self.options.persist_prefixes and key in cache.entries:
                cache.save(kv_file(cache.identity))
        cache.insert(conversation_key, state, live=True)

    def _is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def _serve(self, request: Request) -> None:
        reply = ReplyEvents(request.id, request.submitted_at, self.on_event)
        try:
            self._serve_checked(request, reply)
        except Exception as exc:  # whatever raised, the request ends with one Error
            traceback.print_exc()
            if self.draft is not None:
                self.draft.state = KVState()  # a step that failed half-way may have left its KV uneven
            reply.fail(
                f"The reply failed ({type(exc).__name__}: {exc}). Try again; if it keeps failing, "
                "reload the model or pick another in Settings."
            )
        finally:
            with self._lock:
                self._cancelled.discard(request.id)

    def _serve_checked(self, request: Request, reply: ReplyEvents) -> None:
        t_taken = reply.since()
        if self.loaded is None or self.decoder is None or self.prefix_cache is None:
            reply.fail("No model is loaded yet. Wait for loading to finish or pick a model in Settings.")
            return
        problems = request_problems(request)
        if problems:
            reply.fail("Cannot send this request: " + "; ".join(problems) + ".")
            return
        view = self.tools.view(request.tools)
        schemas = (tool_schemas(view) or None) if view is not None else None
        messages: list[dict[str, Any]] = list(request.messages)
        try:
            prompt = self._prompt(messages, request.sampling.max_tokens, schemas)
            drafters = self._drafters(request, len(prompt.ids))
        except ValueError as exc:
            reply.fail(str(exc))
            return
        t_prompt = reply.since()
        rounds = Rounds()
        started = False
        kept, calls = tool_turns.slash_calls(messages, view) if view is not None else ("", ())
        if view is not None and calls:  # the user's own /NAME lines run first; the model sees the results
            reply.emit(Started(request.id, t_prompt, len(prompt.ids), prompt.truncated, 0))
            started = True
            rounds.turns.append(tool_turns.run_turn(calls, view, request, reply.emit))
            messages = tool_turns.with_slash_results(messages, kept, rounds.turns[-1])
            prompt = self._prompt(messages, request.sampling.max_tokens, schemas)
            drafters = self._drafters(request, len(prompt.ids))
        first: Metrics | None = None
        model_turns, as_text = 0, False
        while True:  # each round may write up to max_tokens; at most max_rounds rounds of tool calls
            result, lookup_at = self._decode(request, reply, prompt, request.sampling, drafters, started)
            started = True
            rounds.decodes.append((result.metrics, lookup_at))
            if first is None:
                first = request_metrics(result.metrics, t_taken, t_prompt, lookup_at, 0, prompt.truncated)
            finish = result.finish_reason
            parsed = tool_turns.model_calls(result.text) if view is not None else Parsed(result.text)
            if not parsed.calls or finish in ("cancelled", "context") or model_turns >= self.options.tools.max_rounds:
                break
            assert view is not None
            model_turns += 1
            turn = tool_turns.run_turn(parsed.calls, view, request, reply.emit)
            rounds.turns.append(turn)
            if self._is_cancelled(request.id):
                finish = "cancelled"
                break
            reply.emit(Token(request.id, reply.since(), "\n\n"))  # the next round's text starts apart
            messages, prompt, as_text = tool_turns.next_prompt(
                lambda m: self._prompt(m, request.sampling.max_tokens, schemas),
                messages,
                result.text,
                parsed,
                turn,
                as_text,
            )
            drafters = self._drafters(request, len(prompt.ids))
        assert first is not None
        metrics = dataclasses.replace(rounds.metrics(first), cache_bytes=self.prefix_cache.nbytes())
        text = result.text if len(rounds.decodes) == 1 else "".join(reply.text)
        with self.answer_gate.storing():  # a lookup of the same question waits for the answer to be kept
            reply.emit(Done(request.id, reply.since(), text, finish, metrics))
            self._keep_answer(request, result, finish, rounds, metrics)

    def _prompt(self, messages: list[dict[str, Any]], max_tokens: int, schemas: list[dict[str, Any]] | None) -> Prompt:
        assert self.loaded is not None
        return build_prompt(self.loaded.tokenizer, messages, self.loaded.context_length, max_tokens, tools=schemas)

    def _decode(
        self,
        request: Request,
        reply: ReplyEvents,
        prompt: Prompt,
        sampling: Sampling,
        drafters: list[Drafter],
        started: bool,
    ) -> tuple[DecodeResult, float]:
        """One model round: cache lookup, prefill, decode (its events sent); returns its result and lookup end."""
        assert self.loaded is not None and self.decoder is not None and self.prefix_cache is not None
        conversation = conversation_key(request.conversation_id or request.id)
        state = self.prefix_cache.lookup(prompt.ids, prefer=conversation) if request.prefix_cache else KVState()
        t_lookup = reply.since()
        if not started:
            reply.emit(Started(request.id, t_lookup, len(prompt.ids), prompt.truncated, len(state)))
        result = None
        for item in self.decoder.stream(
            request.id,
            prompt.ids,
            state,
            sampling,
            lambda: self._is_cancelled(request.id),
            request.submitted_at,
            drafters,
            self.loaded.context_length,
        ):
            if isinstance(item, DecodeResult):
                result = item
            else:
                reply.emit(item)
        assert result is not None, "the decode stream ends with its result"
        if request.prefix_cache:
            try:
                self._remember(state, prompt.system_tokens, conversation)
            except Exception as exc:  # a cache that cannot be kept costs speed next time, never the reply
                traceback.print_exc()
                self.on_event(Warning("cache", f"The prompt cache could not be saved ({exc}); replies still work."))
        return result, t_lookup

    def _keep_answer(
        self, request: Request, result: DecodeResult, finish: str, rounds: Rounds, metrics: Metrics
    ) -> None:
        """After ``Done``: a complete reply without tools goes to the answer cache (else to the draft memory)."""
        if finish not in ("stop", "length") or rounds.tools_ran or self.identity is None:
            if finish != "cancelled" and not rounds.tools_ran:
                self.answers.add(str(request.messages[-1].get("content", "")), result.ids)
            return
        generation_s = (metrics.total_s or 0.0) - (metrics.queue_s or 0.0)
        try:
            kept = self.answer_gate.put(self.identity, request, result.text, result.ids, generation_s)
        except Exception as exc:  # the answer cache only saves time
            traceback.print_exc()
            self.on_event(Warning("cache", f"The answer could not be kept in the answer cache ({exc})."))
            kept = False
        if not kept:
            self.answers.add(str(request.messages[-1].get("content", "")), result.ids)
