"""``quant="auto"``: choose the fastest weight mode that keeps the model's answers, by measuring once per machine.

``choose_mode(key, candidates, build, tokenizer)`` returns ``(mode, dtype name,
record, built)``.  ``candidates`` are ``(mode, dtype)`` pairs that can run here
(the loader filters them with ``engine.quant.require``; ``("none", "float32")``
comes first and is the reference and the safe default); ``build(mode, dtype)``
loads the model that way and returns ``(model, extra info)``.  Every candidate
is measured in one pass through the forward the app decodes with
(``engine.model.kv.forward``: fast path, packed linears, the native
step), all candidates side by side, each on a KV cache of its own:

* greedy next-token agreement with float32, teacher-forced (every candidate is
  fed the same tokens, and its argmax after each is compared with float32's),
  along every kernel path a reply takes, since some modes compute differently
  for one row and for many (int8-cpu dequantizes to a bfloat16 GEMM above
  ``GEMV_ROWS`` rows and runs its int8 GEMV kernel at or below; fp16-cpu's
  decode steps run the native step, ``engine.quant.native``): the first ``PROMPT_TOKENS`` tokens of a
  fixed text in one forward (a prompt's prefill), the rest of its first
  ``AGREE_TOKENS`` in chunks of ``CHUNK`` (the small-batch kernels a
  speculative verify uses), then one-token steps fed float32's own greedy
  continuation (decode).  The agreement is matches over all these positions;
  a candidate that has missed more than the floor allows of the planned
  positions is dropped at once (it cannot reach the floor);
* the ``CHUNK``-token prefill time (median over the chunks, interleaved chunk by
  chunk across candidates) and the decode step time: the one-token steps above,
  interleaved step by step, ``WARM_STEPS`` untimed, then ``ROUNDS`` rounds of
  ``STEPS`` (a round's figure is its median), on ``THREADS`` thread (with two, a
  program busy on the other core stalls every op and the timings say nothing;
  the modes' ranking is that of their bytes and kernels), within ``BUDGET_S``.

Only candidates still within the floor after the text are stepped and timed. Of
the candidates whose agreement is at least ``MIN_AGREEMENT``, whose decode step
takes at most ``MARGIN`` of float32's (a clear win, so the choice is the same on
every first start) and whose prefill is at most ``PREFILL_LIMIT`` times
float32's (a mode that makes every first token much later is not faster), it
picks the one with the shortest *turn*: the ``CHUNK``-token prefill (a short
message's prompt) and ``TURN_STEPS`` decode steps, what a user waits for a
short reply.  (Ranked by the step alone under a limit of 1.5x on the prefill, an
Intel Xeon with AVX-512 VNNI chose fp16-cpu, whose step took 1.7x q8-cpu's,
because q8-cpu's 32-row prefill was 1.68x float32's: every reply decoded at
0.58x the speed for a first token some 40 ms sooner.) Modes in
``engine.quant.NEVER_DEFAULT`` (int4-cpu) are never candidates. A measurement
is noisy when, for some candidate, its step time relative to float32's varies
between rounds by more than ``MAX_SPREAD``; it is then measured once more (more
steps, which also count for the agreement), and
if it stays noisy float32 is used for this run and nothing is saved. A trusted
choice is saved in ``cache/cpu_mode.json`` under ``key`` (model fingerprint,
CPU model, torch version, dtype asked for) with ``PROBE_VERSION``, so later
loads skip the probe (``built`` is then None and the loader loads the recorded
mode); a record of another version, or of a mode not among ``candidates``, is
measured again, never used.  The file is read through
``engine.datafiles.load_state`` (:func:`check_records`): a record of this
version naming an unknown mode or dtype, or a file of any other shape, is moved
aside to ``cpu_mode.json.bad`` with one warning and the mode is measured again. The record
(``ModelInfo.mode_probe``) holds the figures per mode (agreement overall and
per path), the ``reason`` in words and whether it was ``saved``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.api import QUANT_MODES
from engine.datafiles import StateError, load_state, string_map
from engine.model.kv import KVState, forward
from engine.paths import atomic_write, cache_dir
from engine.quant.kernels import GEMV_ROWS

PROBE_VERSION = 6  # 1: one 320-token prefill, timings apart; 2: before q8-cpu; 3: q8-cpu all in 8 bits; 4: measured
# again; 5: ranked by a turn (prefill and steps), the prefill limit 2x; 6: q8-cpu's step prefetches, float16 steps
MIN_AGREEMENT = 0.99
MARGIN = 0.9  # a mode's decode step must take at most this fraction of float32's
PREFILL_LIMIT = 2.0  # ... and its CHUNK-token prefill at most this multiple of float32's
TURN_STEPS = 64  # the candidates left are ranked by their CHUNK-token prefill plus this many decode steps
MAX_SPREAD = 1.3
AGREE_TOKENS = 320  # teacher-forced positions of TEXT
PROMPT_TOKENS = 128  # the first of them in one forward: the kernels of a prompt's prefill
CHUNK = GEMV_ROWS  # the rest in chunks of this many rows: int8-cpu's GEMV kernel; also the timed prefill
WARM_STEPS = 2  # untimed one-token steps first (first calls pack, compile, profile); they count for agreement
ROUNDS = 3
STEPS = 4  # one-token steps per candidate in a round
BUDGET_S = 30.0  # timing rounds stop here: the CPU is too busy to measure, nothing is saved
THREADS = 1  # timed on one thread: a busy sibling core cannot stall it at every op barrier
PATHS = ("prompt", "chunks", "steps")
REFERENCE = ("none", "float32")
RECORDS = "cpu_mode.json"
DTYPE_NAMES = ("float32", "bfloat16", "float16")

Candidate = tuple[str, str]  # (quant mode, dtype name)
Build = Callable[[str, str], tuple[Any, dict[str, Any]]]

TEXT = (
    "The library opens at nine in the morning and closes at six in the evening. Visitors can borrow up to "
    "five books at a time, and each loan lasts three weeks. Children under twelve need a parent to sign up. "
    "On the first floor there is a reading room with large tables, a quiet corner for study and a row of "
    "computers that anyone may use for an hour a day. The second floor holds the collection of maps, old "
    "newspapers and letters from the town's first families, which can be read only in the room itself.\n\n"
    "Question: How would you explain to a friend why the sky looks blue during the day but red at sunset?\n"
    "Answer: Sunlight is made of many colours. When it passes through the air, the short blue waves are "
    "scattered in every direction by the tiny molecules of gas, so blue light reaches our eyes from the whole "
    "sky. At sunset the light travels through much more air before it reaches us, so most of the blue has "
    "been scattered away and the long red and orange waves are what is left.\n\n"
    "def average(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values) if values else 0.0\n\n"
    "Write a short story about a fox who finds a lost key. Once upon a time, in a forest at the edge of a "
    "small village, a young fox was digging for beetles under an oak tree when her paw struck something cold "
    "and hard. It was a small brass key, green with age, tied to a faded red ribbon. She carried it home in "
    "her mouth and wondered all night which door in the whole wide world it might open."
)


def machine() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one) and the torch version."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}|torch {torch.__version__}"


def label(candidate: Candidate) -> str:
    mode, dtype = candidate
    return dtype if mode == "none" else mode


@dataclass
class Trace:
    """One candidate's measurement: its KV cache, matches per kernel path, prefill and step times."""

    model: Any
    state: KVState = field(default_factory=KVState)
    matches: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    positions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    prefill_ms: list[float] = field(default_factory=list)  # one per chunk after the first
    rounds_ms: list[float] = field(default_factory=list)  # one per timing round: its median step
    dropped: bool = False  # missed more than the floor allows: no more measuring

    def tally(self, path: str, argmax: torch.Tensor, reference: torch.Tensor) -> None:
        self.matches[path] += int((argmax == reference).sum())
        self.positions[path] += int(reference.numel())

    def misses(self) -> int:
        return sum(self.positions.values()) - sum(self.matches.values())

    def agreement(self) -> float:
        total = sum(self.positions.values())
        return sum(self.matches.values()) / total if total else 0.0


def _forward(model: Any, state: KVState, ids: list[int]) -> tuple[torch.Tensor, float]:
    """The argmax after each of ``ids`` fed on top of ``state`` (as the app feeds them), and the ms it took."""
    t = time.perf_counter()
    logits = forward(model, state, ids, all_logits=len(ids) > 1, decode=len(ids) == 1)
    return logits.argmax(-1), 1000 * (time.perf_counter() - t)


def _text_pass(traces: dict[Candidate, Trace], ids: list[int], allowed: int) -> Generator[str, None, int]:
    """Teacher-force ``ids`` through every candidate, piece by piece (yielding after each); returns float32's next
    token after them."""
    assert next(iter(traces)) == REFERENCE, "float32 goes first: it sets what the others must match"
    split = min(PROMPT_TOKENS, len(ids) // 2)
    pieces = [("prompt", ids[:split])] + [("chunks", ids[i : i + CHUNK]) for i in range(split, len(ids), CHUNK)]
    reference = torch.empty(0)
    for n, (path, piece) in enumerate(pieces):
        for candidate, trace in traces.items():
            if trace.dropped:
                continue
            argmax, ms = _forward(trace.model, trace.state, piece)
            if candidate == REFERENCE:
                reference = argmax
            trace.tally(path, argmax, reference)
            if path == "chunks" and n > 1:  # the first chunk warms the small-batch kernels up
                trace.prefill_ms.append(ms)
            if trace.misses() > allowed:
                trace.dropped, trace.state = True, KVState()
        yield f"comparing answers ({n + 1} of {len(pieces)})"
    return int(reference[-1])


def _step_round(traces: dict[Candidate, Trace], token: int, times: dict[Candidate, list[float]] | None) -> int:
    """One one-token step of every live candidate on float32's ``token``; returns float32's next token."""
    reference = torch.empty(0)
    for candidate, trace in traces.items():
        if trace.dropped:
            continue
        argmax, ms = _forward(trace.model, trace.state, [token])
        if candidate == REFERENCE:
            reference = argmax
        trace.tally("steps", argmax, reference)
        if times is not None:
            times[candidate].append(ms)
    return int(reference[-1])


def _rounds(
    traces: dict[Candidate, Trace], token: int, clock: Clock, until: float, warm: int = 0
) -> Generator[str, None, int]:
    """``warm`` untimed steps, then ``ROUNDS`` timed rounds of ``STEPS`` (fewer once ``clock`` passed ``until``
    seconds), yielding after each round."""
    for _ in range(warm):
        token = _step_round(traces, token, None)
    for trace in traces.values():
        trace.rounds_ms = []
    for n in range(ROUNDS):
        if clock.spent() > until:
            break
        yield f"timing decode steps (round {n + 1} of {ROUNDS})"
        times: dict[Candidate, list[float]] = {c: [] for c, t in traces.items() if not t.dropped}
        for _ in range(STEPS):
            token = _step_round(traces, token, times)
        for candidate, series in times.items():
            traces[candidate].rounds_ms.append(statistics.median(series))
    return token


def spread(rounds: dict[Candidate, list[float]]) -> float:
    """Largest max/min, over candidates, of its step time relative to float32's in the same round."""
    ref = rounds[REFERENCE]
    if len(ref) < ROUNDS:
        return float("inf")  # cut short by the time budget
    worst = 1.0
    for candidate, series in rounds.items():
        if candidate == REFERENCE:
            continue
        ratios = [s / r for s, r in zip(series, ref, strict=True) if r > 0]
        if ratios and min(ratios) > 0:
            worst = max(worst, max(ratios) / min(ratios))
    if len(rounds) == 1:  # only float32: its own steadiness
        worst = max(ref) / min(ref) if min(ref) > 0 else float("inf")
    return worst


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _slower_prefill(mode_ms: float | None, float32_ms: float | None) -> bool:
    """Whether a mode's prompt processing is too slow to choose it (unknown, as on a very short model: no)."""
    return mode_ms is not None and float32_ms is not None and mode_ms > PREFILL_LIMIT * float32_ms


def _turn(fig: dict[str, Any]) -> float:
    """A short reply's time in a mode: its ``CHUNK``-token prefill (none where it was not timed) and ``TURN_STEPS``
    decode steps."""
    return float(fig["prefill_ms"] or 0.0) + TURN_STEPS * float(fig["step_ms"])


def decide(figures: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The label chosen (``float32`` unless another mode clearly wins) and why, from per-mode figures: of the
    modes that keep the answers, decode clearly faster and prefill at most ``PREFILL_LIMIT`` times as long as
    float32, the one with the shortest turn (:func:`_turn`).

    ``figures`` maps a label to ``step_ms``, ``prefill_ms`` and ``agreement``; ``float32`` must be there.
    """
    ref = figures["float32"]
    notes = []
    turns: dict[str, float] = {}  # the modes that qualify: a short reply's time in each
    for name, fig in figures.items():
        if name == "float32":
            continue
        if fig["agreement"] < MIN_AGREEMENT or fig["step_ms"] is None or ref["step_ms"] is None:
            why = f"changes too many answers (needs {MIN_AGREEMENT:.0%})"
            notes.append(f"{name} agreement {fig['agreement']:.1%}: {why}")
            continue
        said = f"{name} {fig['step_ms']:.1f} ms a step, agreement {fig['agreement']:.1%}"
        if fig["prefill_ms"] is not None:
            said += f", prefill {fig['prefill_ms']:.0f} ms"
        if fig["step_ms"] > MARGIN * ref["step_ms"]:
            notes.append(f"{said}: not clearly faster (needs {round(100 * (1 - MARGIN))} % faster)")
        elif _slower_prefill(fig["prefill_ms"], ref["prefill_ms"]):
            notes.append(f"{said}: over {PREFILL_LIMIT:g}x float32's ({ref['prefill_ms']:.0f} ms)")
        else:
            notes.append(said)
            turns[name] = _turn(fig)
    head = "float32" if ref["step_ms"] is None else f"float32 {ref['step_ms']:.1f} ms a step"
    detail = "; ".join([head, *notes])
    if not turns:
        return "float32", f"no mode is clearly faster and keeps {MIN_AGREEMENT:.0%} agreement ({detail})"
    best = min(turns, key=turns.__getitem__)  # the first of equals, in the figures' order
    speedup = ref["step_ms"] / figures[best]["step_ms"]
    said = f"{best} decodes {speedup:.2f}x as fast as float32 and keeps the answers"
    if len(turns) > 1:  # why this one of several
        ranked = ", ".join(f"{name} {ms:,.0f} ms" for name, ms in sorted(turns.items(), key=lambda item: item[1]))
        said += f"; a {CHUNK}-token prompt and {TURN_STEPS} tokens: {ranked}"
    return best, f"{said} ({detail})"


def check_records(value: Any) -> dict[str, Any]:
    """Validator of ``cpu_mode.json``: an object of records; this version's name a known mode and dtype.

    Records of other versions are kept as they are (measured again, never read).
    """
    records = string_map(value, lambda _key, record: isinstance(record, dict))
    for key, record in records.items():
        if record.get("probe") != PROBE_VERSION:
            continue
        where = f"record {key[:60]!r}"
        if record.get("mode") not in QUANT_MODES:
            raise StateError(f"{where}: unknown mode {str(record.get('mode'))[:40]!r}")
        if record.get("dtype") not in DTYPE_NAMES:
            raise StateError(f"{where}: unknown dtype {str(record.get('dtype'))[:40]!r}")
        if not all(isinstance(record.get(k), str) for k in ("chosen", "reason", "machine")):
            raise StateError(f"{where}: chosen, reason and machine must be text")
    return records


def _read() -> dict[str, Any]:
    return load_state(cache_dir() / RECORDS, check_records) or {}


def recorded(key: str) -> dict[str, Any] | None:
    record = _read().get(key)
    return record if isinstance(record, dict) and record.get("probe") == PROBE_VERSION else None


def all_records() -> dict[str, Any]:
    """Every saved choice on this machine (for ``brisk doctor``)."""
    return {k: v for k, v in _read().items() if v.get("probe") == PROBE_VERSION}


def _save(key: str, record: dict[str, Any]) -> bool:
    try:
        records = _read()
        records[key] = {**record, "saved": True}
        atomic_write(cache_dir() / RECORDS, json.dumps(records, indent=2))
    except OSError as exc:
        record["not_saved_because"] = f"{exc}; the choice is used for this run and measured again on the next start"
        return False
    return True


class Clock:
    """Seconds the measurement itself ran: the driver counts each step it runs, not the time between steps
    (in the background the engine serves replies between them)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def spent(self) -> float:
        return self.seconds

    def run(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` on ``THREADS`` torch thread(s), counting its time; the thread count is put back after."""
        threads = torch.get_num_threads()
        torch.set_num_threads(min(THREADS, threads))
        began = time.perf_counter()
        try:
            return step()
        finally:
            self.seconds += time.perf_counter() - began
            torch.set_num_threads(threads)


Result = tuple[str, str, dict[str, Any], tuple[Any, dict[str, Any]] | None]


def choose_mode(key: str, candidates: list[Candidate], build: Build, tokenizer: Any) -> Result:
    """(mode, dtype name, record, the chosen model as ``build`` returned it or None when taken from the record)."""
    earlier = usable_record(key, candidates)
    if earlier is not None:
        return earlier["mode"], earlier["dtype"], earlier, None
    clock = Clock()
    steps = measure(key, candidates, build, tokenizer, clock)
    while True:
        try:
            clock.run(lambda: next(steps))
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]


def usable_record(key: str, candidates: list[Candidate]) -> dict[str, Any] | None:
    """The saved choice for ``key`` if one of ``candidates`` (else it cannot run here and is measured again)."""
    earlier = recorded(key)
    return earlier if earlier is not None and (earlier["mode"], earlier["dtype"]) in candidates else None


def measure(
    key: str, candidates: list[Candidate], build: Build, tokenizer: Any, clock: Clock | None = None
) -> Generator[str, None, Result]:
    """The measurement, one step per ``next()`` (each says what it did), returning what :func:`choose_mode` returns.

    Drive it with a :class:`Clock` (``clock.run(lambda: next(steps))``) and pass the same clock here: the time
    budget counts the steps only.  A step is one candidate's build, one piece of the text through every
    candidate, or one timing round; between steps the caller may do anything (the engine serves replies).
    """
    assert candidates and candidates[0] == REFERENCE, "float32 is the reference"
    clock = clock or Clock()
    threads = torch.get_num_threads()
    built: dict[Candidate, tuple[Any, dict[str, Any]]] = {}
    for n, candidate in enumerate(candidates):
        built[candidate] = build(*candidate)
        yield f"{label(candidate)} loaded ({n + 1} of {len(candidates)} modes)"
    start_s = clock.spent()
    traces = {c: Trace(b[0]) for c, b in built.items()}
    steps = WARM_STEPS + 2 * ROUNDS * STEPS  # the most one-token steps, with the second series
    config = getattr(traces[REFERENCE].model, "config", None)
    context = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
    ids = tokenizer(TEXT)["input_ids"][: max(2, min(AGREE_TOKENS, context - steps - 1))]
    build_s = start_s
    planned = len(ids) + WARM_STEPS + ROUNDS * STEPS
    allowed = int((1 - MIN_AGREEMENT) * planned + 1e-9)  # misses a candidate may have and still be chosen
    token = yield from _text_pass(traces, ids, allowed)
    agree_s = clock.spent() - build_s
    # only modes that can still keep the answers are stepped and timed (none but float32: nothing to time)
    timed = {c: t for c, t in traces.items() if not t.dropped}
    rounds: dict[Candidate, list[float]] = {}
    until = clock.spent() + BUDGET_S  # the timing rounds' budget, in the measurement's own seconds
    if len(timed) > 1:
        token = yield from _rounds(timed, token, clock, until, warm=WARM_STEPS)
        rounds = {c: t.rounds_ms for c, t in timed.items()}
    noisy = bool(rounds) and spread(rounds) > MAX_SPREAD
    if noisy and clock.spent() < until:
        yield from _rounds(timed, token, clock, until)  # once more: the other program may have finished
        rounds = {c: t.rounds_ms for c, t in timed.items()}
        noisy = spread(rounds) > MAX_SPREAD
    figures = {
        label(c): {
            "mode": c[0],
            "dtype": c[1],
            "step_ms": _median(rounds.get(c, [])),
            "prefill_ms": _median(t.prefill_ms) if c in rounds else None,
            "agreement": round(t.agreement(), 4),
            "paths": {p: round(t.matches[p] / t.positions[p], 4) for p in PATHS if t.positions[p]},
            "positions": sum(t.positions.values()),
            "rounds_ms": [round(v, 2) for v in rounds.get(c, [])],
        }
        for c, t in traces.items()
    }
    if noisy:
        choice = "float32"
        why = (
            f"the timings varied by up to {spread(rounds):.1f}x between rounds"
            if len(rounds[REFERENCE]) == ROUNDS
            else f"measuring took over {BUDGET_S:.0f} s"
        )
        reason = (
            f"{why} (another program was using the CPU), so float32 is used and the measurement is repeated "
            "on the next start"
        )
    else:
        choice, reason = decide(figures)
    chosen = next(c for c in candidates if label(c) == choice)
    record: dict[str, Any] = {
        "mode": chosen[0],
        "dtype": chosen[1],
        "chosen": choice,
        "reason": reason,
        "modes": figures,
        "spread": round(min(spread(rounds), 99.0), 3) if rounds else None,
        "threads": min(THREADS, threads),
        "tokens": len(ids),
        "decode_steps": traces[REFERENCE].positions["steps"],
        "probe_s": round(clock.spent(), 2),
        "load_s": round(build_s, 2),
        "agreement_s": round(agree_s, 2),
        "machine": machine(),
        "probe": PROBE_VERSION,
        "saved": False,
    }
    if not noisy:
        record["saved"] = _save(key, record)
    keep = built.pop(chosen)
    built.clear()
    traces.clear()
    return chosen[0], chosen[1], record, keep
