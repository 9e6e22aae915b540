"""A model that cannot load is refused from its headers, before anything is read, converted or half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import headers
from engine.model.source import ModelLoadError, resolve
from engine.paths import cache_dir
from tests.support.model_library import link_or_copy, write_gguf


def no_progress(_share: float, _text: str) -> None:
    return None


def test_an_unreadable_gguf_architecture_is_refused_before_converting(brisk_data_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "rwkv-6-world.gguf", "rwkv6")
    with pytest.raises(ModelLoadError, match="rwkv6.*cannot read from GGUF"):
        resolve(str(path), no_progress)
    assert not (cache_dir() / "models").exists() or not any((cache_dir() / "models").iterdir())


def test_a_truncated_gguf_says_so(brisk_data_dir: Path, tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:300])
    with pytest.raises(ModelLoadError, match="truncated|damaged"):
        resolve(str(cut), no_progress)


def test_a_folder_without_a_tokenizer_is_refused(brisk_data_dir: Path, tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    for name in ("config.json", "model.safetensors"):
        link_or_copy(tiny_dir / name, folder / name)
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        resolve(str(folder), no_progress)


def test_a_model_bigger_than_memory_is_refused_before_loading(
    brisk_data_dir: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(headers, "available_memory", lambda: 1 << 20)
    with pytest.raises(ModelLoadError, match=r"needs about .* GB of memory .* 0\.0 GB free"):
        resolve(str(tiny_dir), no_progress)
    monkeypatch.setattr(headers, "available_memory", lambda: 64 << 30)
    assert resolve(str(tiny_dir), no_progress) == (str(tiny_dir), tiny_dir.name)


def test_the_loaded_model_says_which_path_runs_it(tiny_engine) -> None:  # noqa: ANN001
    assert tiny_engine.load_event.info.fast_path == "lean forward and native decode step"


def test_an_ollama_blob_is_named_as_ollama_names_it(tmp_path: Path) -> None:
    from engine.model.source import ollama_name
    from tests.support.model_library import ollama_add

    blob_source = write_gguf(tmp_path / "m.gguf", "llama")
    ollama_add(tmp_path / "ollama", "smollm2", "135m", blob_source)
    blob = next((tmp_path / "ollama" / "blobs").iterdir())
    assert ollama_name(blob) == "smollm2:135m"
    assert ollama_name(blob_source) == ""
