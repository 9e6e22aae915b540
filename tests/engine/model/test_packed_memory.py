"""Packed float32 linears (engine.model.packed) and the malloc settings (engine.runtime.memory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from engine.api import ModelSpec
from engine.model import packed
from engine.model.kv import KVState, forward
from engine.model.loader import load_model
from engine.runtime import memory


def test_packed_linear_matches_linear_for_every_row_count() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    layer = packed.PackedLinear(linear)
    for rows in (1, 3, 16, 100):
        x = torch.randn(1, rows, 96)
        torch.testing.assert_close(layer(x), linear(x), atol=1e-5, rtol=1e-5)
    assert "PackedLinear" in repr(layer) or "in_features=96" in repr(layer)


def test_pack_linears_keeps_the_head_and_greedy_output(tiny_dir: Path) -> None:
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    fast = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    count = packed.pack_linears(fast)
    assert count == 7 * len(fast.model.layers)
    assert type(fast.lm_head) is nn.Linear  # tied to the embedding; callers read its weight
    assert packed.pack_linears(fast) == 0  # idempotent

    def greedy(model: nn.Module) -> tuple[list[int], torch.Tensor]:
        state, out = KVState(), []
        logits = forward(model, state, list(range(5, 30)))
        steps = [logits[-1]]
        for _ in range(20):
            out.append(int(logits[-1].argmax()))
            logits = forward(model, state, [out[-1]])
            steps.append(logits[-1])
        return out, torch.stack(steps)

    # Packed and BLAS kernels differ only in float32 rounding, by an amount that depends on the
    # CPU: compare the logits along one token path (the plain model's), not two free-running ones.
    tokens, expected = greedy(plain)
    state = KVState()
    got = [forward(fast, state, list(range(5, 30)))[-1]] + [forward(fast, state, [t])[-1] for t in tokens]
    torch.testing.assert_close(torch.stack(got), expected, atol=1e-3, rtol=1e-3)
    assert [int(x.argmax()) for x in got[:-1]] == tokens


def test_loader_packs_float32_cpu_models_only(tiny_dir: Path) -> None:
    fp32 = load_model(ModelSpec(source=str(tiny_dir), dtype="float32"))
    assert fp32.info["packed_linears"] > 0
    bf16 = load_model(ModelSpec(source=str(tiny_dir), dtype="bfloat16"))
    assert bf16.info["packed_linears"] == 0
    assert fp32.identity != bf16.identity


def test_malloc_tuning_and_reserve() -> None:
    assert memory.tune_malloc() is True  # glibc on Linux: the thresholds took
    assert memory.reserve(3 * memory.RESERVE_BLOCK) == 3 * memory.RESERVE_BLOCK
    assert memory.reserve(1 << 40) <= memory.TRIM_THRESHOLD  # never more than glibc would keep


def test_isolated_runs_work_on_a_thread_that_ends_and_hands_back_results_and_errors() -> None:
    import threading

    from engine.runtime.threads import isolated

    caller = threading.get_ident()
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 41 + 1

    assert isolated(work) == 42
    assert seen[0].ident != caller and not seen[0].is_alive(), "the work ran on its own thread, which has ended"

    def broken() -> None:
        raise KeyError("probe")

    with pytest.raises(KeyError, match="probe"):
        isolated(broken)


def test_device_report_runs_its_probes_off_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from engine import doctor

    threads: list[int] = []
    monkeypatch.setattr(doctor, "dtype_works", lambda name, device: threads.append(threading.get_ident()) or True)
    data = doctor.report()
    assert data["dtypes"] == "float32, bfloat16, float16"
    assert threads and threading.get_ident() not in threads
