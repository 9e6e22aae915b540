"""Automatic CPU dtype: measured once per model, faster dtype only if it keeps quality."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.api import ModelSpec
from engine.model import dtype_probe
from engine.model.loader import load_model


@pytest.fixture()
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def test_auto_dtype_is_measured_once_and_recorded(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = []
    real = dtype_probe._step_ms
    monkeypatch.setattr(dtype_probe, "_step_ms", lambda model, steps=12: calls.append(model.dtype) or real(model, 4))
    first = load_model(ModelSpec(source=str(tiny_dir)))
    probe = first.info["dtype_probe"]
    assert {"float32_step_ms", "bfloat16_step_ms", "bfloat16_agreement"} <= set(probe)
    assert str(first.dtype) == f"torch.{probe['dtype']}"
    assert calls.count(torch.float32) >= 1 and calls.count(torch.bfloat16) >= 1
    calls.clear()
    second = load_model(ModelSpec(source=str(tiny_dir)))
    assert calls == [], "the measurement is reused on later starts"
    assert second.dtype == first.dtype
    assert (fresh_data / "cache" / "cpu_dtype.json").is_file()


def test_faster_but_worse_dtype_is_not_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    faster_bf16(monkeypatch)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 1.01)  # nothing can reach it
    assert load_model(ModelSpec(source=str(tiny_dir))).dtype == torch.float32


def test_faster_dtype_that_keeps_quality_is_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    faster_bf16(monkeypatch)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    loaded = load_model(ModelSpec(source=str(tiny_dir)))
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.info["packed_linears"] == 0


def test_bf16_with_slow_prefill_is_not_taken(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    faster_bf16(monkeypatch)
    monkeypatch.setattr(dtype_probe, "_prefill_ms", lambda m, tokens=32: 9.0 if m.dtype == torch.bfloat16 else 2.0)
    monkeypatch.setattr(dtype_probe, "MIN_AGREEMENT", 0.0)
    loaded = load_model(ModelSpec(source=str(tiny_dir)))
    assert loaded.dtype == torch.float32
    assert loaded.info["dtype_probe"]["bfloat16_prefill32_ms"] == 9.0
    assert loaded.info["packed_linears"] > 0  # float32 runs on packed matmuls


def faster_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 measures faster at decode and at prefill."""
    monkeypatch.setattr(dtype_probe, "_step_ms", lambda model, steps=12: 1.0 if model.dtype == torch.bfloat16 else 2.0)
    monkeypatch.setattr(dtype_probe, "_prefill_ms", lambda m, tokens=32: 1.0 if m.dtype == torch.bfloat16 else 2.0)


def test_explicit_dtype_skips_the_probe(tiny_dir: Path, fresh_data: Path) -> None:
    loaded = load_model(ModelSpec(source=str(tiny_dir), dtype="float32"))
    assert loaded.info["dtype_probe"] == {}
