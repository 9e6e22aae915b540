"""The engine thread: owns the model and its caches; its scheduler decides what runs next.

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
stays; the model is built on a short-lived thread while the engine thread goes
on answering from the answer cache).  ``call(fn)`` runs ``fn(engine)`` when no
request is in flight (``set_prefix_budget``, ``clear_prefix_cache``,
``remember_answer``); one that raises is reported as ``Warning("engine", ...)``.
What runs next is ``engine.runtime.scheduler``; serving a request is
``engine.runtime.serving``; the decoding itself is ``engine.runtime.decode``.

After a reload the old prefix cache's last used system prompts are prefilled
again for the new model (``engine.runtime.rewarm``) while the queue is empty,
one prefill chunk between looks at the queue, so the next reply's system
prompt is warm (its ``Started``/``Metrics.cached_tokens`` count it) and a
request that arrives meanwhile waits for one chunk at most.  Greedy replies
are the same with or without it; one that fails is a ``Warning("cache", ...)``.

A request the answer cache can answer (``engine.runtime.answer_lookup``) is
answered when the scheduler takes it in (even while a model loads); a complete
reply without tools is kept in the cache after its ``Done``.  Tools
(``engine.runtime.tool_turns``): the tools a request names run from the
user's ``/NAME`` lines first, then from the model's calls, for at most
``ToolSettings.max_rounds`` rounds of up to ``max_tokens`` each; every call
is a ``ToolCall`` event and the text of every round is streamed.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from engine.answer_cache import ModelIdentity
from engine.api import DraftPrefill, Loaded, LoadFailed, LoadProgress, ModelSpec, Request, Tuning, Warning
from engine.model.loader import LoadedModel, ModelLoadError
from engine.runtime import activity
from engine.runtime.answer_lookup import AnswerLookup
from engine.runtime.answers import AnswerMemory
from engine.runtime.batching import Batch
from engine.runtime.hints import Hints
from engine.runtime.loading import KV_RESERVE_BYTES, Built, build, kv_file
from engine.runtime.measuring import Measuring, Outcome
from engine.runtime.memory import tune_malloc
from engine.runtime.options import EngineOptions, check_budget, request_problems
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.prompt_documents import Documents
from engine.runtime.reply_events import ReplyEvents
from engine.runtime.rewarm import Rewarm, hot_prompts, same_vocabulary
from engine.runtime.scheduler import Item, Scheduler
from engine.runtime.serving import CONVERSATION, Resources, Serving, conversation_key
from engine.runtime.speculative import HistoryIndex
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


def _resource(name: str) -> Any:
    """A property of the engine that is its ``res.NAME``."""
    return property(lambda self: getattr(self.res, name), lambda self, value: setattr(self.res, name, value))


class Engine:
    def __init__(self, on_event: Callable[[object], None], options: EngineOptions | None = None) -> None:
        tune_malloc()
        self.on_event = on_event
        options = options or EngineOptions()
        self.answer_lookup = AnswerLookup(options.answer_cache, on_event, lambda r: not request_problems(r))
        self.res = Resources(options, ToolBox(options.tools, on_event), self.answer_lookup, Hints(), Documents())
        self.serving = Serving(self.res, on_event)
        self.rewarm = Rewarm()  # system prompts to prefill again after a reload, while idle
        self.measuring: Measuring | None = None  # a first start's mode measurement, run while idle
        self._last_hint = -1e9  # time.monotonic() of the last hint
        self._load_number = 0  # the load the current model came from
        self.scheduler = Scheduler(self)
        self._count_lock = threading.Lock()
        self._counter: tuple[LoadedModel, Any] | None = None  # count_tokens' own copy of the loaded tokenizer
        self._thread = threading.Thread(target=self._run, name="brisk-engine", daemon=True)
        self._thread.start()

    # the resources requests are served with (engine.runtime.serving.Resources), read and set through the engine
    options = _resource("options")
    tools = _resource("tools")
    hints = _resource("hints")
    documents = _resource("documents")
    loaded = _resource("loaded")
    identity = _resource("identity")
    decoder = _resource("decoder")
    prefix_cache = _resource("prefix_cache")
    draft = _resource("draft")
    answers = _resource("answers")
    history = _resource("history")

    @property
    def batch(self) -> Batch:
        return self.scheduler.batch

    # -- public, thread-safe: every item goes to the scheduler's intake, in order ---------------------
    def load(self, spec: ModelSpec) -> None:
        self.scheduler.put(("load", spec))

    def submit(self, request: Request) -> None:
        if not request.submitted_at:  # a copy that says when it arrived: the caller's stays as it was
            request = dataclasses.replace(request, submitted_at=time.perf_counter())
        self.scheduler.put(("submit", request))

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

    def hint(self, request: Request) -> bool:
        """The request the window would send now (its draft as the last message): prefill its stable part
        while the engine is idle (``engine.runtime.hints``); a draft with no text drops the hint."""
        self.scheduler.put(("hint", request))
        return True

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.scheduler.put(("stop", None))
        self._thread.join(timeout)
        if self.measuring is not None:
            self.measuring.stop(timeout)
        self.tools.close()

    def call(self, fn: Callable[[Engine], Any]) -> None:
        """Run ``fn(engine)`` on the engine thread once no request is in flight (in order with loads and calls)."""
        self.scheduler.put(("call", fn))

    def set_prefix_budget(self, budget_bytes: int) -> bool:
        """Change the prefix cache's byte budget now (evicting if needed); a bad value raises ``ValueError`` here."""
        check_budget(budget_bytes)

        def apply(engine: Engine) -> None:
            engine.res.options.prefix_cache_bytes = budget_bytes
            if engine.prefix_cache is not None:
                engine.prefix_cache.budget_bytes = budget_bytes
                engine.prefix_cache.evict()

        self.call(apply)
        return True

    def clear_prefix_cache(self) -> bool:
        """Forget every prompt's KV in memory (in turn with requests), so the next reply starts cold."""

        def clear_prefix_cache(engine: Engine) -> None:
            engine.rewarm.clear()
            if engine.prefix_cache is not None:
                engine.prefix_cache.entries.clear()

        self.call(clear_prefix_cache)
        return True

    def remember_answer(self, question: str, answer: str) -> bool:
        """Seed the speculative answer drafts (thread-safe: runs on the engine thread); never served as a reply."""

        def add(engine: Engine) -> None:
            if engine.loaded is not None:
                ids = engine.loaded.tokenizer(answer, add_special_tokens=False)["input_ids"]
                engine.res.answers.add(question, list(ids))
                engine.res.history.add(ids)

        self.call(add)
        return True

    # -- engine thread: the scheduler's Work (engine.runtime.scheduler) -----------------------------------
    def _run(self) -> None:
        claim_threads()  # this thread's torch thread count, whatever another thread set before it started
        self.answer_lookup.open()
        self.scheduler.run()
        activity.serving(False)  # a background build paused for this engine's requests goes on (or is stopped)

    def answer(self, request: Request, post: Callable[[Item], None]) -> bool:
        return self.answer_lookup.answer(request, post)

    def semantic(self, request_id: str, answered: bool) -> tuple[Request, Any, float] | None:
        return self.answer_lookup.semantic(request_id, answered)

    def serve_hit(self, request: Request, hit: Any, t_taken: float, started: bool) -> None:
        self.answer_lookup.serve_hit(request, hit, t_taken, started)

    def serve(self, request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        self.serving.serve(request, reply, cancelled)

    def load_started(self, spec: ModelSpec) -> int:
        return self.answer_lookup.load_started(spec)

    def run_call(self, fn: Callable[[Any], Any]) -> None:
        self._call(fn)

    def idle(self) -> tuple[Callable[[], None] | None, float | None]:
        """A warm-up or a draft's prefill first, one chunk at a time; then the mode measurement, which waits while
        the native step compiles or the user is typing (hints came in the last ``TYPING_HOLD_S``): its build
        could hold the Send that follows."""
        if self.rewarm.pending():
            return self._rewarm_step, 0
        if self.res.hints.pending():
            return self._hint_step, 0
        if self.measuring is not None:
            if self.measuring.waiting():
                return self._measure_step, MEASURE_POLL_S
            if time.monotonic() - self._last_hint < TYPING_HOLD_S:
                return None, MEASURE_POLL_S
            return self._measure_step, 0
        return None, None

    def _call(self, fn: Callable[[Engine], Any]) -> None:
        try:
            fn(self)
        except Exception as exc:  # reported, never fatal: the engine goes on with the next item
            traceback.print_exc()
            name = getattr(fn, "__name__", "an engine task")
            self.on_event(Warning("engine", f"{name} failed ({type(exc).__name__}: {exc}); the engine goes on."))

    def build(self, spec: ModelSpec, number: int) -> Built:
        """Build the model and everything that belongs to it (on the load's own thread)."""

        def progress(fraction: float, message: str) -> None:
            self.on_event(LoadProgress(fraction, message))

        if self.measuring is not None:  # its builds beside the engine end first: two transformers builds collide
            self.measuring.stop()
        return build(spec, self.res.options, progress)

    def switch(self, spec: ModelSpec, number: int, built: Built) -> None:
        """Switch to the model just built, all at once; a first start's mode measurement then runs while idle."""
        try:
            self.measuring = None  # what was measured belongs to the model being replaced
            self._switch(spec, number, built, built.loaded.load_s, same_tokenizer=False)
            if built.loaded.measuring is not None:
                self.measuring = Measuring(built.loaded.measuring, built.loaded.tokenizer, spec, number)
                message = "Chatting on float32 while the faster weight modes are measured in the background"
                self.on_event(Tuning(message))
        except Exception as exc:
            self.load_failed(number, exc)

    def load_failed(self, number: int, error: BaseException) -> None:
        """Send ``LoadFailed`` (the old model stays)."""
        if isinstance(error, ModelLoadError):
            failed = LoadFailed(str(error))
        else:
            traceback.print_exception(error)
            failed = LoadFailed(
                f"Unexpected error while loading the model ({type(error).__name__}: {error}). "
                "Check the model and the data folder, or pick another model in Settings."
            )
        self.answer_lookup.load_failed(number, self.res.identity)
        self.on_event(failed)

    def _switch(self, spec: ModelSpec, number: int, built: Built, load_s: float, same_tokenizer: bool) -> None:
        """Switch to ``built`` all at once and send ``Loaded`` (with ``load_s``) and the load's warnings."""
        res = self.res
        old_cache, old_tokenizer = res.prefix_cache, res.loaded.tokenizer if res.loaded is not None else None
        loaded, warnings = built.loaded, built.warnings
        res.loaded, res.decoder, res.draft = loaded, built.decoder, built.draft
        res.prefix_cache = built.prefix_cache
        self._load_number = number
        if not same_tokenizer:
            res.answers = AnswerMemory()  # token ids of another tokenizer would be useless drafts
            res.history = HistoryIndex()
        res.identity = ModelIdentity(loaded.name, loaded.identity, built.dtype, loaded.quant)
        try:  # before Loaded: a request sent on Loaded meets this model's answers
            self.answer_lookup.loaded(spec, number, res.identity)
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
                    built = build(measuring.spec, self.res.options, lambda _f, _m: None, loaded=outcome.loaded)
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

    def hint_now(self, request: Request) -> None:
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
        tokens = self.serving.hint_tokens(request)
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
                    self.serving._remember_system(state, len(state))
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
