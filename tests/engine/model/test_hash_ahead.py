"""A first start hashes the model file ahead, on a thread of its own, and the engine reads that result."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from engine.model import source


def test_a_file_hashed_ahead_is_hashed_once(
    tmp_path: Path, brisk_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 40_000)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    reads: list[float] = []
    opened = Path.open

    def counting_open(self: Path, *args: object, **kwargs: object):  # noqa: ANN202
        if self == model:
            reads.append(time.monotonic())
            time.sleep(0.2)  # a slow disk: the engine's call arrives while the thread still hashes
        return opened(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", counting_open)
    source.hash_ahead(str(model))
    time.sleep(0.05)
    digest = source.file_sha256(model)  # waits for the thread's result instead of hashing again
    assert digest == expected
    assert len(reads) == 1
    assert digest in (brisk_data_dir / "cache" / source.HASHES).read_text()


def test_hashing_ahead_what_cannot_be_hashed_does_nothing(brisk_data_dir: Path) -> None:
    before = threading.active_count()
    source.hash_ahead(str(brisk_data_dir / "missing.gguf"))
    source.hash_ahead("HuggingFaceTB/SmolLM2-135M-Instruct")  # a hub id: nothing to hash here
    assert threading.active_count() == before
