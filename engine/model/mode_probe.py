"""``quant="auto"``: choose the fastest weight mode that keeps the model's answers, by measuring once per machine.

``choose_mode(key, candidates, build, tokenizer)`` returns ``(mode, dtype name,
record, built)``.  ``candidates`` are ``(mode, dtype)`` pairs that can run here
(the loader filters them with ``engine.quant.require``; ``("none", "float32")``
comes first and is the reference and the safe default); ``build(mode, dtype)``
loads the model that way and returns ``(model, extra info)``.  For each
candidate the probe measures

* greedy next-token agreement with float32: teacher-forced argmax over the
  first ``AGREE_TOKENS`` tokens of a fixed text, through the forward the app
  decodes with (``engine.model.kv.forward``: fast path, packed linears, the
  fp16-cpu scripted step);
* the decode step time (median of ``STEPS`` one-token steps after a
  ``CONTEXT``-token prefill, which is timed too), in ``ROUNDS`` interleaved
  rounds so that another program slows every candidate alike, on ``THREADS``
  thread (with two, a program busy on the other core stalls every op and the
  timings say nothing; the modes' ranking is that of their bytes and kernels),
  and within ``BUDGET_S`` seconds.

Only candidates that keep the answers are timed. It picks the fastest
candidate whose agreement is at least ``MIN_AGREEMENT``, whose decode step
takes at most ``MARGIN`` of float32's (a clear win, so the choice is the same
on every first start) and whose prefill is at most ``PREFILL_LIMIT`` times
float32's (a mode that makes every first token late is not faster). Modes in
``engine.quant.NEVER_DEFAULT`` (int4-cpu) are never candidates. A measurement
is noisy when, for some candidate, its step time relative to float32's varies
between rounds by more than ``MAX_SPREAD``; it is then measured once more, and
if it stays noisy float32 is used for this run and nothing is saved. A trusted
choice is saved in ``cache/cpu_mode.json`` under ``key`` (model fingerprint,
CPU model, torch version, dtype asked for), so later loads skip the probe
(``built`` is then None and the loader loads the recorded mode). The record
(``ModelInfo.mode_probe``) holds the figures per mode, the ``reason`` in words
and whether it was ``saved``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.paths import atomic_write, cache_dir

PROBE_VERSION = 1
MIN_AGREEMENT = 0.99
MARGIN = 0.9  # a mode's decode step must take at most this fraction of float32's
PREFILL_LIMIT = 1.5  # ... and its CONTEXT-token prefill at most this multiple of float32's
MAX_SPREAD = 1.3
ROUNDS = 3
STEPS = 6
BUDGET_S = 30.0  # timing rounds stop here: the CPU is too busy to measure, nothing is saved
THREADS = 1  # timed on one thread: a busy sibling core cannot stall it at every op barrier
CONTEXT = 32
AGREE_TOKENS = 320
REFERENCE = ("none", "float32")
RECORDS = "cpu_mode.json"

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


def _step_ms(model: Any, steps: int = STEPS) -> tuple[float, float]:
    """(median one-token decode step, the ``CONTEXT``-token prefill before them), in ms."""
    from engine.model.kv import KVState, forward

    state = KVState()
    t = time.perf_counter()
    forward(model, state, list(range(10, 10 + CONTEXT)))
    prefill = time.perf_counter() - t
    times = []
    for i in range(steps):
        t = time.perf_counter()
        forward(model, state, [100 + i])
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times), 1000 * prefill


def _argmax(model: Any, ids: list[int]) -> torch.Tensor:
    from engine.model.kv import KVState, forward

    return forward(model, KVState(), ids, all_logits=True).argmax(-1)


def _agreement(reference: torch.Tensor, model: Any, ids: list[int]) -> float:
    """Share of positions where ``model``'s greedy next token equals the reference's."""
    return float((_argmax(model, ids) == reference).float().mean())


def _rounds(models: dict[Candidate, Any], deadline: float) -> dict[Candidate, dict[str, list[float]]]:
    """``ROUNDS`` interleaved timings per candidate; fewer if ``deadline`` (perf_counter) passes."""
    out: dict[Candidate, dict[str, list[float]]] = {c: {"step": [], "prefill": []} for c in models}
    for model in models.values():
        _step_ms(model, 1)  # warm-up: first calls compile or pack
    for _ in range(ROUNDS):
        if time.perf_counter() > deadline:
            break
        for candidate, model in models.items():
            step, prefill = _step_ms(model)
            out[candidate]["step"].append(step)
            out[candidate]["prefill"].append(prefill)
    return out


def spread(rounds: dict[Candidate, dict[str, list[float]]]) -> float:
    """Largest max/min, over candidates, of its step time relative to float32's in the same round."""
    ref = rounds[REFERENCE]["step"]
    if len(ref) < ROUNDS:
        return float("inf")  # cut short by the time budget
    worst = 1.0
    for candidate, series in rounds.items():
        if candidate == REFERENCE:
            continue
        ratios = [s / r for s, r in zip(series["step"], ref, strict=True) if r > 0]
        if ratios and min(ratios) > 0:
            worst = max(worst, max(ratios) / min(ratios))
    if len(rounds) == 1:  # only float32: its own steadiness
        worst = max(ref) / min(ref) if min(ref) > 0 else float("inf")
    return worst


def _median(rounds: dict[Candidate, dict[str, list[float]]], c: Candidate, what: str) -> float | None:
    values = rounds.get(c, {}).get(what)
    return round(statistics.median(values), 2) if values else None


def decide(figures: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The label chosen (``float32`` unless another mode clearly wins) and why, from per-mode figures.

    ``figures`` maps a label to ``step_ms``, ``prefill_ms`` and ``agreement``; ``float32`` must be there.
    """
    ref = figures["float32"]
    notes = []
    best, best_step = "float32", ref["step_ms"]
    for name, fig in figures.items():
        if name == "float32":
            continue
        if fig["agreement"] < MIN_AGREEMENT or fig["step_ms"] is None or best_step is None:
            why = f"changes too many answers (needs {MIN_AGREEMENT:.0%})"
            notes.append(f"{name} agreement {fig['agreement']:.1%}: {why}")
            continue
        said = f"{name} {fig['step_ms']:.1f} ms a step, agreement {fig['agreement']:.1%}"
        if fig["step_ms"] > MARGIN * ref["step_ms"]:
            notes.append(f"{said}: not clearly faster (needs {round(100 * (1 - MARGIN))} % faster)")
        elif fig["prefill_ms"] > PREFILL_LIMIT * ref["prefill_ms"]:
            notes.append(f"{said}: prefill {fig['prefill_ms']:.0f} ms against {ref['prefill_ms']:.0f} ms")
        else:
            notes.append(said)
            if fig["step_ms"] < best_step:
                best, best_step = name, fig["step_ms"]
    head = "float32" if ref["step_ms"] is None else f"float32 {ref['step_ms']:.1f} ms a step"
    detail = "; ".join([head, *notes])
    if best == "float32":
        return best, f"no mode is clearly faster and keeps {MIN_AGREEMENT:.0%} agreement ({detail})"
    assert best_step is not None and ref["step_ms"] is not None
    speedup = ref["step_ms"] / best_step
    return best, f"{best} decodes {speedup:.2f}x as fast as float32 and keeps the answers ({detail})"


def _read() -> dict[str, Any]:
    try:
        records = json.loads((cache_dir() / RECORDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def recorded(key: str) -> dict[str, Any] | None:
    record = _read().get(key)
    if isinstance(record, dict) and record.get("probe") == PROBE_VERSION and record.get("mode"):
        return record
    return None


def all_records() -> dict[str, Any]:
    """Every saved choice on this machine (for ``brisk doctor``)."""
    return {k: v for k, v in _read().items() if isinstance(v, dict) and v.get("probe") == PROBE_VERSION}


def _save(key: str, record: dict[str, Any]) -> bool:
    try:
        records = _read()
        records[key] = {**record, "saved": True}
        atomic_write(cache_dir() / RECORDS, json.dumps(records, indent=2))
    except OSError as exc:
        record["not_saved_because"] = f"{exc}; the choice is used for this run and measured again on the next start"
        return False
    return True


def choose_mode(
    key: str, candidates: list[Candidate], build: Build, tokenizer: Any
) -> tuple[str, str, dict[str, Any], tuple[Any, dict[str, Any]] | None]:
    """(mode, dtype name, record, the chosen model as ``build`` returned it or None when taken from the record)."""
    if (earlier := recorded(key)) is not None:
        return earlier["mode"], earlier["dtype"], earlier, None
    assert candidates and candidates[0] == REFERENCE, "float32 is the reference"
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(min(THREADS, threads))
    try:
        ids = tokenizer(TEXT)["input_ids"][:AGREE_TOKENS]
        built = {c: build(*c) for c in candidates}
        models = {c: b[0] for c, b in built.items()}
        build_s = time.perf_counter() - start
        reference = _argmax(models[REFERENCE], ids)
        agreement = {c: 1.0 if c == REFERENCE else _agreement(reference, m, ids) for c, m in models.items()}
        agree_s = time.perf_counter() - start - build_s
        # only modes that keep the answers can be chosen: time those (none but float32: nothing to time)
        timed = {c: m for c, m in models.items() if c == REFERENCE or agreement[c] >= MIN_AGREEMENT}
        deadline = time.perf_counter() + BUDGET_S
        rounds = _rounds(timed, deadline) if len(timed) > 1 else {}
        noisy = bool(rounds) and spread(rounds) > MAX_SPREAD
        if noisy and time.perf_counter() < deadline:
            rounds = _rounds(timed, deadline)  # once more: the other program may have finished
            noisy = spread(rounds) > MAX_SPREAD
    finally:
        torch.set_num_threads(threads)
    figures = {
        label(c): {
            "mode": c[0],
            "dtype": c[1],
            "step_ms": _median(rounds, c, "step"),
            "prefill_ms": _median(rounds, c, "prefill"),
            "agreement": round(agreement[c], 4),
            "rounds_ms": [round(v, 2) for v in rounds[c]["step"]] if c in rounds else [],
        }
        for c in candidates
    }
    if noisy:
        choice = "float32"
        why = (
            f"the timings varied by up to {spread(rounds):.1f}x between rounds"
            if len(rounds[REFERENCE]["step"]) == ROUNDS
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
        "probe_s": round(time.perf_counter() - start, 2),
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
    return chosen[0], chosen[1], record, keep
