"""Automatic CPU dtype: float32 unless bfloat16 is clearly faster and keeps quality, never from noisy timings."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine import paths
from engine.api import ModelSpec
from engine.model import dtype_probe
from engine.model.loader import load_model


@pytest.fixture()
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def fake_timings(
    monkeypatch: pytest.MonkeyPatch,
    fp32_step: float | list[float] = 2.0,
    bf16_step: float | list[float] = 2.0,
    fp32_prefill: float = 2.0,
    bf16_prefill: float = 2.0,
) -> list[torch.dtype]:
    """Replace the timers: constants, or a list of step timings used in turn (one per round).

    Returns the dtypes the step timer was called with, to count measurements.
    """

    def series(value: float | list[float]) -> Iterator[float]:
        while True:
            yield from value if isinstance(value, list) else [value]

    steps = {torch.float32: series(fp32_step), torch.bfloat16: series(bf16_step)}
    calls: list[torch.dtype] = []

    def step(model: torch.nn.Module, steps_: int = 12) -> float:
        dtype = next(model.parameters()).dtype
        calls.append(dtype)
        return next(steps[dtype])

    def prefill(model: torch.nn.Module, tokens: int = 32) -> float:
        return bf16_prefill if next(model.parameters()).dtype == torch.bfloat16 else fp32_prefill

    monkeypatch.setattr(dtype_probe, "_step_ms", step)
    monkeypatch.setattr(dtype_probe, "_prefill_ms", prefill)
    return calls


def probe_of(tiny_dir: Path) -> tuple[torch.dtype, dict]:
    loaded = load_model(ModelSpec(source=str(tiny_dir)))
    return loaded.dtype, loaded.info["dtype_probe"]


def test_auto_dtype_is_measured_once_and_recorded(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake_timings(monkeypatch)
    dtype, probe = probe_of(tiny_dir)
    assert {"float32_step_ms", "bfloat16_step_ms", "bfloat16_agreement", "reason", "rounds_ms"} <= set(probe)
    assert dtype == torch.float32 and probe["dtype"] == "float32" and probe["saved"] is True
    assert calls.count(torch.float32) == calls.count(torch.bfloat16) == dtype_probe.ROUNDS
    calls.clear()
    again, _ = probe_of(tiny_dir)
    assert calls == [], "the measurement is reused on later starts"
    assert again == dtype
    assert (fresh_data / "cache" / "cpu_dtype.json").is_file()


def test_the_real_timers_measure_the_tiny_model(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    assert dtype_probe._step_ms(model, 3) > 0 and dtype_probe._prefill_ms(model, 8) > 0


def test_faster_but_worse_dtype_is_not_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake_timings(monkeypatch, bf16_step=1.0, bf16_prefill=1.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 1.01)  # nothing can reach it
    dtype, probe = probe_of(tiny_dir)
    assert dtype == torch.float32 and "changes too many answers" in probe["reason"]


def test_clearly_faster_dtype_that_keeps_quality_is_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake_timings(monkeypatch, bf16_step=1.0, bf16_prefill=1.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    loaded = load_model(ModelSpec(source=str(tiny_dir)))
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.info["packed_linears"] == 0
    assert "clearly faster" in loaded.info["dtype_probe"]["reason"]


@pytest.mark.parametrize("bf16_step", [1.95, 1.8, 1.71])  # 2.5 %, 10 % and 14.5 % faster than float32's 2.0
def test_a_small_decode_win_keeps_the_default(tiny_dir: Path, fresh_data: Path, monkeypatch, bf16_step) -> None:  # noqa: ANN001
    fake_timings(monkeypatch, bf16_step=bf16_step, bf16_prefill=1.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    dtype, probe = probe_of(tiny_dir)
    assert dtype == torch.float32
    assert "not clearly faster" in probe["reason"] and "15 %" in probe["reason"]
    assert probe["saved"] is True, "a clear, steady measurement is kept"


def test_bf16_with_slow_prefill_is_not_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake_timings(monkeypatch, bf16_step=1.0, bf16_prefill=9.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    loaded = load_model(ModelSpec(source=str(tiny_dir)))
    assert loaded.dtype == torch.float32
    assert loaded.info["dtype_probe"]["bfloat16_prefill32_ms"] == 9.0
    assert "slower at prefill" in loaded.info["dtype_probe"]["reason"]
    assert loaded.info["packed_linears"] > 0  # float32 runs on packed matmuls


def test_noisy_timings_keep_float32_and_are_not_saved(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    # bfloat16 looks twice as fast on average, but float32's rounds jump (another program on the CPU)
    calls = fake_timings(monkeypatch, fp32_step=[2.0, 6.0, 2.0], bf16_step=1.0, bf16_prefill=1.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    dtype, probe = probe_of(tiny_dir)
    assert dtype == torch.float32 and probe["saved"] is False
    assert "another program" in probe["reason"] and probe["spread"] > dtype_probe.MAX_SPREAD
    assert calls.count(torch.float32) == 2 * dtype_probe.ROUNDS, "measured once more before giving up"
    assert not (fresh_data / "cache" / "cpu_dtype.json").exists()
    calls.clear()
    probe_of(tiny_dir)
    assert calls, "the next start measures again"


def test_noise_that_passes_is_measured_again_and_kept(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake_timings(monkeypatch, fp32_step=[2.0, 6.0, 2.0, 2.0, 2.0, 2.0])
    dtype, probe = probe_of(tiny_dir)
    assert len(calls) == 4 * dtype_probe.ROUNDS
    assert dtype == torch.float32 and probe["saved"] is True and probe["spread"] == 1.0


def test_full_disk_does_not_fail_the_load(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake_timings(monkeypatch, bf16_step=1.0, bf16_prefill=1.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)

    def full(path: Path, data: object, encoding: str = "utf-8") -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(dtype_probe, "atomic_write", full)
    dtype, probe = probe_of(tiny_dir)
    assert dtype == torch.bfloat16, "the choice is used for this run"
    assert probe["saved"] is False and "No space left" in probe["not_saved_because"]
    assert not (fresh_data / "cache" / "cpu_dtype.json").exists()


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="root is not stopped by chmod (see the ENOSPC test)"
)
def test_read_only_data_folder_does_not_fail_the_load(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake_timings(monkeypatch)
    fresh_data.chmod(0o555)
    try:
        dtype, probe = probe_of(tiny_dir)
    finally:
        fresh_data.chmod(0o755)
    assert dtype == torch.float32 and probe["saved"] is False and probe["not_saved_because"]


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        "{not json",
        None,  # a record of the old probe (no margin, no noise check): measured again
        {"dtype": "float64", "probe": dtype_probe.PROBE_VERSION},
        "garbage-record",
    ],
)
def test_old_or_damaged_records_are_measured_again(tiny_dir: Path, fresh_data: Path, monkeypatch, content) -> None:  # noqa: ANN001
    calls = fake_timings(monkeypatch)
    dtype, _ = probe_of(tiny_dir)
    records = json.loads((paths.cache_dir() / "cpu_dtype.json").read_text())
    (key,) = records
    if content is None:
        records[key] = {"dtype": "bfloat16", "float32_step_ms": 2.0, "bfloat16_step_ms": 1.9}
        text = json.dumps(records)
    elif isinstance(content, dict):
        text = json.dumps({key: content})
    elif content == "garbage-record":
        text = json.dumps({key: "bfloat16"})
    else:
        text = content
    (paths.cache_dir() / "cpu_dtype.json").write_text(text)
    calls.clear()
    again, probe = probe_of(tiny_dir)
    assert calls and again == torch.float32 and probe["probe"] == dtype_probe.PROBE_VERSION


def test_explicit_dtype_skips_the_probe(tiny_dir: Path, fresh_data: Path) -> None:
    loaded = load_model(ModelSpec(source=str(tiny_dir), dtype="float32"))
    assert loaded.info["dtype_probe"] == {}
