"""How many tokens to draft, per source, from what drafting has earned.

:class:`Controller` keeps, across requests, an EMA of the measured plain
(one-token) step time and, per draft source, the draft length ``k`` and an
efficiency: tokens gained per verification step, times the plain step time,
over the step's own time.  ``draft_length(source)`` is 0 until a plain step has
been measured and while a source is paused; a source whose efficiency falls
below 1 (drafting costs more than it brings) is paused for a number of steps
that doubles each time, so speculative decoding is never much slower than
plain decoding.  A step's time includes making its drafts.  A source asked for
drafts that proposes none has spent its asking time for nothing
(:meth:`Controller.record_empty`): it is asked again after 1, 2, 4, ... up to
``idle_max`` steps, and at once again after it proposes something.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PLAIN_WINDOW = 64  # plain steps kept for the speed-up's reference
PLAIN_MIN = 8  # plain steps measured before a speed-up is stated at all


@dataclass
class SourceStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    efficiency: float = 1.0  # EMA of (tokens gained per step) * plain step time / step time
    paused_until: int = 0
    pause: int = 8
    idle_until: int = 0  # not asked before this step: it proposed nothing lately
    idle_wait: int = 0
    empty_s: float = 0.0  # time spent asking it for drafts it did not have


@dataclass
class Controller:
    """Chooses how many tokens to draft, per source, from what drafting has earned."""

    k_max: int = 12
    # After a rejection k shrinks to the accepted length + 1, but, when part of the draft was
    # accepted, not below a source's floor. Lookups cost nothing to propose and a few more rows
    # cost little to verify (a step verifying 4 to 8 tokens measured 1.0-1.5x a plain one
    # here), so their drafts stay long enough to catch the next run of copied text; a draft
    # model pays a forward per drafted token, so it has no floor.
    k_floor: dict[str, int] = field(default_factory=lambda: {"lookup": 4, "answers": 4})
    k: dict[str, int] = field(default_factory=dict)
    stats: dict[str, SourceStats] = field(default_factory=dict)
    plain_step_s: float | None = None  # EMA of measured single-token steps
    plain_steps: deque[float] = field(default_factory=lambda: deque(maxlen=PLAIN_WINDOW))  # the latest ones
    step: int = 0
    idle_max: int = 8  # a quiet source is asked at least this often (a copied passage may start any time)

    def draft_length(self, source: str) -> int:
        s = self.stats.setdefault(source, SourceStats())
        if self.plain_step_s is None or self.step < s.paused_until or self.step < s.idle_until:
            return 0
        return self.k.setdefault(source, 4)

    def record_plain(self, seconds: float) -> None:
        self.step += 1
        self.plain_step_s = seconds if self.plain_step_s is None else 0.8 * self.plain_step_s + 0.2 * seconds
        self.plain_steps.append(seconds)

    def plain_step_reference(self) -> float | None:
        """The median of the latest plain steps, once there are ``PLAIN_MIN`` of them (else None): what a
        reply's speed-up is stated against.  The EMA above starts from the first step, which on a new
        model is often several times the rest (a 176 ms first step against a 14.7 ms median made a "7.4x")."""
        if len(self.plain_steps) < PLAIN_MIN:
            return None
        return statistics.median(self.plain_steps)

    def record_empty(self, source: str, seconds: float) -> None:
        """``source`` was asked for drafts and had none (``seconds`` spent asking): ask it less often."""
        s = self.stats.setdefault(source, SourceStats())
        s.empty_s += seconds
        s.idle_wait = min(self.idle_max, max(1, 2 * s.idle_wait))
        s.idle_until = self.step + s.idle_wait

    def record(self, source: str, drafted: int, accepted: int, seconds: float) -> None:
        """A verification step of ``source``'s drafts took ``seconds``, making the drafts included."""
        self.step += 1
        s = self.stats.setdefault(source, SourceStats())
        s.idle_wait = 0
        s.drafted += drafted
        s.accepted += accepted
        s.steps += 1
        if self.plain_step_s:
            gain = (accepted + 1) * self.plain_step_s / seconds
            s.efficiency = 0.7 * s.efficiency + 0.3 * gain
            if s.efficiency < 1.0:  # drafting costs more than it brings: back off, exponentially
                s.paused_until = self.step + s.pause
                s.pause = min(s.pause * 2, 256)
                s.efficiency = 1.0
            elif accepted == drafted:
                s.pause = 8
        k = self.k.get(source, 4)
        if accepted == drafted:
            self.k[source] = min(self.k_max, k + 2)
        else:
            floor = self.k_floor.get(source, 1) if accepted else 1  # a miss from the start: a cold source
            self.k[source] = max(floor, min(k, accepted + 1))
