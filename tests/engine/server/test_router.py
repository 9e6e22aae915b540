"""engine.client.Router: where a backend meets the built-in server.  The server's requests go straight to the
backend's submit and their events come back to the server only; every other event goes to the sink; another
backend built after a drop takes the server's next requests; with none, a server request is refused."""

from __future__ import annotations

import asyncio
import queue
import time

import pytest

from engine.api import Done, Event, Loaded, ModelSpec, Request, Sampling
from engine.client import Client, Router
from engine.server.hub import Entry
from tests.support.fake_engine import FakeEngine

WAIT_S = 10.0


def request(request_id: str, origin: str = "") -> Request:
    return Request(request_id, ({"role": "user", "content": "Hi"},), Sampling(), origin=origin)


def until(events: queue.Queue[object], kind: type, request_id: str | None = None) -> list[object]:
    """The sink's events up to the first of ``kind`` (of ``request_id`` when given)."""
    seen: list[object] = []
    while True:
        event = events.get(timeout=WAIT_S)
        seen.append(event)
        if isinstance(event, kind) and (request_id is None or getattr(event, "request_id", None) == request_id):
            return seen


def served(router: Router, request_id: str) -> list[Event]:
    """Ask the router's server as an HTTP handler would, on an event loop; its request's events."""
    server = router.serve()

    async def ask() -> list[Event]:
        entry = Entry(request_id, "test", "/v1/chat/completions", time.time())
        events = server.hub.open(request(request_id, origin="server"), entry)
        got: list[Event] = []
        while not got or not isinstance(got[-1], Done):
            got.append(await asyncio.wait_for(events.get(), WAIT_S))
        return got

    return asyncio.run(ask())


def test_the_servers_events_go_to_the_server_and_the_rest_to_the_sink() -> None:
    router = Router()
    sink: queue.Queue[object] = queue.Queue()
    backend = router.build(FakeEngine, sink.put)
    assert isinstance(backend, FakeEngine) and router.backend is backend
    backend.load(ModelSpec())
    until(sink, Loaded)

    events = served(router, "s1")
    assert {e.request_id for e in events} == {"s1"} and isinstance(events[-1], Done)
    assert [(r.id, r.origin) for r in backend.requests] == [("s1", "server")]  # the backend's own submit

    backend.submit(request("w1"))  # the window's, on the same backend
    window = until(sink, Done, "w1")
    assert {getattr(e, "request_id", None) for e in window} == {"w1"}  # none of the server's
    entries = router.server.snapshot()[1] if router.server else []
    assert [(e.request_id, e.status) for e in entries] == [("s1", "done")]
    backend.shutdown()


def test_a_dropped_backend_takes_no_server_request_and_the_next_one_does() -> None:
    router = Router()
    sink: queue.Queue[object] = queue.Queue()
    with pytest.raises(RuntimeError, match="not running yet"):
        router.submit(request("s0", origin="server"))
    router.cancel("s0")  # nothing to cancel on: no error

    first = router.build(FakeEngine, sink.put)
    assert router.drop() is first and router.backend is None
    with pytest.raises(RuntimeError, match="not running yet"):
        served(router, "s1")
    first.shutdown()
    assert isinstance(first, FakeEngine) and first.requests == []

    second = router.build(FakeEngine, sink.put)
    second.load(ModelSpec())
    until(sink, Loaded)
    assert isinstance(served(router, "s2")[-1], Done)
    assert isinstance(second, FakeEngine) and [r.id for r in second.requests] == ["s2"]
    second.shutdown()


def test_a_client_built_on_a_router_shares_its_server() -> None:
    router = Router()
    server = router.serve()  # brisk serve: the server first, then the engine
    with Client(FakeEngine, timeout=WAIT_S, router=router) as client:
        assert client.router is router and router.backend is client.backend
        client.load(ModelSpec())
        assert served(router, "s1")[-1].request_id == "s1"
        done = client.ask([{"role": "user", "content": "Hi"}])
        assert done.text == "Hello there, friend."
    assert server.snapshot()[2] == 1  # the server counted its own request only
