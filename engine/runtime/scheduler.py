"""What runs next on the engine thread: one intake queue, one loop, and each request's state.

Everything the engine is asked arrives on one queue, :meth:`Scheduler.put`,
from any thread: ``submit``, ``load``, ``call``, ``hint`` and ``stop``, and
the results other threads post back: ``semantic`` (the embedder made a
question's vector), ``back`` (a tool round that ran away from the batch is
done) and ``built`` (a model built on its load thread).  ``cancel`` adds to
the one cancel set at once; a running decode looks at it after every step.

The loop (:meth:`Scheduler.run`) repeats, in this order:

1. take in everything on the queue without waiting.  A submitted request is
   looked up in the answer cache first (the exact match, about 1 ms; a hit is
   answered there and then, even while a model loads); the rest wait.  A
   ``semantic`` post answers a request from the cache only while the model
   has sent none of its reply (the model's side is then muted and cancelled),
   else the late hit is dropped;
2. admit waiting requests into the batch while it has room
   (``batching.MAX_ACTIVE``), the window's (``Request.origin`` "") before
   other programs';
3. with requests in flight, run one batched step (``engine.runtime.batching``);
4. with none in flight, the next load or call that waited for them; a load
   is built on a short-lived thread while the loop goes on taking in, and is
   switched in when it posts ``built``; requests taken in after a load wait
   for the new model;
5. idle (nothing in flight, waiting or loading): the latest hint, if one
   came (``Work.hint_now`` renders the draft's prompt: a long draft's takes
   tens of milliseconds, so it never runs in front of a request; hints that
   came meanwhile are replaced by the newest, and a Send of the same chat
   drops the one it makes stale), else one chunk of idle work (typing
   prefill, a re-warm, the weight modes' measurement), else wait for the
   next item.  A request that arrives during a chunk starts after it: a
   hint's chunks are sized to a few tens of milliseconds
   (``engine.runtime.hints``).

A request's state is ``waiting``, ``running``, ``tools`` (its tool round
runs away from the batch, the others keep stepping) or ``done``.  The work
itself is the :class:`Work` given to the scheduler (the engine: the request
path, loads, the answer cache); the policy here needs no model, so it is
tested with a fake one (``tests/engine/runtime/test_scheduler.py``).
"""

from __future__ import annotations

import functools
import queue
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from greenlet import getcurrent

from engine.api import ModelSpec, Request
from engine.model.kv import forward_many
from engine.runtime import activity, batching
from engine.runtime.batching import Batch, Served
from engine.runtime.reply_events import ReplyEvents

WAITING, RUNNING, TOOLS, DONE = "waiting", "running", "tools", "done"
Item = tuple[str, Any]


class Work(Protocol):
    """What the scheduler runs; every method is called on the engine thread unless it says otherwise."""

    on_event: Callable[[object], None]

    def answer(self, request: Request, post: Callable[[Item], None]) -> bool:
        """Answer ``request`` from the cache now (true), else false; may post ``("semantic", id)`` later."""
        ...

    def semantic(self, request_id: str, answered: bool) -> tuple[Request, Any, float] | None:
        """The semantic stage's hit for a request the model has not ``answered`` yet: (request, hit, t_taken)."""
        ...

    def serve_hit(self, request: Request, hit: Any, t_taken: float, started: bool) -> None: ...

    def serve(self, request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        """Serve ``request`` to its end (one ``Done`` or ``Error``), in a greenlet of the batch."""
        ...

    def load_started(self, spec: ModelSpec) -> int:
        """A load is taken in (the answer cache expects its model): its number."""
        ...

    def build(self, spec: ModelSpec, number: int) -> Any:
        """Build the model (on the load's own thread); raises on failure."""
        ...

    def switch(self, spec: ModelSpec, number: int, built: Any) -> None:
        """Switch to what :meth:`build` made, between steps."""
        ...

    def load_failed(self, number: int, error: BaseException) -> None: ...

    def run_call(self, fn: Callable[[Any], Any]) -> None: ...

    def hint_now(self, request: Request) -> None: ...

    def idle(self) -> tuple[Callable[[], None] | None, float | None]:
        """Idle work: (a chunk to run, or None; how long to wait for intake first: 0 none, None for ever)."""
        ...


@dataclass
class Tracked:
    """A request the scheduler holds, from intake to its end."""

    request: Request
    reply: ReplyEvents
    state: str = WAITING
    runner: Served | None = None


class Scheduler:
    def __init__(self, work: Work, many: Callable[..., Any] = forward_many) -> None:
        self.work = work
        self.intake: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self.batch = Batch(self.put, many)
        self.requests: dict[str, Tracked] = {}  # every request taken in and not done, by id
        self.waiting: list[Tracked] = []  # for a place in the batch, in order of arrival
        self.later: deque[Item] = deque()  # loads and calls waiting for the requests in flight, and what follows a load
        self.loading: tuple[ModelSpec, int] | None = None  # a model being built on its load thread
        self.hint: Request | None = None  # the latest draft, to take in once nothing else waits
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    # -- any thread --------------------------------------------------------------------------------
    def put(self, item: Item) -> None:
        self.intake.put(item)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)

    def is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def state(self, request_id: str) -> str:
        """``waiting``, ``running``, ``tools`` or ``done`` (also for a request never seen)."""
        tracked = self.requests.get(request_id)
        if tracked is None:
            return DONE
        if tracked.runner is not None and tracked.runner in self.batch.gone:
            return TOOLS
        return tracked.state

    # -- the engine thread -------------------------------------------------------------------------
    def run(self) -> None:
        """Serve the intake until ``stop``; nothing here ends the thread."""
        while True:
            try:
                while True:  # 1. everything taken in so far, without waiting
                    kind, item = self.intake.get_nowait()
                    if kind == "stop":
                        return
                    _guarded(functools.partial(self._take, kind, item))
            except queue.Empty:
                pass
            activity.serving(bool(self.batch.active or self.waiting))  # background work yields to a request
            self._admit()  # 2.
            if self.batch.ready:  # 3.
                _guarded(self.batch.step)
                continue
            if self._run_later():  # 4.
                continue
            if self.batch.active or self.waiting or self.loading is not None or self.later:
                kind, item = self.intake.get()  # a tool round or a load will post back
            elif self.hint is not None:  # 5. the draft as typed last: nothing else waits for the engine
                request, self.hint = self.hint, None
                _guarded(functools.partial(self.work.hint_now, request))
                continue
            else:
                job, wait = self.work.idle()
                try:
                    if wait is None:
                        kind, item = self.intake.get()
                    elif wait > 0:
                        kind, item = self.intake.get(timeout=wait)
                    else:
                        kind, item = self.intake.get_nowait()
                except queue.Empty:
                    if job is not None:
                        _guarded(job)
                    continue
            if kind == "stop":
                return
            _guarded(functools.partial(self._take, kind, item))

    def _take(self, kind: str, item: Any) -> None:
        if kind == "submit":
            self._submit(item)
        elif kind == "load":
            self._hint_in_turn()
            self.later.append(("load", (item, self.work.load_started(item))))
        elif kind == "call":
            self._hint_in_turn()
            self.later.append((kind, item))
        elif kind == "hint":  # after the loads and calls asked before it (a cleared cache must not clear it)
            if self.loading is not None or self.later:
                self.later.append((kind, item))
            else:
                self.hint = item  # the newest draft replaces one not taken in yet
        elif kind == "semantic":
            self._semantic(item)
        elif kind == "back":
            runner, outcome = item
            self.batch.back(runner, outcome)
        elif kind == "built":
            spec, number, (ok, value) = item
            self.loading = None
            if ok:
                self.work.switch(spec, number, value)
            else:
                self.work.load_failed(number, value)

    def _hint_in_turn(self) -> None:
        """A load or call is asked: the hint asked before it goes first (it must not miss a cleared cache)."""
        if self.hint is not None:
            self.later.append(("hint", self.hint))
            self.hint = None

    def _submit(self, request: Request) -> None:
        """Answered from the cache now, or held: waiting, or after the load or call asked before it."""
        hint = self.hint
        if hint is not None and hint.conversation_id is not None and hint.conversation_id == request.conversation_id:
            self.hint = None  # this chat's Send: its draft, typed before it, is sent
        if self.work.answer(request, self.put):
            return
        tracked = Tracked(request, ReplyEvents(request.id, request.submitted_at, self.work.on_event))
        self.requests[request.id] = tracked
        if self.loading is not None or self.later:
            self.later.append(("wait", tracked))
        else:
            self.waiting.append(tracked)

    def _semantic(self, request_id: str) -> None:
        """A question's vector is ready: answer from the cache while the model has said nothing, else drop."""
        tracked = self.requests.get(request_id)
        answered = tracked is None or tracked.reply.answered or tracked.reply.ended
        found = self.work.semantic(request_id, answered)
        if found is None or tracked is None:
            return
        request, hit, t_taken = found
        tracked.reply.muted = True  # whatever the model's side sends from now on is dropped
        if tracked.state == WAITING:
            if tracked in self.waiting:
                self.waiting.remove(tracked)
            else:
                self.later.remove(("wait", tracked))
            self._end(tracked)
        else:
            self.cancel(request_id)  # its decode stops at the next step
        self.work.serve_hit(request, hit, t_taken, tracked.reply.started_sent)

    def _admit(self) -> None:
        """Waiting requests join the batch while it has room, the window's before other programs'."""
        if self.loading is not None:
            return
        self.waiting.sort(key=lambda t: t.request.origin != "")  # stable: in order of arrival within each
        while self.waiting and len(self.batch.active) < batching.MAX_ACTIVE:
            tracked = self.waiting.pop(0)
            tracked.state = RUNNING
            _guarded(functools.partial(self.batch.start, functools.partial(self._serve, tracked)))

    def _serve(self, tracked: Tracked) -> None:
        """In the request's greenlet: the work's request path, then its end."""
        current = getcurrent()
        tracked.runner = current if isinstance(current, Served) else None
        request_id = tracked.request.id
        try:
            self.work.serve(tracked.request, tracked.reply, lambda: self.is_cancelled(request_id))
        finally:
            self._end(tracked)

    def _end(self, tracked: Tracked) -> None:
        tracked.state = DONE
        self.requests.pop(tracked.request.id, None)
        with self._lock:
            self._cancelled.discard(tracked.request.id)

    def _run_later(self) -> bool:
        """The first item that waited, when it may run now; true when something ran."""
        if not self.later or self.loading is not None:
            return False
        kind, item = self.later[0]
        if kind in ("load", "call") and (self.batch.active or self.waiting):
            return False  # they change the model or its caches under the requests in flight
        self.later.popleft()
        if kind == "load":
            self._start_load(*item)
        elif kind == "call":
            _guarded(functools.partial(self.work.run_call, item))
        elif kind == "hint":
            _guarded(functools.partial(self.work.hint_now, item))
        elif kind == "wait":
            self.waiting.append(item)
        return True

    def _start_load(self, spec: ModelSpec, number: int) -> None:
        """Build the model on a short-lived thread; it posts ``built`` when done (see :meth:`_take`)."""
        self.loading = (spec, number)

        def build() -> None:
            try:
                outcome: tuple[bool, Any] = (True, self.work.build(spec, number))
            except BaseException as exc:  # noqa: BLE001 - reported by load_failed on the engine thread
                outcome = (False, exc)
            self.put(("built", (spec, number, outcome)))

        threading.Thread(target=build, name="brisk-load", daemon=True).start()


def _guarded(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # a failing on_event callback: nothing left to report it to
        traceback.print_exc()
