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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.api import ModelSpec
from engine.model.loader import LoadedModel, ModeMeasurement
from engine.model.mode_probe import Clock, label
from engine.quant import native

BUILDING = "building"  # native.status() while the compile runs


@dataclass
class Outcome:
    loaded: LoadedModel | None  # the chosen mode's model, or None: float32 stays
    record: dict[str, Any]
    message: str


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
        if self._native:
            native.prepare()  # loaded now where built, else compiled in the background

    def waiting(self) -> bool:
        """Nothing to do now: the native step is still being compiled (the engine looks again shortly)."""
        return self._native and self._steps is None and native.status() == BUILDING

    def step(self) -> str | Outcome:
        """Run one step; a message saying what it did, or the :class:`Outcome` after the last."""
        if self.waiting():
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
