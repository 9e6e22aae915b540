"""The quantization check's child process runs at the lowest CPU priority, so a reply decoding meanwhile keeps
the CPU (``app.quant_probe``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import quant_probe

NICE_QUANT = """
import os
MODES = ("none",)
def availability(device):
    return {"none": f"nice {os.nice(0)}"}  # the child's own priority, said as the reason
"""


def test_the_check_runs_in_a_child_at_nice_19(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nice_quant.py").write_text(NICE_QUANT, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(quant_probe, "QUANT_MODULE", "nice_quant")
    monkeypatch.setattr(quant_probe, "_cache", {})
    assert quant_probe.quant_choices("cpu") == [("none", "nice 19")]
