"""Choose the CPU dtype by measuring: float32 against bfloat16, on this machine and model.

``choose_cpu_dtype(model, tokenizer, key)`` times single-token decode steps of
the loaded float32 model and of a bfloat16 copy, and checks that bfloat16
keeps quality (teacher-forced next-token agreement with float32 of at least
``MIN_AGREEMENT`` on a fixed text).  It takes the faster dtype that keeps
quality and records the result in ``cache/cpu_dtype.json`` under ``key`` (the
model's fingerprint plus torch version), so the probe runs once per model.
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
    from engine.kv import KVState, forward

    state = KVState()
    forward(model, state, list(range(10, 74)))
    times = []
    for i in range(steps):
        t = time.perf_counter()
        forward(model, state, [100 + i])
        times.append(time.perf_counter() - t)
    times.sort()
    return 1000 * times[len(times) // 2]


@torch.inference_mode()
def _argmax(model: Any, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits[0].argmax(-1)


def choose_cpu_dtype(model: Any, tokenizer: Any, key: str) -> tuple[torch.dtype, dict[str, Any]]:
    path = cache_dir() / "cpu_dtype.json"
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        records = {}
    if key in records:
        record = records[key]
        return getattr(torch, record["dtype"]), record
    half = copy.deepcopy(model).to(torch.bfloat16)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    agreement = float((_argmax(model, ids) == _argmax(half, ids)).float().mean())
    fp32_ms, bf16_ms = _step_ms(model), _step_ms(half)
    fp32_ms = min(fp32_ms, _step_ms(model))  # interleave a second round against drift
    bf16_ms = min(bf16_ms, _step_ms(half))
    del half
    faster_ok = bf16_ms < fp32_ms and agreement >= MIN_AGREEMENT
    record = {
        "dtype": "bfloat16" if faster_ok else "float32",
        "float32_step_ms": round(fp32_ms, 2),
        "bfloat16_step_ms": round(bf16_ms, 2),
        "bfloat16_agreement": round(agreement, 4),
        "torch": torch.__version__,
    }
    records[key] = record
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2))
    os.replace(tmp, path)
    return getattr(torch, record["dtype"]), record
