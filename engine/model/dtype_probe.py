"""Choose the CPU dtype by measuring: float32 against bfloat16, on this machine and model.

``choose_cpu_dtype(model, tokenizer, key)`` times single-token decode steps and
a 32-token prefill of the loaded float32 model (with its linears packed, as it
will run: ``engine.model.packed``) and of a bfloat16 copy, and checks that bfloat16
keeps quality (teacher-forced next-token agreement with float32 of at least
``MIN_AGREEMENT`` on a fixed text).  bfloat16 is taken only when it keeps
quality and is faster at both: on CPUs without native bfloat16 matmuls its
decode can be a little faster while its prefill is several times slower, which
would make every first token late.  The result is recorded in
``cache/cpu_dtype.json`` under ``key`` (the model's fingerprint plus torch
version), so the probe runs once per model.  It returns the model converted to
the chosen dtype, ready to run.
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any

import torch

from engine.paths import cache_dir

MIN_AGREEMENT = 0.97
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
        forward(model, state, [100 + i])
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


def choose_cpu_dtype(model: Any, tokenizer: Any, key: str) -> tuple[torch.dtype, dict[str, Any], Any]:
    """(dtype, the record of the measurement, the model in that dtype): measured once per ``key``."""
    from engine.model.packed import pack_linears

    path = cache_dir() / "cpu_dtype.json"
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        records = {}
    if key in records:
        record = records[key]
        dtype = getattr(torch, record["dtype"])
        return dtype, record, model if dtype == torch.float32 else model.to(dtype)
    half = copy.deepcopy(model).to(torch.bfloat16)
    pack_linears(model)  # float32 as it will run
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    agreement = float((_argmax(model, ids) == _argmax(half, ids)).float().mean())
    fp32_ms, bf16_ms = _step_ms(model), _step_ms(half)
    fp32_ms = min(fp32_ms, _step_ms(model))  # interleave a second round against drift
    bf16_ms = min(bf16_ms, _step_ms(half))
    fp32_prefill = min(_prefill_ms(model), _prefill_ms(model))
    bf16_prefill = min(_prefill_ms(half), _prefill_ms(half))
    faster_ok = bf16_ms < fp32_ms and bf16_prefill < fp32_prefill and agreement >= MIN_AGREEMENT
    record = {
        "dtype": "bfloat16" if faster_ok else "float32",
        "float32_step_ms": round(fp32_ms, 2),
        "bfloat16_step_ms": round(bf16_ms, 2),
        "float32_prefill32_ms": round(fp32_prefill, 2),
        "bfloat16_prefill32_ms": round(bf16_prefill, 2),
        "bfloat16_agreement": round(agreement, 4),
        "torch": torch.__version__,
    }
    records[key] = record
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2))
    os.replace(tmp, path)
    if faster_ok:
        return torch.bfloat16, record, half
    del half
    return torch.float32, record, model
