"""Continuous batching: the requests in flight decode together, one model step giving each its next tokens.

Each request is served by the same code as when it runs alone (``Serving._serve``: prompt, prefix cache,
drafts, grammar, tools, events), in a greenlet of its own on the engine thread.  Where that code would
run a decode step (``engine.runtime.steps``), it hands the step to the :class:`Batch` instead
(:func:`decode`) and switches to the engine's loop; when every request in flight is waiting so, the loop
runs all their steps in one call (``engine.model.kv.forward_many``: one pass over the weights for every
row, each sequence attending to its own KV) and switches back to each with its logits.  A request that
prefills a long prompt lets the others step between its chunks (:func:`pause`), so a 4,000-token prompt
does not freeze the streams already talking.  Requests join and leave between steps.

Greenlets, not threads: only one request's Python runs at a time and only where it asks for a step, so
the engine's state (prefix cache, answer memory, controller) sees the same one-at-a-time order as
before, and every torch op stays on the engine thread (a second thread's OpenMP team halves the
engine's decode speed, see ``engine.runtime.threads``).  Greedy output does not change: a batched row is
computed by the same code as a lone one (``native_step.cpp``'s ``forward_batch``).

Work that is not the model's (a tool round: fetching a URL, running an MCP tool) leaves the batch
(:func:`away`): it runs on a short-lived thread of its own while the request's greenlet is parked, the
other requests go on stepping, and the thread posts its outcome to the scheduler's intake, which hands
it back (:meth:`Batch.back`) so the request rejoins the batch at the next step.  Which request runs
when is decided in ``engine.runtime.scheduler``; this module only steps the ones in flight.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from greenlet import greenlet

from engine.model.kv import KVState, forward, forward_many
from engine.runtime.speculative.controller import StepShape

MAX_ACTIVE = 8  # requests decoding together; more wait their turn
_START = object()  # Batch._resume's value for a request's first run
_numbers = itertools.count(1)  # model steps, numbered: a batched step's rows all report the same one
_alone = threading.local()  # the last step run alone on this thread (``last_step``)


@dataclass
class Job:
    model: Any
    state: KVState
    ids: list[int]
    all_logits: bool
    run: Callable[..., torch.Tensor] = forward  # how a step of one request alone runs (the caller's forward)


class Served(greenlet):  # type: ignore[misc]
    """A request being served; ``batch`` is the :class:`Batch` it belongs to."""

    batch: Batch


def _mine() -> Batch | None:
    current = greenlet.getcurrent()
    return current.batch if isinstance(current, Served) else None


def decode(
    model: Any, state: KVState, ids: list[int], all_logits: bool, run: Callable[..., torch.Tensor] = forward
) -> torch.Tensor:
    """A decode step's logits, as ``run(model, state, ids, all_logits, decode=True)`` (``engine.model.kv.forward``)
    gives them: batched with the other requests in flight when called from a request the engine serves in a
    batch, else at once.  A step that runs alone is ``run`` itself."""
    batch = _mine()
    if batch is None:
        t = time.perf_counter()
        logits = run(model, state, ids, all_logits, decode=True)
        _alone.shape = StepShape(next(_numbers), 1, len(ids), time.perf_counter() - t)
        return logits
    return batch.wait(Job(model, state, ids, all_logits, run))


def last_step() -> StepShape | None:
    """The calling request's last decode step as measured: its number, rows, tokens fed and model time."""
    batch = _mine()
    return getattr(_alone, "shape", None) if batch is None else batch.last


def width() -> int:
    """The rows the calling request's next decode step is likely to have: the requests in flight that are not
    away (1 when it is served alone)."""
    batch = _mine()
    return 1 if batch is None else max(1, len(batch.active) - len(batch.gone))


def away(work: Callable[[], Any]) -> Any:
    """``work()``'s result (or its exception, raised here), run so that the other requests in flight keep
    stepping meanwhile: on a thread of its own when called from a request served in a batch, else at once."""
    batch = _mine()
    if batch is None:
        return work()
    return batch.away(work)


def stepped_alone() -> bool:
    """Whether the last decode step of the calling request ran alone: its time is then the model's own
    step time, which the speculation controller and the thread governor learn from (a batched step's
    is not: it would read as a slow machine)."""
    batch = _mine()
    return batch is None or batch.last_width <= 1


def pause() -> None:
    """Let the other requests in flight take a step (between prefill chunks); at once when none are."""
    batch = _mine()
    if batch is not None and len(batch.active) > 1:
        batch.wait(None)


class Batch:
    """The requests in flight on the engine thread, and the step that advances them together."""

    def __init__(
        self,
        post: Callable[[tuple[str, Any]], None] = lambda item: None,
        many: Callable[..., list[torch.Tensor]] = forward_many,
    ) -> None:
        self.post = post  # the scheduler's intake: a request's work done away comes back through it
        self.many = many  # several requests' steps in one call (``engine.model.kv.forward_many``; tests fake it)
        self.active: list[Served] = []  # in the order they joined
        self.gone: set[Served] = set()  # requests whose work runs away from the batch (a tool round)
        self._waiting: dict[Served, Job | None] = {}  # each active request's next step (None: a pause)
        self.steps = 0  # batched steps run (for the benchmarks and tests)
        self.widest = 0  # the most requests one step advanced
        self.last_width = 0  # the requests the last step advanced
        self.last: StepShape | None = None  # the last step as measured (the speculation controller learns from it)

    def start(self, serve: Callable[[], None]) -> None:
        """Begin serving a request (``serve()``): it runs now, up to its first step (or to its end)."""
        runner = Served(lambda: _run(serve))
        runner.batch = self
        self.active.append(runner)
        self._resume(runner, _START)

    def wait(self, job: Job | None) -> Any:
        """From inside a request: hand over its next step and wait for the result (its logits)."""
        current = greenlet.getcurrent()
        assert isinstance(current, Served) and current.parent is not None
        self._waiting[current] = job
        return current.parent.switch()

    @property
    def ready(self) -> bool:
        """Some request in flight waits for a step (the others, if any, are away)."""
        return bool(self._waiting)

    def away(self, work: Callable[[], Any]) -> Any:
        """From inside a request: run ``work`` on a short-lived thread; the request rejoins when it is done."""
        current = greenlet.getcurrent()
        assert isinstance(current, Served) and current.parent is not None
        self.gone.add(current)

        def run() -> None:
            try:
                outcome: tuple[bool, Any] = (True, work())
            except BaseException as exc:  # noqa: BLE001 - raised again in the request that asked for it
                outcome = (False, exc)
            self.post(("back", (current, outcome)))

        threading.Thread(target=run, name="brisk-away", daemon=True).start()
        return current.parent.switch()

    def back(self, runner: Served, outcome: tuple[bool, Any]) -> None:
        """``runner``'s work away from the batch is done: it goes on (up to its next step) with the outcome."""
        self.gone.discard(runner)
        if runner.dead or runner not in self.active:
            return
        ok, value = outcome
        self._resume(runner, value, throw=not ok)

    def step(self) -> None:
        """One step for every request in flight: their decode rows in one model call, then each goes on."""
        waiting, self._waiting = self._waiting, {}
        jobs = [(runner, job) for runner, job in waiting.items() if job is not None]
        if jobs:
            t = time.perf_counter()
            try:
                if len(jobs) == 1:
                    one = jobs[0][1]
                    results = [one.run(one.model, one.state, one.ids, one.all_logits, decode=True)]
                else:
                    results = self.many(jobs[0][1].model, [(j.state, j.ids, j.all_logits) for _, j in jobs])
            except Exception as exc:  # each request ends with its own Error (Serving._serve catches it there)
                for runner, _ in jobs:
                    self._resume(runner, exc, throw=True)
            else:
                fed = sum(len(job.ids) for _, job in jobs)
                self.last = StepShape(next(_numbers), len(jobs), fed, time.perf_counter() - t)
                self.steps += 1
                self.last_width = len(jobs)
                self.widest = max(self.widest, len(jobs))
                for (runner, _), logits in zip(jobs, results, strict=True):
                    self._resume(runner, logits)
        for runner, pending in waiting.items():
            if pending is None:
                self._resume(runner, None)

    def _resume(self, runner: Served, value: Any, throw: bool = False) -> None:
        if throw:
            runner.throw(value)
        elif value is _START:
            runner.switch()
        else:
            runner.switch(value)
        if runner.dead:
            self.active.remove(runner)
            self._waiting.pop(runner, None)
            self.gone.discard(runner)


def _run(serve: Callable[[], None]) -> None:
    try:
        serve()
    except Exception:  # serve ends every request with Done or Error itself; this is a last guard
        traceback.print_exc()
