"""A first start's converted copy is written between requests, not beside them (issue 50: the first reply
decoded at 0.85x the later ones while the copy was written in one call beside it)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.model import source
from engine.runtime import activity, loading  # noqa: F401 - loading gives source the engine's signal


@pytest.fixture
def served() -> object:
    activity.serving(True)
    yield
    activity.serving(False)


def test_the_copy_is_safetensors_with_every_dtype_and_the_tied_head_once(tmp_path: Path) -> None:
    embed = torch.randn(300_000, dtype=torch.float32).reshape(1000, 300)  # over one WRITE_CHUNK
    weights = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied: the same storage
        "norm.weight": torch.randn(7, dtype=torch.bfloat16),
        "scale": torch.randn(3, 5, dtype=torch.float16),
        "ids": torch.arange(5, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
    }
    source._write_weights(weights, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as fh:
        names = fh.keys()
        assert set(names) == set(weights) - {"lm_head.weight"}
        assert fh.metadata() == {"format": "pt"}
        for name in names:
            assert torch.equal(fh.get_tensor(name), weights[name]), name


def test_the_copy_waits_while_a_request_is_served(tmp_path: Path, served: object) -> None:
    assert source._request_gate is activity.wait_idle  # set where the engine's loading is imported
    weights = {"w": torch.randn(3 * source.WRITE_CHUNK // 4)}  # three chunks of float32
    copy_ = source._Copy()
    writer = threading.Thread(target=source._write_weights, args=(weights, tmp_path, copy_.between_chunks))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive(), "the copy was written while a request was served"
    assert (tmp_path / "model.safetensors").stat().st_size < weights["w"].numel() * 4
    activity.serving(False)
    writer.join(10)
    assert not writer.is_alive()
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as fh:
        assert torch.equal(fh.get_tensor("w"), weights["w"])


def test_someone_waiting_for_the_copy_makes_it_hurry(tmp_path: Path, served: object) -> None:
    """A load that reads the copy (wait_written) may be what a waiting request needs: the copy stops yielding."""
    weights = {"w": torch.randn(3 * source.WRITE_CHUNK // 4)}
    copy_ = source._Copy()
    source._writing[str(tmp_path)] = copy_

    def write() -> None:
        source._write_weights(weights, tmp_path, copy_.between_chunks)
        copy_.written.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        waiter = threading.Thread(target=source.wait_written, args=(str(tmp_path),))
        waiter.start()
        waiter.join(10)
        assert not waiter.is_alive(), "wait_written waited for a copy that waits for the request to end"
    finally:
        source._writing.pop(str(tmp_path), None)
        activity.serving(False)
        writer.join(10)
