"""quant="auto": the fastest mode that keeps 99 % agreement, measured once per machine, never from noisy timings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine import quant
from engine.api import ModelSpec
from engine.model import mode_probe
from engine.model.loader import AUTO_CANDIDATES, load_model


@pytest.fixture()
def fresh_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path))
    return tmp_path


def kind(model: torch.nn.Module) -> str:
    """Which candidate a built model is, from the layers it holds."""
    names = {type(m).__name__ for m in model.modules()}
    if "Fp16Linear" in names or any(isinstance(m, quant.Fp16Linear) for m in model.modules()):
        return "fp16-cpu"
    if "Int8Linear" in names:
        return "int8-cpu"
    return "bfloat16" if next(model.parameters()).dtype == torch.bfloat16 else "float32"


def fake(
    monkeypatch: pytest.MonkeyPatch,
    steps: dict[str, float | list[float]],
    agreement: dict[str, float],
    prefill: dict[str, float] | None = None,
) -> list[str]:
    """Replace the timer (per kind: a constant or a series used in turn) and the agreement; returns timer calls."""

    def series(value: float | list[float]) -> Iterator[float]:
        while True:
            yield from value if isinstance(value, list) else [value]

    feeds = {name: series(value) for name, value in steps.items()}
    calls: list[str] = []

    def step(model: torch.nn.Module, n: int = mode_probe.STEPS) -> tuple[float, float]:
        name = kind(model)
        if n == 1:
            return 1.0, 1.0  # warm-up
        calls.append(name)
        return next(feeds[name]), (prefill or {}).get(name, 10.0)

    monkeypatch.setattr(mode_probe, "_step_ms", step)
    monkeypatch.setattr(mode_probe, "_agreement", lambda _ref, model, _ids: agreement[kind(model)])
    return calls


STEADY = {"float32": 10.0, "fp16-cpu": 5.0, "int8-cpu": 4.0, "bfloat16": 6.0}


def test_int4_is_never_a_candidate() -> None:
    assert all(mode not in quant.NEVER_DEFAULT for mode, _ in AUTO_CANDIDATES)
    assert AUTO_CANDIDATES[0] == mode_probe.REFERENCE


def test_picks_the_fastest_mode_above_the_floor_and_records_it(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake(monkeypatch, STEADY, {"float32": 1.0, "fp16-cpu": 0.995, "int8-cpu": 0.95, "bfloat16": 0.999})
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    record = loaded.info["mode_probe"]
    assert loaded.quant == "fp16-cpu" and record["mode"] == "fp16-cpu" and record["dtype"] == "float32"
    assert loaded.info["quant"] == "fp16-cpu"
    assert record["saved"] is True and (fresh_data / "cache" / mode_probe.RECORDS).is_file()
    assert "int8-cpu" in record["reason"] and "changes too many answers" in record["reason"]
    assert record["modes"]["fp16-cpu"]["step_ms"] == 5.0 and record["modes"]["int8-cpu"]["agreement"] == 0.95
    assert calls.count("float32") == mode_probe.ROUNDS
    calls.clear()
    again = load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    assert calls == [], "a later load reuses the record"
    assert again.quant == "fp16-cpu" and again.info["mode_probe"]["reason"] == record["reason"]


def test_falls_back_to_float32_when_no_mode_keeps_the_answers(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    fake(monkeypatch, STEADY, {"float32": 1.0, "fp16-cpu": 0.98, "int8-cpu": 0.9, "bfloat16": 0.985})
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    assert loaded.quant == "none" and loaded.dtype == torch.float32
    assert loaded.info["packed_linears"] > 0, "float32 runs on its packed linears"
    assert "no mode is clearly faster" in loaded.info["mode_probe"]["reason"]
    assert loaded.info["mode_probe"]["saved"] is True


def test_a_small_win_or_a_slow_prefill_keeps_float32(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    steps = {"float32": 10.0, "fp16-cpu": 9.5, "int8-cpu": 5.0, "bfloat16": 9.8}
    agree = dict.fromkeys(STEADY, 1.0)
    fake(monkeypatch, steps, agree, prefill={"float32": 10.0, "fp16-cpu": 10.0, "int8-cpu": 40.0, "bfloat16": 10.0})
    record = load_model(ModelSpec(source=str(tiny_dir), quant="auto")).info["mode_probe"]
    assert record["mode"] == "none" and record["dtype"] == "float32"
    assert "not clearly faster" in record["reason"] and "prefill 40 ms" in record["reason"]


def test_noisy_timings_keep_float32_and_are_not_saved(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake(monkeypatch, {**STEADY, "fp16-cpu": [5.0, 9.0, 4.0]}, dict.fromkeys(STEADY, 1.0))
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    record = loaded.info["mode_probe"]
    assert loaded.quant == "none" and record["saved"] is False and "varied" in record["reason"]
    assert calls.count("float32") == 2 * mode_probe.ROUNDS, "measured once more before giving up"
    assert not (fresh_data / "cache" / mode_probe.RECORDS).exists()
    calls.clear()
    load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    assert calls, "the next start measures again"


def test_an_explicit_mode_is_not_measured(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake(monkeypatch, STEADY, dict.fromkeys(STEADY, 1.0))
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="fp16-cpu"))
    assert loaded.quant == "fp16-cpu" and loaded.info["mode_probe"] == {} and calls == []


def test_an_explicit_float32_dtype_measures_only_float32_modes(tiny_dir: Path, fresh_data: Path, monkeypatch) -> None:  # noqa: ANN001
    calls = fake(monkeypatch, STEADY, dict.fromkeys(STEADY, 1.0))
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="auto", dtype="float32"))
    assert set(calls) <= {"float32", "fp16-cpu"} and loaded.quant == "fp16-cpu"


def test_the_real_measurement_runs_on_the_tiny_model(tiny_dir: Path, fresh_data: Path) -> None:
    loaded = load_model(ModelSpec(source=str(tiny_dir), quant="auto"))
    record = loaded.info["mode_probe"]
    assert record["modes"]["float32"]["agreement"] == 1.0
    for figures in record["modes"].values():
        assert 0.0 <= figures["agreement"] <= 1.0
        kept = figures["agreement"] >= mode_probe.MIN_AGREEMENT
        assert (figures["step_ms"] > 0) if kept else figures["step_ms"] is None, "only modes keeping answers are timed"
    chosen = record["modes"][record["chosen"]]
    assert chosen["agreement"] >= mode_probe.MIN_AGREEMENT
    assert loaded.quant == record["mode"]


def test_decide_prefers_the_fastest_qualifying_mode() -> None:
    figures = {
        "float32": {"step_ms": 10.0, "prefill_ms": 10.0, "agreement": 1.0},
        "fp16-cpu": {"step_ms": 6.0, "prefill_ms": 10.0, "agreement": 0.995},
        "bfloat16": {"step_ms": 5.0, "prefill_ms": 11.0, "agreement": 0.991},
        "int8-cpu": {"step_ms": 3.0, "prefill_ms": 10.0, "agreement": 0.989},
    }
    choice, reason = mode_probe.decide(figures)
    assert choice == "bfloat16" and "2.00x" in reason
