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
all of it is built (``engine.runtime.loading``; on ``LoadFailed`` the old one
stays).  ``call(fn)`` runs ``fn(engine)`` in turn with requests
(``set_prefix_budget``, ``clear_prefix_cache``, ``remember_answer``); one that
raises is reported as ``Warning("engine", ...)``.  Serving a request is
``engine.runtime.serving``; the decoding itself is ``engine.runtime.decode``.

After a reload the old prefix cache's last used system prompts are prefilled
again for the new model (``engine.runtime.rewarm``) while the queue is empty,
one prefill chunk between looks at the queue, so the next reply's system
prompt is warm (its ``Started``/``Metrics.cached_tokens`` count it) and a
request that arrives meanwhile waits for one chunk at most.  Greedy replies
are the same with or without it; one that fails is a ``Warning("cache", ...)``.

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

import copy
import functools
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.answer_cache import ModelIdentity
from engine.api import DraftPrefill, Loaded, LoadFailed, LoadProgress, ModelSpec, Request, Tuning, Warning
from engine.model.loader import LoadedModel, ModelLoadError
from engine.runtime.answers import AnswerMemory
from engine.runtime.answers_bridge import AnswerGate
from engine.runtime.batching import MAX_ACTIVE, Batch
from engine.runtime.decode import Decoder
from engine.runtime.documents import Documents
from engine.runtime.hints import HINT_CHARS_PER_TOKEN, Hints, hint_tokens
from engine.runtime.loading import KV_RESERVE_BYTES, Built, build, kv_file
from engine.runtime.measuring import Measuring, Outcome
from engine.runtime.memory import tune_malloc
from engine.runtime.options import EngineOptions, check_budget, request_problems
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.rewarm import Rewarm, hot_prompts, same_vocabulary
from engine.runtime.serving import CONVERSATION, Prepared, Serving, conversation_key, with_applied
from engine.runtime.speculative import DraftModel, HistoryIndex
from engine.runtime.threads import claim_threads
from engine.runtime.tool_turns import ToolBox

__all__ = [
    "KV_RESERVE_BYTES",
    "Engine",
    "EngineOptions",
    "ModelSpec",
    "check_budget",
    "conversation_key",
    "kv_file",
    "request_problems",
]


MEASURE_POLL_S = 0.25  # while the native step compiles, the idle engine looks at it this often
TYPING_HOLD_S = 2.0  # the background measurement waits while hints came this recently (a message is being typed)


class Engine(Serving):
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
        self.history = HistoryIndex()  # every finished or seeded reply's n-grams: drafts for any question
        self.tools = ToolBox(self.options.tools, on_event)
        self.rewarm = Rewarm()  # system prompts to prefill again after a reload, while idle
        self.measuring: Measuring | None = None  # a first start's mode measurement, run while idle
        self.hints = Hints()  # the message being typed, prefilled while idle
        self.documents = Documents()  # the document index, opened by the first request that attaches documents
        self._last_hint = -1e9  # time.monotonic() of the last hint
        self._load_number = 0  # the load the current model came from
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.batch = Batch()  # the requests in flight, decoding together (engine.runtime.batching)
        self._held: list[Request] = []  # requests waiting for a place in the batch (the window's first)
        self._later: deque[tuple[str, Any]] = deque()  # loads and calls that wait until no request is in flight
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._counter: tuple[LoadedModel, Any] | None = None  # count_tokens' own copy of the loaded tokenizer
        self.answer_gate = AnswerGate(
            self.options.answer_cache, on_event, self._queue.put, lambda r: not request_problems(r), self.cancel
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

    def count_tokens(self, texts: list[str]) -> list[int] | None:
        """The loaded model's token count of each text (an attached document's chip), on the caller's thread;
        None while no model is loaded.  It counts with a copy of the tokenizer: a call sets options on the
        tokenizer it uses (``split_special_tokens``), so sharing the engine's would let a count on another
        thread change how the engine tokenises a prompt at that moment."""
        loaded = self.loaded
        if loaded is None:
            return None
        with self._count_lock:
            if self._counter is None or self._counter[0] is not loaded:
                self._counter = (loaded, copy.deepcopy(loaded.tokenizer))
            tokenizer = self._counter[1]
            return [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]

    def hint(self, request: Request) -> None:
        """The request the window would send now (its draft as the last message): prefill its stable part
        while the engine is idle (``engine.runtime.hints``); a draft with no text drops the hint."""
        self.answer_gate.put_item("hint", request)

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
            engine.rewarm.clear()
            if engine.prefix_cache is not None:
                engine.prefix_cache.entries.clear()

        self.call(clear_prefix_cache)

    def remember_answer(self, question: str, answer: str) -> None:
        """Seed the speculative answer drafts (thread-safe: runs on the engine thread); never served as a reply."""

        def add(engine: Engine) -> None:
            if engine.loaded is not None:
                ids = engine.loaded.tokenizer(answer, add_special_tokens=False)["input_ids"]
                engine.answers.add(question, list(ids))
                engine.history.add(ids)

        self.call(add)

    # -- engine thread ----------------------------------------------------------
    def _loop(self) -> None:
        """Serve the queue until ``shutdown``, prefilling again while it is empty; nothing here ends the thread.

        Requests are served together (``engine.runtime.batching``): while any is in flight, the loop takes
        what has arrived without waiting, lets new requests join, and runs one batched step; loads and
        calls wait until no request is in flight (they change the model or the caches under them)."""
        claim_threads()  # this thread's torch thread count, whatever another thread set before it started
        while True:
            if self.batch.active:
                try:
                    kind, item = self._queue.get_nowait()
                except queue.Empty:
                    self._admit()
                    self._guarded(self.batch.step)
                    continue
            elif self._held:
                self._admit()
                continue
            elif self._later:
                kind, item = self._later.popleft()
            else:
                kind, item = self._next()
            if kind == "stop":
                return
            if kind == "request":
                self._held.append(item)
                self._admit()
            elif self.batch.active and kind != "hint":
                self._later.append((kind, item))
            else:
                self._guarded(functools.partial(self._run_item, kind, item))

    def _admit(self) -> None:
        """Requests that wait join the batch while it has room, the window's before other programs'."""
        self._held.sort(key=lambda r: r.origin != "")  # stable: in order of arrival within each
        while self._held and len(self.batch.active) < MAX_ACTIVE:
            self._guarded(functools.partial(self.batch.start, self._serve, self._held.pop(0)))

    def _run_item(self, kind: str, item: Any) -> None:
        if kind == "rewarm":
            self._rewarm_step()
        elif kind == "hint":
            self._hint(item)
        elif kind == "hint-step":
            self._hint_step()
        elif kind == "measure":
            self._measure_step()
        elif kind == "load":
            self._load_reported(*item)
        elif kind == "call":
            self._call(item)

    @staticmethod
    def _guarded(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # a failing on_event callback: nothing left to report it to
            traceback.print_exc()

    def _next(self) -> tuple[str, Any]:
        """The next queued item; ``("rewarm", None)`` instead of waiting while a warm-up is pending."""
        if self.rewarm.pending() or self.hints.pending():
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                return ("rewarm", None) if self.rewarm.pending() else ("hint-step", None)
        if self.measuring is not None:
            # the native step compiles, or the user is typing a message (hints came in the last
            # TYPING_HOLD_S): no measuring step, whose build could hold the Send that follows
            hold = self.measuring.waiting() or time.monotonic() - self._last_hint < TYPING_HOLD_S
            try:
                return self._queue.get(timeout=MEASURE_POLL_S) if hold else self._queue.get_nowait()
            except queue.Empty:
                return ("idle", None) if hold and not self.measuring.waiting() else ("measure", None)
        return self._queue.get()

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

        self.measuring = None  # what was measured belongs to the model being replaced
        built = build(spec, self.options, progress)
        self._switch(spec, number, built, built.loaded.load_s, same_tokenizer=False)
        if built.loaded.measuring is not None:
            self.measuring = Measuring(built.loaded.measuring, built.loaded.tokenizer, spec, number)
            self.on_event(Tuning("Chatting on float32 while the faster weight modes are measured in the background"))

    def _switch(self, spec: ModelSpec, number: int, built: Built, load_s: float, same_tokenizer: bool) -> None:
        """Switch to ``built`` all at once and send ``Loaded`` (with ``load_s``) and the load's warnings."""
        old_cache, old_tokenizer = self.prefix_cache, self.loaded.tokenizer if self.loaded is not None else None
        loaded, warnings = built.loaded, built.warnings
        self.loaded, self.decoder, self.draft = loaded, built.decoder, built.draft
        self.prefix_cache = built.prefix_cache
        self._load_number = number
        if not same_tokenizer:
            self.answers = AnswerMemory()  # token ids of another tokenizer would be useless drafts
            self.history = HistoryIndex()
        self.identity = ModelIdentity(loaded.name, loaded.identity, built.dtype, loaded.quant)
        try:  # before Loaded: a request sent on Loaded meets this model's answers
            self.answer_gate.loaded(spec, number, self.identity)
        except Exception as exc:  # the answer cache only saves time
            traceback.print_exc()
            warnings.append(Warning("cache", f"The answer cache was not updated for this model ({exc})."))
        self._rewarm_after_load(old_cache, old_tokenizer, warnings)
        self.on_event(Loaded(loaded.name, loaded.device.type, built.dtype, load_s, built.info))
        for warning in warnings:
            self.on_event(warning)

    def _measure_step(self) -> None:
        """One step of the mode measurement; at its end, switch to the chosen mode (between two replies)."""
        measuring = self.measuring
        if measuring is None:
            return
        try:
            outcome = measuring.step()
            if isinstance(outcome, Outcome):
                self.measuring = None
                if outcome.loaded is not None and measuring.number == self._load_number and self.loaded is not None:
                    load_s = self.loaded.load_s
                    built = build(measuring.spec, self.options, lambda _f, _m: None, loaded=outcome.loaded)
                    self._switch(measuring.spec, measuring.number, built, load_s, same_tokenizer=True)
                elif self.loaded is not None:
                    self.loaded.info["mode_probe"] = outcome.record
                self.on_event(Tuning(outcome.message, done=True))
            else:
                self.on_event(Tuning(f"Measuring the weight modes in the background: {outcome}"))
        except Exception as exc:  # only speed is lost: float32 goes on answering
            traceback.print_exc()
            self.measuring = None
            message = f"Measuring the weight modes failed ({type(exc).__name__}: {exc}); float32 stays."
            self.on_event(Tuning(message, done=True))
            self.on_event(Warning("engine", message))

    def _hint(self, request: Request) -> None:
        """A new draft: what of its prompt no keystroke can change becomes the hint job.  Whatever happens,
        a ``DraftPrefill`` says how much is ready (0 of 0: nothing will be prefilled)."""
        ready, total = 0, 0
        self._last_hint = time.monotonic()
        conversation = conversation_key(request.conversation_id or request.id)
        try:
            ready, total = self._start_hint(request, conversation)
        except Exception:  # a hint only saves time: the Send prefills as it would have
            traceback.print_exc()
            self.hints.drop(self.prefix_cache)
        self.on_event(DraftPrefill(conversation.removeprefix(CONVERSATION), ready, total))

    def _start_hint(self, request: Request, conversation: str) -> tuple[int, int]:
        if self.loaded is None or self.prefix_cache is None or self.prefix_cache.budget_bytes <= 0:
            return 0, 0
        text = str(request.messages[-1].get("content", "")) if request.messages else ""
        tokens: list[int] = []
        # a draft far longer than the context can hold is cut at Send: nothing of it is stable, and rendering it
        # five times (hint_tokens' probes) would hold the interpreter, and the window, for most of a second a pause
        fits = len(text) <= self.loaded.context_length * HINT_CHARS_PER_TOKEN
        if fits and text.strip() and request.prefix_cache and not request_problems(request):
            _view, schemas = self._tool_view(request)
            max_tokens = request.sampling.max_tokens
            # whole documents only: the passages depend on the words still being typed
            messages = list(request.messages)
            applied, prompt = self._render(request, messages, schemas, passages=False)
            messages, whole = with_applied(applied, messages)
            tokens = hint_tokens(lambda m: prompt if m is messages else self._prompt(m, max_tokens, schemas, whole),
                                 messages)  # fmt: skip
            # a Send of this very text takes this rendering (Serving._prepare)
            self.prepared = Prepared(self.request_key(request, schemas), self.loaded.tokenizer, applied, prompt)
            if whole:  # a restart's document KV, read while the question is typed
                self._documents_kv(prompt)
        if not tokens:  # an empty draft, nothing stable yet, a prompt that does not fit, a Send that reuses nothing
            self.hints.drop(self.prefix_cache)  # one composer, one draft: whatever was prefilled before is stale
            return 0, 0
        self.hints.start(self.prefix_cache, conversation, tokens)
        job = self.hints.job
        return (len(job.state), len(job.tokens)) if job is not None else (0, 0)

    def _hint_step(self) -> None:
        """One chunk of the draft's prefill (only while nothing else is queued)."""
        assert self.loaded is not None and self.prefix_cache is not None
        job = self.hints.job
        assert job is not None
        try:
            self.hints.step(self.loaded.model, self.prefix_cache)
        except Exception:  # a hint only saves time
            traceback.print_exc()
            self.hints.drop(self.prefix_cache)
            return
        self.on_event(DraftPrefill(job.conversation.removeprefix(CONVERSATION), len(job.state), len(job.tokens)))

    def _rewarm_after_load(self, old_cache: PrefixCache | None, old_tokenizer: Any, warnings: list[Warning]) -> None:
        """Queue the old cache's last used system prompts for the new model (same vocabulary only)."""
        assert self.loaded is not None and self.prefix_cache is not None
        self.hints.drop(None)  # what was prefilled belongs to the old model
        self.rewarm.clear()  # what was queued belongs to the old model
        try:
            prompts = hot_prompts(old_cache)
            if prompts and self.prefix_cache.budget_bytes > 0 and same_vocabulary(old_tokenizer, self.loaded.tokenizer):
                self.rewarm.start(self.loaded.model, self.prefix_cache, prompts)
        except Exception as exc:  # warm-up only saves time
            traceback.print_exc()
            self.rewarm.clear()
            warnings.append(Warning("cache", f"The system prompt will not be prefilled again ({exc}); it starts cold."))

    def _rewarm_step(self) -> None:
        """One chunk of the warm-up; a finished system prompt is kept as a reply would keep it."""
        try:
            state = self.rewarm.step()
            if state is not None:
                try:
                    self._remember_system(state, len(state))
                except OSError as exc:  # kept in memory; only the copy on disk failed
                    traceback.print_exc()
                    self.on_event(Warning("cache", f"The prompt cache could not be saved ({exc}); replies still work."))
        except Exception as exc:  # warm-up only saves time: the next reply starts cold
            traceback.print_exc()
            self.rewarm.clear()
            message = f"The system prompt was not prefilled again after the reload ({exc}); replies still work."
            self.on_event(Warning("cache", message))
        if not self.rewarm.pending():
            self.rewarm.clear()
