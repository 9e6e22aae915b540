"""A first start chats at once: quant="auto" loads float32, measures the modes between replies, then switches.

A real engine on the tiny model in an empty data folder; the measured forward is the mode probe's test fake
(``tests.engine.model.test_mode_probe.fake``), so fp16-cpu wins by the same figures on every machine.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from engine.api import AnswerCacheSettings, Done, Error, Loaded, ModelSpec, Request, Sampling, Tuning
from engine.runtime.engine import Engine, EngineOptions
from tests.engine.model.test_mode_probe import STEADY, fake

AGREE = {"float32": 1.0, "fp16-cpu": 0.995, "q8-cpu": 0.999, "int8-cpu": 0.95, "bfloat16": 0.999}


class Recorder:
    def __init__(self) -> None:
        self.events: list[object] = []
        self.changed = threading.Condition()

    def __call__(self, event: object) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def wait_for(self, check, timeout: float = 120.0) -> object:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((e for e in self.events if check(e)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"timed out; events: {[type(e).__name__ for e in self.events]}"
                self.changed.wait(left)


def ask(engine: Engine, recorder: Recorder, text: str) -> Done:
    request = Request(uuid.uuid4().hex, ({"role": "user", "content": text},), Sampling(max_tokens=6))
    engine.submit(request)
    end = recorder.wait_for(lambda e: isinstance(e, Done | Error) and e.request_id == request.id)
    assert isinstance(end, Done), end
    return end


@pytest.fixture()
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def start(tiny_dir: Path, recorder: Recorder) -> Engine:
    options = EngineOptions(answer_cache=AnswerCacheSettings(enabled=False), defer_probe=True)
    engine = Engine(recorder, options)
    engine.load(ModelSpec(source=str(tiny_dir), dtype="float32", quant="auto"))
    return engine


def test_a_first_start_answers_on_float32_then_switches_to_the_measured_mode(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(monkeypatch, STEADY, AGREE)
    recorder = Recorder()
    engine = start(tiny_dir, recorder)
    try:
        first = recorder.wait_for(lambda e: isinstance(e, Loaded))
        assert isinstance(first, Loaded) and first.info.quant == "none" and first.dtype == "float32"
        assert first.info.mode_probe and first.info.mode_probe.get("deferred") is True
        reply = ask(engine, recorder, "Hello there")  # answered whatever the measurement is doing
        assert reply.finish_reason in ("length", "stop") and reply.text
        end = recorder.wait_for(lambda e: isinstance(e, Tuning) and e.done)
        assert isinstance(end, Tuning) and end.message.startswith("Switched to fp16-cpu"), end.message
        loads = [e for e in recorder.events if isinstance(e, Loaded)]
        assert len(loads) == 2 and loads[1].info.quant == "fp16-cpu", "switched between replies"
        assert loads[1].load_s == first.load_s, "the load time said stays the time to the first usable model"
        said = [e.message for e in recorder.events if isinstance(e, Tuning)]
        assert said[0].startswith("Chatting on float32") and len(said) > 3, said
        after = ask(engine, recorder, "Hello again")
        assert after.finish_reason in ("length", "stop")
    finally:
        engine.shutdown()

    again = Recorder()  # the next start: the saved choice is loaded at once, nothing measured
    engine = start(tiny_dir, again)
    try:
        loaded = again.wait_for(lambda e: isinstance(e, Loaded))
        assert isinstance(loaded, Loaded) and loaded.info.quant == "fp16-cpu"
        ask(engine, again, "Hello")
        assert not [e for e in again.events if isinstance(e, Tuning)] and engine.measuring is None
    finally:
        engine.shutdown()


def test_a_request_waits_for_at_most_one_measuring_step(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake(monkeypatch, STEADY, AGREE)
    timeline: list[tuple[str, float]] = []
    step, serve = Engine._measure_step, Engine.serve

    def measure_step(self: Engine) -> None:
        timeline.append(("step", time.perf_counter()))
        time.sleep(0.05)  # a step that takes a while: requests pile up behind it if they can
        step(self)

    def served(self: Engine, request: Request, *rest: Any) -> None:
        timeline.append(("serve", time.perf_counter()))
        serve(self, request, *rest)

    monkeypatch.setattr(Engine, "_measure_step", measure_step)
    monkeypatch.setattr(Engine, "serve", served)
    recorder = Recorder()
    engine = start(tiny_dir, recorder)
    try:
        recorder.wait_for(lambda e: isinstance(e, Tuning) and not e.done and "background:" in e.message)
        asked = time.perf_counter()
        ask(engine, recorder, "Hello there")
        taken = next(t for kind, t in timeline if kind == "serve" and t > asked)
        steps_between = [t for kind, t in timeline if kind == "step" and asked < t < taken]
        assert len(steps_between) <= 1, "the request took the engine at the next step boundary"
        end = recorder.wait_for(lambda e: isinstance(e, Tuning) and e.done)
        assert isinstance(end, Tuning) and end.message.startswith("Switched to")
    finally:
        engine.shutdown()


def test_the_measurement_waits_while_a_message_is_being_typed(
    tiny_dir: Path, fresh_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hints (prefill while typing) say a Send is coming: no measuring step starts meanwhile, so none holds it."""
    fake(monkeypatch, STEADY, AGREE)
    steps: list[float] = []
    step = Engine._measure_step

    def measure_step(self: Engine) -> None:
        steps.append(time.monotonic())
        step(self)

    monkeypatch.setattr(Engine, "_measure_step", measure_step)
    recorder = Recorder()
    engine = start(tiny_dir, recorder)
    try:
        recorder.wait_for(lambda e: isinstance(e, Tuning) and not e.done and "background:" in e.message)
        typing_began = time.monotonic()
        for n in range(12):  # a person typing for about 2.4 s
            draft = ({"role": "user", "content": "Tell me about the harbour"[: 10 + n]},)
            engine.hint(Request(uuid.uuid4().hex, draft, Sampling(max_tokens=6), conversation_id="c"))
            time.sleep(0.2)
        typing_ended = time.monotonic()
        during = [t for t in steps if typing_began + 0.3 < t < typing_ended]  # one step may be under way
        assert during == [], "no measuring step starts while hints come in"
        end = recorder.wait_for(lambda e: isinstance(e, Tuning) and e.done)  # and it goes on afterwards
        assert isinstance(end, Tuning) and end.message.startswith("Switched to")
        assert any(t > typing_ended for t in steps)
    finally:
        engine.shutdown()
