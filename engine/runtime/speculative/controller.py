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

Each drafted row's cost is measured too, per source (``SourceStats.row_cost``:
the extra time of a verification step per drafted token, in plain steps, the
drafts' making included, so a draft model's forwards count), and so is each source's
chance that its next drafted token is accepted (``SourceStats.run_rate``: tokens
accepted over tokens accepted plus rejections, recent steps weighing more).
``draft_length`` never asks for more tokens than the expected tokens per unit of
time favour: on a model whose extra rows cost little (fp16 weights, bound by
memory) that is the source's own ``k``; where each row costs much (q8-cpu's
integer kernel, bound by its instructions: measured 0.6 of a plain step a row),
a source that is seldom right drafts a token or two, and one copying a passage
still drafts long.

In a batch (``engine.runtime.batching``: several requests decoding in one model step) a drafted token
slows every row of the step, not only its own: a lone row's rule would have four rows draft where the
rows they delay lose more than the drafts bring.  So the cost of a drafted token is also known per batch
width (:meth:`Controller.observe`, from every model step's measured time, rows and tokens fed): the plain
step time at each width (a step that fed one token a row), and per width bucket (1, 2, 3-4, 5-8) the
extra time of a step per drafted token.  ``draft_length(source, width)`` with ``width`` > 1 drafts ``k``
tokens only where the batch's tokens per unit of time grow: with the source's run rate ``p`` and its
own time to make a token ``m``, ``(width - 1 + E[k]) / (1 + c k) > width``, where ``E[k] = 1 + p + ... +
p^k`` and ``c = (extra + m) / plain``, both at this width (:func:`best_length`); else it drafts nothing,
asking for one token every ``PROBE_EVERY`` steps so that a source that starts copying is noticed.  ``p``
is the row's own when it is given (:class:`RowRates`, the source's rate as its prior): one reply copying
an earlier answer must not have the replies beside it, or after it, draft long from the same source.  Until
a width's plain step is measured its rows draft nothing; until its drafted token's cost is measured,
they draft as a lone row would (one step measures it).  A lone row (``width`` 1) keeps the rule above.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PLAIN_WINDOW = 64  # plain steps kept for the speed-up's reference
PLAIN_MIN = 8  # plain steps measured before a speed-up is stated at all
WIDTH_BUCKETS = (1, 2, 4, 8)  # a batch width's bucket: the first bound at least as wide (1, 2, 3-4, 5-8, wider)
PROBE_EVERY = 16  # batched steps between one-token probes of a source whose drafts do not pay in a batch


def bucket(width: int) -> int:
    """The bucket of batch widths ``width`` shares its drafted-token cost with: 1, 2, 4 (3-4), 8 (5-8), ..."""
    for bound in WIDTH_BUCKETS:
        if width <= bound:
            return bound
    return width


@dataclass(frozen=True)
class StepShape:
    """One model step as measured: ``number`` (which step; the same for every row of a batched step),
    ``width`` (rows, one a request), ``fed`` (tokens fed over all rows: ``width`` for a plain step),
    ``seconds`` (the model call's own time)."""

    number: int
    width: int
    fed: int
    seconds: float


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
    run_accepted: float = 1.0  # decaying count of accepted tokens ...
    run_rejected: float = 1.0  # ... and of rejections (a draft not accepted whole): run_rate's parts
    row_cost: float | None = None  # EMA: a verification step's extra time per token it drafted, in plain steps
    make_s: float | None = None  # EMA: seconds to make one drafted token (proposing, a draft model's forwards)
    probed: int = 0  # the batched step it was last asked for a one-token probe

    def run_rate(self) -> float:
        """The chance that its next drafted token is accepted, given the ones before it were."""
        return self.run_accepted / (self.run_accepted + self.run_rejected)


@dataclass
class RowRates:
    """One reply's own run rate per source: a batch mixes replies that copy with replies that do not."""

    counts: dict[str, list[float]] = field(default_factory=dict)  # source -> [accepted, rejections], decaying

    def record(self, source: str, drafted: int, accepted: int) -> None:
        c = self.counts.setdefault(source, [0.0, 0.0])
        c[0] = 0.9 * c[0] + accepted
        c[1] = 0.9 * c[1] + (accepted < drafted)

    def rate(self, source: str, prior: float, weight: float = 2.0) -> float:
        """This reply's chance that its next drafted token from ``source`` stands, ``prior`` (the source's own
        over every reply) counting as ``weight`` tokens until the reply has its own."""
        accepted, rejected = self.counts.get(source, (0.0, 0.0))
        return (accepted + weight * prior) / (accepted + rejected + weight)


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
    plain_at: dict[int, float] = field(default_factory=dict)  # EMA: a plain step's seconds, per batch width
    extra_at: dict[int, float] = field(default_factory=dict)  # EMA: seconds a drafted token adds, per width bucket
    batched: int = 0  # batched model steps observed
    _last_shape: int = 0  # the step number observed last (a batched step is reported by each of its rows)

    def draft_length(self, source: str, width: int = 1, row: RowRates | None = None) -> int:
        """Tokens ``source`` may draft for a row stepping with ``width - 1`` others (0: none); ``row``: that
        reply's own run rates."""
        s = self.stats.setdefault(source, SourceStats())
        if self.step < s.paused_until or self.step < s.idle_until:
            return 0
        k = self.k.setdefault(source, 4)
        rate = s.run_rate() if row is None else row.rate(source, s.run_rate())
        if width <= 1:
            if self.plain_step_s is None:
                return 0
            return k if s.row_cost is None else min(k, best_length(rate, s.row_cost, self.k_max))
        plain = self.plain_at.get(width)
        if plain is None:  # this width's plain step is not measured yet: a plain step measures it
            return 0
        extra = self.extra_at.get(bucket(width))
        if extra is None:  # what a drafted token costs at this width is not measured yet: this step measures it
            return k
        cost = (extra + (s.make_s or 0.0)) / plain
        best = best_length(rate, cost, self.k_max, width)
        if best == 0 and self.batched - s.probed >= PROBE_EVERY:
            s.probed = self.batched  # one token now and then: its acceptance keeps the run rate current
            return 1
        return min(k, best)

    def observe(self, shape: StepShape) -> None:
        """A model step's measured shape: what a plain step and a drafted token cost at its width.  Each row of
        a batched step reports it; it counts once."""
        if shape.number == self._last_shape or shape.width < 1 or shape.seconds <= 0:
            return
        self._last_shape = shape.number
        if shape.width > 1:
            self.batched += 1
            self.step += 1  # a lone step counts in record / record_plain
        drafted = shape.fed - shape.width
        plain = self.plain_at.get(shape.width)
        if drafted <= 0:
            self.plain_at[shape.width] = shape.seconds if plain is None else 0.8 * plain + 0.2 * shape.seconds
        elif plain is not None:
            extra = max(0.0, shape.seconds - plain) / drafted
            b = bucket(shape.width)
            old = self.extra_at.get(b)
            self.extra_at[b] = extra if old is None else 0.8 * old + 0.2 * extra

    def record_made(self, source: str, drafted: int, seconds: float) -> None:
        """``source`` took ``seconds`` to propose ``drafted`` tokens."""
        if drafted:
            s = self.stats.setdefault(source, SourceStats())
            per = seconds / drafted
            s.make_s = per if s.make_s is None else 0.8 * s.make_s + 0.2 * per

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

    def record_accepted(self, source: str, drafted: int, accepted: int) -> None:
        """``accepted`` of ``source``'s ``drafted`` tokens stood (in any step, batched or not)."""
        s = self.stats.setdefault(source, SourceStats())
        s.idle_wait = 0
        s.drafted += drafted
        s.accepted += accepted
        s.steps += 1
        s.run_accepted = 0.9 * s.run_accepted + accepted
        s.run_rejected = 0.9 * s.run_rejected + (accepted < drafted)
        k = self.k.get(source, 4)
        if accepted == drafted:
            self.k[source] = min(self.k_max, k + 2)
        else:
            floor = self.k_floor.get(source, 1) if accepted else 1  # a miss from the start: a cold source
            self.k[source] = max(floor, min(k, accepted + 1))

    def record(self, source: str, drafted: int, accepted: int, seconds: float) -> None:
        """A lone verification step of ``source``'s drafts took ``seconds``, making the drafts included."""
        self.step += 1
        s = self.stats.setdefault(source, SourceStats())
        if self.plain_step_s and drafted:
            extra = max(0.0, seconds / self.plain_step_s - 1.0) / drafted
            s.row_cost = extra if s.row_cost is None else 0.8 * s.row_cost + 0.2 * extra
        if self.plain_step_s:
            gain = (accepted + 1) * self.plain_step_s / seconds
            s.efficiency = 0.7 * s.efficiency + 0.3 * gain
            if s.efficiency < 1.0:  # drafting costs more than it brings: back off, exponentially
                s.paused_until = self.step + s.pause
                s.pause = min(s.pause * 2, 256)
                s.efficiency = 1.0
            elif accepted == drafted:
                s.pause = 8
        self.record_accepted(source, drafted, accepted)


def best_length(rate: float, row_cost: float, k_max: int, width: int = 1) -> int:
    """The draft length with the most tokens expected per unit of time for a step of ``width`` rows, when each
    drafted token is accepted with chance ``rate`` after the ones before it and costs the step ``row_cost``
    plain steps (of this width).  A lone row (``width`` 1) gets 1 to ``k_max``; in a batch, 0 where no length
    beats not drafting: the other rows' tokens are delayed too, so a step of ``width`` rows yields
    ``width - 1 + E[k]`` tokens in ``1 + row_cost * k`` plain steps against ``width`` in one."""
    best, best_value = (1, 0.0) if width <= 1 else (0, float(width))
    expected, term = 1.0, 1.0  # tokens this row's step yields: the model's own one, plus each accepted draft
    for k in range(1, k_max + 1):
        term *= rate
        expected += term
        value = (width - 1 + expected) / (1.0 + row_cost * k)
        if value > best_value:
            best, best_value = k, value
    return best
