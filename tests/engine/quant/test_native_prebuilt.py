"""The bundle's prebuilt native steps (engine.quant.native): the widest variant the CPU runs is picked,
and a library is loaded only when it matches the checksum its manifest recorded at packaging time."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.quant import native

pytestmark = pytest.mark.usefixtures("native_step")  # the build, before the first test (marks them build)

AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c", "bmi2"}


def test_the_widest_variant_the_cpu_runs_is_picked() -> None:
    every = {"avx512", "avx2", "generic"}
    assert native.pick_variant(AVX512, every) == "avx512"
    assert native.pick_variant({"avx2", "fma", "f16c", "bmi2"}, every) == "avx2"
    assert native.pick_variant({"sse2", "sse4_2"}, every) == "generic"
    assert native.pick_variant(AVX512 - {"avx512_vnni"}, every) == "avx2"  # AVX-512 without VNNI: the AVX2 build
    assert native.pick_variant({"sse2"}, {"avx512", "avx2"}) is None


def prebuilt(tmp_path: Path, **changes: object) -> Path:
    """A prebuilt folder holding this machine's built step as the "generic" variant."""
    so = native.built_copy()
    assert so is not None, "the native step is built by make (make test builds it first)"
    folder = tmp_path / "brisk_native"
    folder.mkdir()
    shutil.copy2(so, folder / so.name)
    entry = {"file": so.name, "name": native.build_name(), "sha256": hashlib.sha256(so.read_bytes()).hexdigest()}
    manifest = {"torch": torch.__version__, "variants": {"generic": entry}}
    manifest.update(changes)
    (folder / native.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_prebuilt_copy_loads_when_its_checksum_matches(tmp_path: Path) -> None:
    loaded, how = native._load_prebuilt(prebuilt(tmp_path))
    assert callable(loaded.Stepper) and how == "prebuilt generic variant, verified"


def test_a_changed_copy_is_never_loaded(tmp_path: Path) -> None:
    folder = prebuilt(tmp_path)
    library = next(folder.glob("*.so"))
    data = bytearray(library.read_bytes())
    data[-1] ^= 0xFF  # one byte changed
    library.write_bytes(bytes(data))
    with pytest.raises(native.NativeError, match="does not match the checksum"):
        native._load_prebuilt(folder)


def test_another_torch_or_no_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(native.NativeError, match="built for torch 0.0"):
        native._load_prebuilt(prebuilt(tmp_path, torch="0.0"))
    with pytest.raises(native.NativeError, match="no readable"):
        native._load_prebuilt(tmp_path / "missing")


def test_the_variant_can_be_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRISK_NATIVE_VARIANT", "avx2")  # not in this folder: nothing fits
    with pytest.raises(native.NativeError, match="no prebuilt native step runs on this CPU"):
        native._load_prebuilt(prebuilt(tmp_path))
