"""A first start's weight-mode measurement, run by the engine between replies.

On a first start with ``quant="auto"`` the window's engine (``EngineOptions.defer_probe``) loads float32 and
answers at once; the measurement that picks the fastest mode (``engine.model.mode_probe.measure``: build each
candidate, compare answers, time decode steps) is left in ``LoadedModel.measuring``.  :class:`Measuring` runs
it one step at a time while the engine's queue is empty, so a request waits for at most one step (a
candidate's build, about 2-4 s on the bundled model the first time, or one piece of the text, well under a
second).  While the native decode step is still being compiled it waits for it (:meth:`waiting`), since
the fp16-cpu and q8-cpu candidates would otherwise be timed on the slower eager path and lose unfairly.
Its time budget counts its own steps only (:class:`~engine.model.mode_probe.Clock`), so replies between
steps do not use it up.  :meth:`step` returns a message for the status line, and at the end a
:class:`Outcome`: the model to switch to (or None when float32 stays) and the record that says why.

The candidates' builds (reading the weights and quantizing them: seconds each, most of the measurement)
do not run on the engine thread: :class:`Builds` makes the float32-computing ones (fp16-cpu, q8-cpu) on a
thread of its own, one torch thread at the lowest CPU priority, and pauses it between every two torch
ops while a request is served (``engine.runtime.activity``), so a Send is taken at once and its reply
shares the CPU with nothing (a build is not a step any more).  :meth:`Measuring.waiting` is true until
they are all made; the engine then runs the rest (other candidates' builds, the text, the timing) one step
at a time as before.  A candidate computing in another dtype is still built on the engine thread:
transformers sets the process's default dtype while it builds one, which a decode step beside it would
take up.  :meth:`Measuring.stop` ends the thread (at its next torch op) before another model loads, since
two transformers builds at once patch the same functions.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.api import ModelSpec
from engine.model.loader import LoadedModel, ModeMeasurement
from engine.model.mode_probe import REFERENCE, Clock, label
from engine.quant import native
from engine.runtime import activity

BUILDING = "building"  # native.status() while the compile runs
ASIDE_DTYPES = ("float32",)  # candidates built beside the engine: transformers leaves the default dtype alone
NICE = 19  # the builds' thread, below the engine's (engine.answer_cache.embed.lower_priority)
STOP_POLL_S = 0.1  # a paused build looks at stop() this often


@dataclass
class Outcome:
    loaded: LoadedModel | None  # the chosen mode's model, or None: float32 stays
    record: dict[str, Any]
    message: str


class Stopped(Exception):
    """Raised inside a build on :class:`Builds`' thread once :meth:`Builds.stop` was called."""


@dataclass
class Builds:
    """The candidates ``wanted`` built by ``build(mode, dtype)`` on one thread, in order, yielding to requests."""

    build: Any
    wanted: list[tuple[str, str]]
    done: dict[tuple[str, str], tuple[Any, float]] = field(default_factory=dict)  # candidate -> (built, seconds)
    failed: dict[tuple[str, str], BaseException] = field(default_factory=dict)
    paused_s: float = 0.0  # seconds the thread waited for requests to end
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self.wanted and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="brisk-measure-build", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float | None = 60.0) -> None:
        """End the thread at its next torch op and wait for it (a build's patches are put back on the way out)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def take(self, candidate: tuple[str, str]) -> tuple[Any, float] | None:
        """The built candidate and the thread seconds it took (once), or None when it was not built here."""
        if candidate in self.failed:
            raise self.failed.pop(candidate)
        return self.done.pop(candidate, None)

    def _gate(self) -> None:
        """Before each torch op of a build: wait while a request is served; raise :class:`Stopped` once stopped."""
        if self._stop.is_set():
            raise Stopped
        if activity.busy():
            began = time.monotonic()
            while not activity.wait_idle(STOP_POLL_S):
                if self._stop.is_set():
                    raise Stopped
            self.paused_s += time.monotonic() - began

    def _run(self) -> None:
        from engine.answer_cache.embed import limit_threads, lower_priority

        lower_priority(NICE)
        limit_threads(1)  # the builds ran on the probe's one thread before; no OpenMP team beside the engine's
        for candidate in self.wanted:
            began = time.thread_time()
            try:
                with activity.pause_between_ops(self._gate):
                    built = self.build(*candidate)
            except Stopped:
                return
            except Exception as exc:  # handed to the measurement, which reports it as before
                self.failed[candidate] = exc
                continue
            self.done[candidate] = (built, time.thread_time() - began)
            if self._stop.is_set():
                return


class Measuring:
    """One deferred measurement for the model loaded by load number ``number`` of ``spec``."""

    def __init__(self, measurement: ModeMeasurement, tokenizer: Any, spec: ModelSpec, number: int) -> None:
        self.measurement = measurement
        self.spec = spec
        self.number = number
        self.clock = Clock()
        self._tokenizer = tokenizer
        self._steps: Any = None
        self._native = any(mode in ("fp16-cpu", "q8-cpu") for mode, _ in measurement.candidates)
        aside = [c for c in measurement.candidates if c != REFERENCE and c[1] in ASIDE_DTYPES]
        self.builds = Builds(measurement.build, aside)
        measurement.build = self._build  # the measurement takes what the thread built
        if self._native:
            native.prepare()  # loaded now where built, else compiled in the background

    def waiting(self) -> bool:
        """Nothing to do now: the native step is still being compiled, or the candidates are being built beside
        the engine (the engine looks again shortly)."""
        if self._native and self._steps is None and native.status() == BUILDING:
            return True
        self.builds.start()
        return self.builds.running

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop building (another model is about to load, or the engine stops) and wait for it at most ``timeout``
        s; the measurement is not used any more."""
        self.builds.stop(timeout)

    def _build(self, mode: str, dtype_name: str) -> Any:
        taken = self.builds.take((mode, dtype_name))
        if taken is None:
            return self.builds.build(mode, dtype_name)  # built here, on the engine thread, as before
        built, seconds = taken
        self.clock.seconds += seconds  # the measurement's own seconds, as if built within its step
        return built

    def step(self) -> str | Outcome:
        """Run one step; a message saying what it did, or the :class:`Outcome` after the last."""
        if self.waiting():
            if self.builds.running:
                return f"building the weight modes ({len(self.builds.done)} of {len(self.builds.wanted)} built)"
            return "waiting for the fast decode step to compile"
        if self._steps is None:
            self._steps = self.measurement.steps(self.clock, self._tokenizer)
        try:
            said = self.clock.run(lambda: next(self._steps))
        except StopIteration as end:
            result = end.value
            record = result[2]
            loaded = self.measurement.finish(result)
            return Outcome(loaded, record, outcome_message(record, loaded))
        return str(said)


def outcome_message(record: dict[str, Any], loaded: LoadedModel | None) -> str:
    """The status line's sentence for a finished measurement."""
    if loaded is not None:
        figures = record.get("modes", {}).get(record.get("chosen"), {})
        reference = record.get("modes", {}).get("float32", {})
        step, base = figures.get("step_ms"), reference.get("step_ms")
        faster = f" (decode steps {base / step:.1f}x as fast as float32)" if step and base else ""
        return f"Switched to {label((record['mode'], record['dtype']))}{faster}, measured in the background"
    if record.get("saved"):
        return "Measured the weight modes in the background: float32 stays, no other mode is clearly faster"
    return "Could not measure the weight modes (the CPU was busy): float32 stays; measured again on the next start"
