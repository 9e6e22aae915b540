"""Choose the CPU dtype by measuring: float32 (the default) against bfloat16, on this machine and model.

``choose_cpu_dtype(model, tokenizer, key)`` returns ``(dtype, record, model
in that dtype)``.  It times single-token decode steps and a 32-token prefill
of the loaded float32 model (with its linears packed, as it will run:
``engine.model.packed``) and of a bfloat16 copy, in ``ROUNDS`` interleaved
rounds, and checks that bfloat16 keeps quality (teacher-forced next-token
agreement with float32 of at least ``MIN_AGREEMENT`` on a fixed text).

The choice must be the same on every first start, so the default float32 is
left only for a clear win: bfloat16's decode step must take at most
``DECODE_MARGIN`` of float32's (15 % faster) and its prefill must be no slower
(on CPUs without native bfloat16 matmuls its prefill is several times slower,
which would make every first token late).  A measurement taken while another
program shares the CPU is not trusted: when, for either dtype, the slowest
round is more than ``MAX_SPREAD`` times the fastest, the rounds are measured
once more, and if they are still that noisy float32 is used for this run and
nothing is saved, so the next start measures again.

A trusted result is recorded in ``cache/cpu_dtype.json`` under ``key`` (the
model's fingerprint plus torch version), so the probe runs once per model.
The file is read through ``engine.datafiles.load_state`` (:func:`check_records`):
a record of this version naming another dtype, or a file of any other shape, is
moved aside to ``cpu_dtype.json.bad`` with one warning and measured again.  If
that file cannot be written (a read-only or full data folder) the choice is
used for this run only.  The record (``ModelInfo.dtype_probe``) holds the
figures, the ``reason`` for the choice in words, and whether it was ``saved``.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from typing import Any

import torch

from engine.datafiles import StateError, load_state, string_map
from engine.paths import atomic_write, cache_dir

PROBE_VERSION = 2  # records of older probes (no margin, no noise check) are measured again
MIN_AGREEMENT = 0.97
DECODE_MARGIN = 0.85  # bfloat16's decode step must take at most this fraction of float32's
MAX_SPREAD = 1.3  # slowest round / fastest round above this: the CPU was shared, do not trust it
ROUNDS = 3
RECORDS = "cpu_dtype.json"
CHOICES = ("float32", "bfloat16")
TEXT = (
    "The library opens at nine in the morning and closes at six in the evening. Visitors can borrow up to "
    "five books at a time, and each loan lasts three weeks. Children under twelve need a parent to sign up."
)


def _step_ms(model: Any, steps: int = 12) -> float:
    from engine.model.kv import KVState, forward

    state = KVState()
    forward(model, state, list(range(10, 74)))
    times = []
    for i in range(steps):
        t = time.perf_counter()
        forward(model, state, [100 + i], decode=True)
        times.append(time.perf_counter() - t)
    times.sort()
    return 1000 * times[len(times) // 2]


def _prefill_ms(model: Any, tokens: int = 32) -> float:
    from engine.model.kv import KVState, forward

    t = time.perf_counter()
    forward(model, KVState(), list(range(10, 10 + tokens)))
    return 1000 * (time.perf_counter() - t)


@torch.inference_mode()
def _argmax(model: Any, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits[0].argmax(-1)


def _rounds(fp32: Any, bf16: Any) -> dict[str, list[float]]:
    """``ROUNDS`` interleaved timings of each dtype, so a passing load hits both alike."""
    out: dict[str, list[float]] = {
        "float32_step": [],
        "bfloat16_step": [],
        "float32_prefill": [],
        "bfloat16_prefill": [],
    }
    for _ in range(ROUNDS):
        out["float32_step"].append(_step_ms(fp32))
        out["bfloat16_step"].append(_step_ms(bf16))
        out["float32_prefill"].append(_prefill_ms(fp32))
        out["bfloat16_prefill"].append(_prefill_ms(bf16))
    return out


def _spread(rounds: dict[str, list[float]]) -> float:
    """The largest slowest/fastest ratio over the four series (1.0: perfectly steady)."""
    return max(max(v) / min(v) if min(v) > 0 else float("inf") for v in rounds.values())


def check_records(value: Any) -> dict[str, Any]:
    """Validator of ``cpu_dtype.json``: an object of records; this version's must name float32 or bfloat16.

    Records of other versions are kept as they are (measured again, never read).
    """
    records = string_map(value, lambda _key, record: isinstance(record, dict))
    for key, record in records.items():
        if record.get("probe") == PROBE_VERSION and record.get("dtype") not in CHOICES:
            raise StateError(f"record {key[:60]!r}: unknown dtype {str(record.get('dtype'))[:40]!r}")
    return records


def _read_records() -> dict[str, Any]:
    return load_state(cache_dir() / RECORDS, check_records) or {}


def _reusable(record: object) -> bool:
    return isinstance(record, dict) and record.get("probe") == PROBE_VERSION and record.get("dtype") in CHOICES


def _decide(rounds: dict[str, list[float]], agreement: float) -> tuple[str, str]:
    fp32_step, bf16_step = (statistics.median(rounds[f"{d}_step"]) for d in ("float32", "bfloat16"))
    fp32_pre, bf16_pre = (statistics.median(rounds[f"{d}_prefill"]) for d in ("float32", "bfloat16"))
    figures = (
        f"decode {bf16_step:.2f} ms against float32's {fp32_step:.2f} ms, "
        f"prefill {bf16_pre:.2f} ms against {fp32_pre:.2f} ms, agreement {agreement:.1%}"
    )
    if agreement < MIN_AGREEMENT:
        return "float32", f"bfloat16 changes too many answers ({figures}; needs {MIN_AGREEMENT:.0%})"
    if bf16_step > DECODE_MARGIN * fp32_step:
        need = round(100 * (1 - DECODE_MARGIN))
        return "float32", f"bfloat16 is not clearly faster at decode ({figures}; needs {need} % faster)"
    if bf16_pre > fp32_pre:
        return "float32", f"bfloat16 is slower at prefill ({figures})"
    return "bfloat16", f"bfloat16 is clearly faster and keeps quality ({figures})"


def choose_cpu_dtype(model: Any, tokenizer: Any, key: str) -> tuple[torch.dtype, dict[str, Any], Any]:
    """(dtype, the record of the measurement, the model in that dtype): measured once per ``key``."""
    from engine.model.packed import pack_linears

    records = _read_records()
    if _reusable(records.get(key)):
        earlier: dict[str, Any] = records[key]
        dtype = getattr(torch, earlier["dtype"])
        return dtype, earlier, model if dtype == torch.float32 else model.to(dtype)
    half = copy.deepcopy(model).to(torch.bfloat16)
    pack_linears(model)  # float32 as it will run
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    agreement = float((_argmax(model, ids) == _argmax(half, ids)).float().mean())
    rounds = _rounds(model, half)
    noisy = _spread(rounds) > MAX_SPREAD
    if noisy:
        rounds = _rounds(model, half)  # once more: the other program may have finished
        noisy = _spread(rounds) > MAX_SPREAD
    if noisy:
        choice, reason = (
            "float32",
            (
                f"the timings varied by up to {_spread(rounds):.1f}x between rounds (another program was using "
                "the CPU), so the default float32 is used and the measurement is repeated on the next start"
            ),
        )
    else:
        choice, reason = _decide(rounds, agreement)
    record: dict[str, Any] = {
        "dtype": choice,
        "reason": reason,
        "float32_step_ms": round(statistics.median(rounds["float32_step"]), 2),
        "bfloat16_step_ms": round(statistics.median(rounds["bfloat16_step"]), 2),
        "float32_prefill32_ms": round(statistics.median(rounds["float32_prefill"]), 2),
        "bfloat16_prefill32_ms": round(statistics.median(rounds["bfloat16_prefill"]), 2),
        "bfloat16_agreement": round(agreement, 4),
        "spread": round(_spread(rounds), 3),
        "rounds_ms": {name: [round(v, 2) for v in values] for name, values in rounds.items()},
        "probe": PROBE_VERSION,
        "torch": torch.__version__,
        "saved": False,
    }
    if not noisy:
        record["saved"] = _save(key, record)
    if choice == "bfloat16":
        return torch.bfloat16, record, half
    del half
    return torch.float32, record, model


def _save(key: str, record: dict[str, Any]) -> bool:
    """Record the choice for later starts; False (and a note in ``record``) when the file cannot be written."""
    try:
        path = cache_dir() / RECORDS
        records = _read_records()
        records[key] = {**record, "saved": True}
        atomic_write(path, json.dumps(records, indent=2))
    except OSError as exc:
        record["not_saved_because"] = (
            f"{exc}; the choice is used for this run and measured again on the next start "
            "(free some space or make the data folder writable to keep it)"
        )
        return False
    return True
