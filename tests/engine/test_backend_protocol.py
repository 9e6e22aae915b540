"""Every backend has every verb of ``engine.api.Backend`` with the protocol's signature, so the window and the
CLI call them without asking first; a remote server's verbs for Brisk's own caches do nothing and say so."""

from __future__ import annotations

import inspect
import queue
from collections.abc import Callable
from typing import Any

import pytest

from engine import client
from engine.api import Backend, Request, Sampling
from engine.remote import RemoteBackend
from tests.support.fake_engine import FakeEngine

VERBS = sorted(name for name, value in vars(Backend).items() if inspect.isfunction(value) and not name.startswith("_"))


def engine_class() -> type:
    from engine.runtime.engine import Engine

    return Engine


BACKENDS: dict[str, Callable[[], type]] = {
    "Engine": engine_class,
    "RemoteBackend": lambda: RemoteBackend,
    "FakeEngine": lambda: FakeEngine,
}


def parameters(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    """(name, kind, default, annotation) of each parameter after ``self``; annotations as written (strings)."""
    listed = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.kind, p.default, p.annotation) for p in listed]


def test_the_protocol_lists_the_verbs_the_window_and_the_cli_use() -> None:
    used = {"load", "submit", "cancel", "shutdown", "hint", "count_tokens", "remember_answer"}
    used |= {"set_prefix_budget", "clear_prefix_cache"}
    assert set(VERBS) == used
    for verb in VERBS:
        assert (getattr(Backend, verb).__doc__ or "").strip(), f"Backend.{verb} says what a backend does"


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_takes_every_verb_as_the_protocol_does(name: str) -> None:
    cls = BACKENDS[name]()
    for verb in VERBS:
        method = getattr(cls, verb, None)
        assert callable(method), f"{name} has no {verb}"
        assert parameters(method) == parameters(getattr(Backend, verb)), f"{name}.{verb}"


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_answers_as_the_protocol_says(name: str) -> None:
    cls = BACKENDS[name]()
    for verb in VERBS:
        returns = inspect.signature(getattr(cls, verb)).return_annotation
        assert returns == inspect.signature(getattr(Backend, verb)).return_annotation, f"{name}.{verb}"


def test_a_remote_server_does_nothing_for_brisks_own_caches_and_says_so() -> None:
    events: queue.Queue[object] = queue.Queue()
    backend = RemoteBackend(events.put, "http://127.0.0.1:9", "m")  # nothing is sent before load or submit
    try:
        draft = Request("r1", ({"role": "user", "content": "a draft being typed"},), Sampling(), conversation_id="c")
        assert backend.hint(draft) is False
        assert backend.count_tokens(["one two three"]) is None
        assert backend.remember_answer("question", "answer") is False
        assert backend.set_prefix_budget(64 << 20) is False
        assert backend.clear_prefix_cache() is False
    finally:
        backend.shutdown()
    assert events.empty()  # no DraftPrefill, no Warning: nothing happened
    assert not backend.results  # and nothing was sent


def test_the_local_backend_takes_the_verbs_it_has() -> None:
    events: queue.Queue[object] = queue.Queue()
    engine = client.local_backend(persist_prefixes=False)(events.put)
    try:
        assert engine.count_tokens(["one two"]) is None  # no model loaded yet
        assert engine.hint(Request("d", ({"role": "user", "content": "typing"},), Sampling())) is True
        assert engine.remember_answer("question", "answer") is True
        assert engine.set_prefix_budget(64 << 20) is True
        assert engine.clear_prefix_cache() is True
        with pytest.raises(ValueError, match="whole number of bytes"):
            engine.set_prefix_budget(-1)
    finally:
        engine.shutdown()
