"""The scheduler's policy with a fake step and no model (``engine.runtime.scheduler``).

A fake :class:`~engine.runtime.scheduler.Work` serves each request as a number of decode steps through the real
``batching.decode`` (so requests in flight really step together, through a fake ``forward_many``), and records
what happened in order.  Items are put on the intake before the loop starts where a test needs them taken in
together, so nothing here depends on timing except where a duration is the point (a tool round that sleeps).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.api import Done, Metrics, ModelSpec, Request, Sampling, Started, Token
from engine.runtime import batching
from engine.runtime.reply_events import ReplyEvents
from engine.runtime.scheduler import DONE, TOOLS, WAITING, Scheduler


@dataclass
class FakeWork:
    """Serves a request as ``steps[request.id]`` decode steps, one token each; records what happened."""

    steps: dict[str, int] = field(default_factory=dict)
    away_at: dict[str, tuple[int, Callable[[], Any]]] = field(default_factory=dict)  # id -> (step, work away)
    cached: dict[str, str] = field(default_factory=dict)  # exact hits: id -> answer
    similar: dict[str, str] = field(default_factory=dict)  # semantic hits: id -> answer
    log: list[tuple[str, Any]] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    built: threading.Event = field(default_factory=threading.Event)  # the fake build waits for this
    ended: dict[str, threading.Event] = field(default_factory=dict)
    idle_jobs: int = 0
    requests: dict[str, Request] = field(default_factory=dict)
    step_s: float = 0.0  # how long a fake step takes

    def run_one(self, model: Any, state: Any, ids: list[int], all_logits: bool, decode: bool = True) -> Any:
        time.sleep(self.step_s)
        return ids[-1]  # a step of one request alone: its "logits"

    def on_event(self, event: object) -> None:
        self.log.append(("event", event))
        if isinstance(event, Done):
            self.ended.setdefault(event.request_id, threading.Event()).set()

    def many(self, model: Any, rows: list[tuple[Any, list[int], bool]]) -> list[Any]:
        time.sleep(self.step_s)
        self.widths.append(len(rows))
        return [ids[-1] for _, ids, _ in rows]

    # -- Work --
    def answer(self, request: Request, post: Callable[[tuple[str, Any]], None]) -> bool:
        self.requests[request.id] = request
        self.log.append(("taken", request.id))
        if request.id in self.cached:
            self.serve_hit(request, self.cached[request.id], 0.0, False)
            return True
        return False

    def semantic(self, request_id: str, answered: bool) -> tuple[Request, Any, float] | None:
        self.log.append(("semantic", (request_id, answered)))
        if answered or request_id not in self.similar:
            return None
        return self.requests[request_id], self.similar[request_id], 0.0

    def serve_hit(self, request: Request, hit: Any, t_taken: float, started: bool) -> None:
        if not started:
            self.on_event(Started(request.id, 0.0))
        self.on_event(Token(request.id, 0.0, hit))
        self.on_event(Done(request.id, 0.0, hit, "stop", Metrics(answer_cache="exact")))

    def serve(self, request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        reply.emit(Started(request.id, 0.0))
        text = []
        for i in range(self.steps.get(request.id, 3)):
            if request.id in self.away_at and self.away_at[request.id][0] == i:
                self.log.append(("away", request.id))
                self.log.append(("back", (request.id, batching.away(self.away_at[request.id][1]))))
            if cancelled():
                reply.emit(Done(request.id, 0.0, "".join(text), "cancelled", Metrics()))
                return
            batching.decode(None, None, [i], False, run=self.run_one)
            text.append(f"{i} ")
            reply.emit(Token(request.id, 0.0, f"{i} "))
        reply.emit(Done(request.id, 0.0, "".join(text), "stop", Metrics()))

    def load_started(self, spec: ModelSpec) -> int:
        self.log.append(("load-started", spec.source))
        return 1

    def build(self, spec: ModelSpec, number: int) -> Any:
        self.log.append(("build", threading.current_thread().name))
        assert self.built.wait(30)
        return "model"

    def switch(self, spec: ModelSpec, number: int, built: Any) -> None:
        self.log.append(("switch", built))

    def load_failed(self, number: int, error: BaseException) -> None:
        self.log.append(("failed", str(error)))

    def run_call(self, fn: Callable[[Any], Any]) -> None:
        fn(self)

    def hint_now(self, request: Request) -> None:
        self.log.append(("hint", request.id))

    def idle(self) -> tuple[Callable[[], None] | None, float | None]:
        if self.idle_jobs <= 0:
            return None, None

        def job() -> None:
            self.idle_jobs -= 1
            self.log.append(("idle", None))

        return job, 0

    # -- reading the log --
    def events(self, request_id: str) -> list[object]:
        return [e for kind, e in self.log if kind == "event" and getattr(e, "request_id", None) == request_id]

    def first(self, kind: str, request_id: str) -> int:
        """The log position of ``request_id``'s first event of type ``kind``."""
        return next(
            i
            for i, (k, e) in enumerate(self.log)
            if k == "event" and type(e).__name__ == kind and e.request_id == request_id
        )

    def wait(self, request_id: str) -> None:
        assert self.ended.setdefault(request_id, threading.Event()).wait(30), self.log


def until(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Wait until ``condition()`` holds (it must, within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the scheduler never got there"
        time.sleep(0.01)


def request(origin: str = "", rid: str = "") -> Request:
    r = Request(rid or uuid.uuid4().hex, ({"role": "user", "content": "hi"},), Sampling(max_tokens=8), origin=origin)
    object.__setattr__(r, "submitted_at", time.perf_counter())
    return r


@pytest.fixture
def work() -> FakeWork:
    return FakeWork()


@pytest.fixture
def run(work: FakeWork) -> Iterator[Callable[[], Scheduler]]:
    """Start the scheduler's loop (after the test has put what it wants taken in together)."""
    made: list[tuple[Scheduler, threading.Thread]] = []

    def start(scheduler: Scheduler | None = None) -> Scheduler:
        scheduler = scheduler or Scheduler(work, many=work.many)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        made.append((scheduler, thread))
        return scheduler

    yield start
    for scheduler, thread in made:
        work.built.set()
        scheduler.put(("stop", None))
        thread.join(10)
        assert not thread.is_alive()


def test_requests_in_flight_step_together(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    scheduler = Scheduler(work, many=work.many)
    ids = [request(rid=f"r{i}") for i in range(3)]
    for r in ids:
        work.steps[r.id] = 5
        scheduler.put(("submit", r))
    run(scheduler)
    for r in ids:
        work.wait(r.id)
    assert max(work.widths) == 3, "the three requests' steps ran as one batched call"
    assert [e.text for e in work.events("r0") if isinstance(e, Done)] == ["0 1 2 3 4 "]


def test_the_windows_request_goes_first(
    work: FakeWork, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "MAX_ACTIVE", 1)
    scheduler = Scheduler(work, many=work.many)
    first, second, window = request("server", "a"), request("server", "b"), request("", "w")
    for r in (first, second, window):
        scheduler.put(("submit", r))
    run(scheduler)
    for r in (first, second, window):
        work.wait(r.id)
    starts = sorted(("a", "b", "w"), key=lambda rid: work.first("Started", rid))
    assert starts == ["w", "a", "b"], "the window's request took the one place first; the others kept their order"


def test_a_load_waits_for_the_requests_in_flight_and_hits_are_served_while_it_builds(
    work: FakeWork, run: Callable[..., Scheduler]
) -> None:
    scheduler = Scheduler(work, many=work.many)
    running, after, cached = request(rid="running"), request(rid="after"), request(rid="cached")
    work.steps["running"] = 6
    work.cached["cached"] = "From the cache."
    scheduler.put(("submit", running))
    scheduler.put(("load", ModelSpec(source="next")))
    scheduler.put(("submit", after))
    run(scheduler)
    until(lambda: any(kind == "build" for kind, _ in work.log))
    build_at = next(i for i, (kind, _) in enumerate(work.log) if kind == "build")
    assert work.first("Done", "running") < build_at, "the load waited for the reply in flight"
    assert work.log[build_at][1] == "brisk-load", "built on a thread of its own"
    assert scheduler.state("after") == WAITING, "a request taken in after the load waits for the new model"
    scheduler.put(("submit", cached))
    work.wait("cached")  # answered while the model is still being built
    assert not any(kind == "switch" for kind, _ in work.log)
    work.built.set()
    work.wait("after")
    switch_at = next(i for i, (kind, _) in enumerate(work.log) if kind == "switch")
    assert switch_at < work.first("Started", "after"), "it met the new model"


def test_idle_work_runs_only_when_nothing_else_waits(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    scheduler = Scheduler(work, many=work.many)
    first, second = request(rid="first"), request(rid="second")
    work.steps.update(first=4, second=4)
    work.idle_jobs = 3
    scheduler.put(("submit", first))
    scheduler.put(("submit", second))
    run(scheduler)
    work.wait("first")
    work.wait("second")
    until(lambda: not work.idle_jobs)
    idle = [i for i, (kind, _) in enumerate(work.log) if kind == "idle"]
    assert len(idle) == 3, "the idle work ran once the requests were done"
    assert min(idle) > max(work.first("Done", "first"), work.first("Done", "second"))


def test_a_hit_after_the_models_first_token_is_dropped(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    release = threading.Event()
    work.steps["late"] = 3
    work.similar["late"] = "Cached."
    work.away_at["late"] = (1, lambda: release.wait(30))  # the model's first token is out; then it waits
    scheduler = run()
    scheduler.put(("submit", request(rid="late")))
    until(lambda: scheduler.state("late") == TOOLS)
    scheduler.put(("semantic", "late"))
    until(lambda: any(kind == "semantic" for kind, _ in work.log))
    release.set()
    work.wait("late")
    assert ("semantic", ("late", True)) in work.log, "the scheduler said the model had answered"
    done = [e for e in work.events("late") if isinstance(e, Done)]
    assert [d.text for d in done] == ["0 1 2 "], "one reply, the model's"


def test_a_hit_before_the_models_first_token_answers_and_stops_the_model(
    work: FakeWork, run: Callable[..., Scheduler]
) -> None:
    release = threading.Event()
    work.steps["early"] = 3
    work.similar["early"] = "Cached."
    work.away_at["early"] = (0, lambda: release.wait(30))  # Started sent, no token yet (a long prefill)
    scheduler = run()
    scheduler.put(("submit", request(rid="early")))
    until(lambda: scheduler.state("early") == TOOLS)
    scheduler.put(("semantic", "early"))
    work.wait("early")
    release.set()
    until(lambda: ("back", ("early", True)) in work.log)
    time.sleep(0.05)  # the model's side ends (cancelled) and sends nothing more
    events = work.events("early")
    assert [type(e).__name__ for e in events] == ["Started", "Token", "Done"], events
    assert events[-1].text == "Cached." and events[-1].metrics.answer_cache == "exact"


def test_a_hit_for_a_waiting_request_means_the_model_never_starts_it(
    work: FakeWork, run: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "MAX_ACTIVE", 1)
    release = threading.Event()
    work.steps["busy"] = 2
    work.away_at["busy"] = (1, lambda: release.wait(30))
    work.similar["queued"] = "Cached."
    scheduler = Scheduler(work, many=work.many)
    scheduler.put(("submit", request(rid="busy")))
    scheduler.put(("submit", request(rid="queued")))
    scheduler.put(("semantic", "queued"))
    run(scheduler)
    work.wait("queued")
    release.set()
    work.wait("busy")
    assert ("semantic", ("queued", False)) in work.log
    assert [type(e).__name__ for e in work.events("queued")] == ["Started", "Token", "Done"]
    assert scheduler.state("queued") == DONE


def test_a_tool_round_stalls_no_peer(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    away_s = 0.5
    work.steps.update(tools=4, peer=40)
    work.away_at["tools"] = (1, lambda: time.sleep(away_s) or "results")
    work.step_s = 0.01  # a step takes a while, so the peer is still streaming during the tool round
    scheduler = Scheduler(work, many=work.many)
    scheduler.put(("submit", request(rid="tools")))
    scheduler.put(("submit", request(rid="peer")))
    run(scheduler)
    work.wait("tools")
    work.wait("peer")
    went = next(i for i, (kind, value) in enumerate(work.log) if kind == "away")
    came = next(i for i, (kind, value) in enumerate(work.log) if kind == "back")
    peer_tokens = [
        i for i, (kind, e) in enumerate(work.log) if kind == "event" and isinstance(e, Token) and e.request_id == "peer"
    ]
    during = [i for i in peer_tokens if went < i < came]
    assert len(during) >= 10, f"the peer streamed while the tools ran ({len(during)} tokens)"
    assert work.log[came][1] == ("tools", "results"), "the tool round's result came back to its request"
    assert [e.text for e in work.events("tools") if isinstance(e, Done)] == ["0 1 2 3 "]


def test_a_tool_round_that_raises_raises_in_its_request(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    def broken() -> None:
        raise RuntimeError("the tool broke")

    work.away_at["broken"] = (1, broken)
    served = work.serve
    errors: list[str] = []

    def serve(request: Request, reply: ReplyEvents, cancelled: Callable[[], bool]) -> None:
        try:
            served(request, reply, cancelled)
        except RuntimeError as exc:
            errors.append(str(exc))
            reply.emit(Done(request.id, 0.0, "", "stop", Metrics()))

    work.serve = serve  # type: ignore[method-assign]
    scheduler = run()
    scheduler.put(("submit", request(rid="broken")))
    scheduler.put(("submit", request(rid="next")))
    work.wait("broken")
    work.wait("next")
    assert errors == ["the tool broke"]


def test_cancel_ends_a_running_request_and_calls_wait_for_it(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    release = threading.Event()
    work.steps["long"] = 10
    work.away_at["long"] = (2, lambda: release.wait(30))
    scheduler = run()
    scheduler.put(("submit", request(rid="long")))
    called = threading.Event()
    scheduler.put(("call", lambda _work: (work.log.append(("call", None)), called.set())))
    until(lambda: scheduler.state("long") == TOOLS)
    assert not called.is_set(), "a call waits for the request in flight"
    scheduler.cancel("long")
    release.set()
    work.wait("long")
    assert called.wait(30)
    done = [e for e in work.events("long") if isinstance(e, Done)]
    assert [d.finish_reason for d in done] == ["cancelled"]
    assert work.first("Done", "long") < work.log.index(("call", None))
    assert not scheduler.is_cancelled("long"), "the cancel set forgets a request that ended"


def test_calls_hints_and_requests_keep_the_order_they_were_asked_in(
    work: FakeWork, run: Callable[..., Scheduler]
) -> None:
    """A draft prefilled after "clear the prefix cache" must not be cleared by it (``brisk compare --cold``)."""
    scheduler = Scheduler(work, many=work.many)
    scheduler.put(("call", lambda _work: work.log.append(("call", None))))
    scheduler.put(("hint", request(rid="draft")))
    scheduler.put(("submit", request(rid="sent")))
    run(scheduler)
    work.wait("sent")
    until(lambda: ("hint", "draft") in work.log)
    order = [kind for kind, _ in work.log if kind in ("call", "hint")]
    assert order == ["call", "hint"]


def test_a_hint_asked_before_a_call_is_taken_in_before_it(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    """The engine's ``call`` after a hint (a test's settle, a cleared cache) sees the hint taken in."""
    scheduler = Scheduler(work, many=work.many)
    scheduler.put(("hint", request(rid="draft")))
    scheduler.put(("call", lambda _work: work.log.append(("call", None))))
    run(scheduler)
    until(lambda: ("call", None) in work.log)
    assert work.log.index(("hint", "draft")) < work.log.index(("call", None))


def draft(rid: str, conversation: str) -> Request:
    r = Request(rid, ({"role": "user", "content": rid},), Sampling(max_tokens=8), conversation_id=conversation)
    object.__setattr__(r, "submitted_at", time.perf_counter())
    return r


def test_a_send_goes_before_the_drafts_queued_with_it_and_only_the_newest_is_taken_in(
    work: FakeWork, run: Callable[..., Scheduler]
) -> None:
    """Hints that came faster than the engine takes them in (each renders a whole prompt) hold no Send: the
    Send starts first, and of the drafts only the newest is rendered, once."""
    scheduler = Scheduler(work, many=work.many)
    for i in range(3):
        scheduler.put(("hint", draft(f"d{i}", "typing")))
    scheduler.put(("submit", draft("sent", "other")))
    run(scheduler)
    work.wait("sent")
    until(lambda: any(kind == "hint" for kind, _ in work.log))
    hints = [(i, rid) for i, (kind, rid) in enumerate(work.log) if kind == "hint"]
    assert [rid for _, rid in hints] == ["d2"], "the newest draft alone"
    assert work.first("Started", "sent") < hints[0][0], "the Send did not wait for a draft's rendering"


def test_a_send_of_the_chat_being_typed_in_drops_its_draft(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    scheduler = Scheduler(work, many=work.many)
    scheduler.put(("hint", draft("d0", "typing")))
    scheduler.put(("submit", draft("sent", "typing")))
    scheduler.put(("call", lambda _work: work.log.append(("call", None))))
    run(scheduler)
    until(lambda: ("call", None) in work.log)
    assert not any(kind == "hint" for kind, _ in work.log), "the draft it sent is not prefilled after it"


def test_a_send_behind_a_running_hint_starts_after_one_chunk(work: FakeWork, run: Callable[..., Scheduler]) -> None:
    """The hint's prefill runs a chunk at a time, the intake looked at between chunks: a Send that arrives
    during a chunk starts when that chunk ends, not when the draft's prefill does."""
    scheduler = Scheduler(work, many=work.many)
    work.idle_jobs = 1000
    began = threading.Event()
    release = threading.Event()
    chunks: list[int] = []

    def idle() -> tuple[Callable[[], None] | None, float | None]:
        if work.idle_jobs <= 0:
            return None, None

        def chunk() -> None:  # a hint's chunk: the first one holds until the Send is on the intake
            work.idle_jobs -= 1
            chunks.append(len(work.log))
            work.log.append(("idle", None))
            began.set()
            release.wait(10)

        return chunk, 0

    work.idle = idle  # type: ignore[method-assign]
    run(scheduler)
    assert began.wait(10)
    scheduler.put(("submit", request(rid="sent")))
    release.set()
    work.wait("sent")
    started = work.first("Started", "sent")
    before = [at for at in chunks if at < started]
    assert len(before) == 1, f"{len(before)} chunks ran before the Send started"
    work.idle_jobs = 0
