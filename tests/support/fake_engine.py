"""A scripted stand-in for the local engine (an ``engine.api.Backend``) for GUI tests.

Same surface as the real engine: ``FakeEngine(on_event)`` starts one worker
thread; ``load``/``submit``/``cancel`` return at once and the worker calls
``on_event`` with ``LoadProgress``/``Loaded``/``LoadFailed`` and
``Started``/``Token``.../``Done`` | ``Error`` events, in that order, from its own
thread.  The script is plain attributes set by the test:

* ``tokens``: the text deltas of every reply; ``thinking``: deltas sent before them as ``Thinking``
  events (a thinking model's), joined in ``Done.thinking``; ``draft_every``: mark every n-th
  token as drafted (0: none); ``forced_every``: likewise as forced by the reply's format;
* ``hold_after``: after that many tokens the stream waits until
  :meth:`release` (or a cancel), so a test can look at a reply mid-way;
* ``fail_with``: end each reply with ``Error(message)`` instead of ``Done``;
* ``truncated``: ``Started(truncated=True)``;
* ``tool_calls``: ``(name, arguments, seconds, ok, result)`` of calls each reply
  makes before its first token, run "concurrently" (all start together; each
  ``ToolCall`` is sent when it ends, after a real wait of its ``seconds``), and
  the ``Done`` metrics then carry ``tools_wall_s``, ``tools_sequential_s`` and
  one ``tool:NAME`` span per call;
* ``cached``: the ``Metrics`` of an answer-cache hit (e.g.
  ``Metrics(answer_cache="exact", saved_s=1.9)``): a request with
  ``answer_cache`` on and ``fresh`` off is answered with them instead of ``metrics``;
* ``load_error``: the next loads end with ``LoadFailed(load_error)``;
* ``count_tokens(texts)``: like the real engine's tokenizer count, one "token" per word
  (None while no model is loaded); ``counted`` records the texts it was asked about;
* ``load_info``: the ``Loaded.info`` fields (``ModelInfo``); ``load_steps``: the
  ``LoadProgress`` events of a load; ``draft_error``: like the real
  engine when only the draft model fails, ``Loaded`` is followed by ``Warning("draft", ...)``.

What it saw is recorded in ``loads``, ``requests``, ``cancelled``, ``hints`` and
``remembered`` (the ``remember_answer(question, answer)`` calls).  It has every
verb of the ``Backend`` protocol; it keeps no prefix cache, so
``set_prefix_budget`` and ``clear_prefix_cache`` answer False, as a remote
server's do.  Pauses are ``threading.Event`` waits, so a cancel ends them at once.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.api import (
    Done,
    DraftPrefill,
    Error,
    Loaded,
    LoadFailed,
    LoadProgress,
    Metrics,
    ModelInfo,
    ModelSpec,
    Request,
    Span,
    Started,
    Thinking,
    Token,
    ToolCall,
    Warning,
)

METRICS = Metrics(
    prompt_tokens=1200,
    cached_tokens=1180,
    computed_tokens=20,
    ttft_s=0.21,
    tokens_per_s=38.2,
    completion_tokens=5,
    drafted=4,
    accepted=3,
    acceptance=0.75,
    speedup=1.8,
)


class FakeEngine:
    def __init__(self, on_event: Callable[[object], None], *, load_error: str | None = None) -> None:
        self.on_event = on_event
        self.tokens: list[str] = ["Hello", " there", ",", " friend", "."]
        self.thinking: list[str] = []
        self.draft_every = 0
        self.forced_every = 0
        self.hints: list[Request] = []  # the drafts the window sent to be prefilled while typed
        self.token_pause = 0.002
        self.hold_after: int | None = None
        self.fail_with: str | None = None
        self.truncated = False
        self.load_error = load_error
        self.load_info: dict[str, Any] = {"parameters": 135_000_000, "weight_bytes": 270_000_000, "warm_prefixes": 1}
        self.draft_error: str | None = None
        self.load_steps: list[tuple[float, str]] = [(0.5, "Loading weights")]
        self.metrics: Metrics = METRICS
        self.tool_calls: list[tuple[str, dict[str, Any], float, bool, str]] = []
        self.cached: Metrics | None = None
        self.loads: list[ModelSpec] = []
        self.requests: list[Request] = []
        self.cancelled: list[str] = []
        self.remembered: list[tuple[str, str]] = []
        self.counted: list[str] = []
        self.loaded = False
        self.held = threading.Event()  # set while a stream waits at hold_after
        self._release = threading.Event()
        self._cancel = threading.Event()
        self._cancel_id: str | None = None
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()

    # -- the engine interface -------------------------------------------------------
    def load(self, spec: ModelSpec) -> None:
        self.loads.append(spec)
        self._jobs.put(("load", spec))

    def submit(self, request: Request) -> None:
        self.requests.append(request)
        self._jobs.put(("request", (request, time.perf_counter())))

    def hint(self, request: Request) -> bool:
        """Prefill while typing: records the draft's request and says, as the engine does, that it is ready."""
        self.hints.append(request)
        text = str(request.messages[-1].get("content", "")) if request.messages else ""
        if text.strip():
            n = len(text.split())
            self.on_event(DraftPrefill(request.conversation_id or "", n, n))
        return True

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self.cancelled.append(request_id)
            self._cancel_id = request_id
            self._cancel.set()

    def count_tokens(self, texts: list[str]) -> list[int] | None:
        """The attached documents' token counts (one per word; None before a model is loaded)."""
        if not self.loaded:
            return None
        self.counted.extend(texts)
        return [len(text.split()) for text in texts]

    def remember_answer(self, question: str, answer: str) -> bool:
        self.remembered.append((question, answer))
        return True

    def set_prefix_budget(self, budget_bytes: int) -> bool:
        """No prefix cache here: like a remote server, the budget is not applied (False)."""
        return False

    def clear_prefix_cache(self) -> bool:
        return False

    def shutdown(self, timeout: float = 5.0) -> None:
        self.release()
        self._jobs.put(("stop", None))
        self._thread.join(timeout)

    # -- test controls ----------------------------------------------------------------
    def release(self) -> None:
        self._release.set()

    # -- worker thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kind, item = self._jobs.get()
            if kind == "stop":
                return
            if kind == "load":
                self._load(item)
            else:
                self._serve(*item)

    def _load(self, spec: ModelSpec) -> None:
        for fraction, message in self.load_steps:
            self.on_event(LoadProgress(fraction, message))
        if self.load_error:
            self.on_event(LoadFailed(self.load_error))
            return
        info = ModelInfo(**self.load_info)
        self.loaded = True
        self.on_event(Loaded(spec.source or "fake-model", "cpu", "float32", 0.01, info))
        if self.draft_error:
            self.on_event(Warning("draft", f"Draft model not used: {self.draft_error}"))

    def _cancelled(self, request_id: str) -> bool:
        with self._lock:
            return self._cancel.is_set() and self._cancel_id == request_id

    def _serve(self, request: Request, t0: float) -> None:
        def since() -> float:
            return time.perf_counter() - t0

        self._release.clear()
        self.on_event(Started(request.id, since(), prompt_tokens=1200, truncated=self.truncated))
        metrics = self.metrics
        if self.cached is not None and request.answer_cache and not request.fresh:
            metrics = self.cached
        elif self.tool_calls:
            metrics = self._run_tools(request, since(), since, metrics)
        text, thought = "", ""
        script = [(d, True) for d in self.thinking] + [(d, False) for d in self.tokens]
        for n, (delta, thinking) in enumerate(script, start=1):
            if self._cancelled(request.id):
                break
            draft = bool(self.draft_every) and n % self.draft_every == 0
            forced = bool(self.forced_every) and n % self.forced_every == 0
            if thinking:
                self.on_event(Thinking(request.id, since(), delta, (n,)))
                thought += delta
            else:
                self.on_event(Token(request.id, since(), delta, (n,), draft, forced))
                text += delta
            if self.hold_after is not None and n == self.hold_after:
                self.held.set()
                while not self._release.wait(0.01) and not self._cancelled(request.id):
                    pass
                self.held.clear()
            else:
                self._cancel.wait(self.token_pause)
        if self.fail_with:
            self.on_event(Error(request.id, since(), self.fail_with, partial_text=text))
            return
        reason = "cancelled" if self._cancelled(request.id) else "stop"
        with self._lock:
            self._cancel.clear()
            self._cancel_id = None
        self.on_event(Done(request.id, since(), text, reason, metrics, thought))

    def _run_tools(self, request: Request, start: float, since: Callable[[], float], metrics: Metrics) -> Metrics:
        spans = []
        for name, arguments, seconds, ok, result in sorted(self.tool_calls, key=lambda c: c[2]):
            self._cancel.wait(max(0.0, start + seconds - since()))
            end = since()
            self.on_event(ToolCall(request.id, end, name, arguments, start, end, ok, result))
            spans.append(Span(f"tool:{name}", start, end))
        wall = max(s.end_s for s in spans) - start
        sequential = sum(s.seconds for s in spans)
        return dataclasses.replace(
            metrics,
            tools_wall_s=wall,
            tools_sequential_s=sequential,
            spans=(*metrics.spans, *spans),
        )
