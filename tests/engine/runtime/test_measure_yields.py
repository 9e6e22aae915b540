"""A first start's weight-mode builds yield to a request at once, between two torch ops, not after a whole build.

A real engine on the tiny model in an empty data folder (as ``test_background_measure``); each candidate's
build is made slow by torch ops after the real one, each op's time and thread recorded.  A question asked
while a build runs is served before that build ends, no op of the build runs while the reply is made, and
the build goes on after it: the measurement still ends by switching.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.api import Loaded, Request, Tuning
from engine.model import loader
from engine.runtime import activity
from engine.runtime.engine import Engine
from tests.engine.model.test_mode_probe import STEADY, fake
from tests.engine.runtime.test_background_measure import AGREE, Recorder, ask, start

OPS = 150  # torch ops after each real build, a few ms apart


@pytest.fixture()
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def test_a_build_pauses_between_ops_while_a_request_is_served(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(monkeypatch, STEADY, AGREE)
    ops: list[tuple[str, float, str]] = []  # (candidate's mode, time, thread)
    real_build = loader._build

    def slow_build(auto_model: Any, location: str, mode: str, *rest: Any, **kw: Any) -> Any:
        built = real_build(auto_model, location, mode, *rest, **kw)
        for _ in range(OPS):
            torch.ones(4).add_(1)  # a torch op: where a build may pause
            ops.append((mode, time.perf_counter(), threading.current_thread().name))
            time.sleep(0.004)
        return built

    served: list[tuple[float, float]] = []
    serve = Engine.serve

    def timed_serve(self: Engine, request: Request, *rest: Any) -> None:
        began = time.perf_counter()
        try:
            serve(self, request, *rest)
        finally:
            served.append((began, time.perf_counter()))

    monkeypatch.setattr(loader, "_build", slow_build)
    monkeypatch.setattr(Engine, "serve", timed_serve)
    recorder = Recorder()
    engine = start(tiny_dir, recorder)
    try:
        deadline = time.monotonic() + 120
        while not [op for op in ops if op[0] != "none"]:  # a candidate's build is under way
            assert time.monotonic() < deadline, "no candidate was built"
            time.sleep(0.005)
        mode = next(op[0] for op in ops if op[0] != "none")
        yields = activity.yields()
        ask(engine, recorder, "Hello there")
        end = recorder.wait_for(lambda e: isinstance(e, Tuning) and e.done)
        assert isinstance(end, Tuning) and end.message.startswith("Switched to"), end.message
        (began, ended), *_ = served
        own = [t for m, t, _ in ops if m == mode]
        assert len(own) == OPS and own[-1] > ended, "the request was served before the build it met had ended"
        assert not [t for t in own if began < t < ended], "the build ran an op while the reply was made"
        assert activity.yields() > yields
        assert {name for m, _, name in ops if m == mode} == {"brisk-measure-build"}, "built beside the engine"
    finally:
        engine.shutdown()


def test_a_load_stops_the_builds_first(tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another model's load waits for the builds beside the engine to end: two transformers builds at once
    patch the same functions."""
    fake(monkeypatch, STEADY, AGREE)
    real_build = loader._build
    building = threading.Event()

    def slow_build(auto_model: Any, location: str, mode: str, *rest: Any, **kw: Any) -> Any:
        built = real_build(auto_model, location, mode, *rest, **kw)
        if mode != "none":
            building.set()
            for _ in range(10_000):
                torch.ones(4).add_(1)
                time.sleep(0.004)
        return built

    monkeypatch.setattr(loader, "_build", slow_build)
    recorder = Recorder()
    engine = start(tiny_dir, recorder)
    try:
        assert building.wait(120)
        measuring = engine.measuring
        assert measuring is not None and measuring.builds.running
        engine.load(engine.measuring.spec)  # type: ignore[union-attr]
        recorder.wait_for(lambda e: sum(isinstance(x, Loaded) for x in recorder.events) >= 2, timeout=120)
        assert not measuring.builds.running, "the builds were stopped before the load"
    finally:
        engine.shutdown()
