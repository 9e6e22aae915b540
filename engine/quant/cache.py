"""The on-disk cache of quantized copies: quantize once, load the copy afterwards.

Contract:

* :func:`load_quantized_model` is the one call a loader needs: it returns a
  quantized model from the cache next to the unquantized weights
  (:func:`quant_dir`), or quantizes and saves it there first.  A copy is used only
  while its ``quant.json`` matches the mode, dtype, ``FORMAT``, the weights'
  fingerprint (``engine.paths.weights_fingerprint``) and, for int4, this CPU's
  packed layout (``engine.quant.kernels.int4_layout``); otherwise it is rebuilt.
  A ``quant.json`` of the wrong shape (:func:`check_meta`: unknown mode or layer
  kind, wrong types) is moved aside with one warning, and a copy that fails to
  load is rebuilt with one warning: a damaged cache costs a rebuild, never a start.
* Several Brisk processes may share the cache: a copy is built under the file lock
  of its folder (a second process says once, through ``progress`` and on stderr,
  that another Brisk is preparing the model, waits, then uses the finished copy),
  written into a private temporary folder and renamed into place, so a reader sees
  a whole copy or none and no process deletes another's copy.  Temporary folders of
  killed processes are removed before a build.
* :func:`save_quantized` / :func:`load_quantized` are the int-cpu half of that cache
  (packed weights in safetensors, keyed by module name); bnb models use
  transformers' ``save_pretrained``.
* :func:`remove_tree` is the one way Brisk deletes a cache folder: never a path that
  resolves outside ``cache/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.datafiles import (
    StateError,
    exclusive,
    load_state,
    private_name,
    publish_dir,
    remove_stale_temps,
    string_map,
)
from engine.paths import atomic_write, cache_dir, weights_fingerprint
from engine.quant.apply import bnb_config, fuse_fp16, quantize_cpu, swap_module
from engine.quant.kernels import Fp16Linear, Int4Linear, Int8Linear, Q8Linear, int4_layout
from engine.quant.modes import CPU_MODES, MODES, require

FORMAT = 1  # bump when the saved layout changes; old caches are then rebuilt
Q8_LAYOUT = 3  # q8-cpu copies: 2 keeps layers from 4-bit GGUFs in 4 bits (1: all in 8); 3 their steps in float16
# where exact; older copies are rebuilt
META = "quant.json"
WAITING = "Another Brisk is preparing the model; waiting for it to finish"
KINDS = {
    "fp16-cpu": ("fp16",),
    "q8-cpu": ("q8",),
    "int8-cpu": ("int8",),
    "int4-cpu": ("int4", "int8"),
}  # layer kinds per mode
MAX_FEATURES = 1 << 20  # no linear layer is wider; a bigger number in quant.json is damage

log = logging.getLogger("brisk.quant")


def quant_dir(location: str, mode: str, dtype: torch.dtype) -> Path:
    """Where the quantized copy of ``location`` lives: beside a converted model, else in ``cache/quant``."""
    name = f"{mode}-{str(dtype).removeprefix('torch.')}"
    path = Path(location)
    cache = cache_dir().resolve()
    if path.is_dir() and path.resolve().is_relative_to(cache):
        return path / "quant" / name
    key = hashlib.sha256(str(path.resolve() if path.is_dir() else location).encode()).hexdigest()[:16]
    return cache / "quant" / key / name


def _meta(mode: str, dtype: torch.dtype, stamp: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"format": FORMAT, "mode": mode, "dtype": str(dtype), "source": stamp}
    if mode == "int4-cpu":
        meta["int4_layout"] = int4_layout()
    if mode == "q8-cpu":
        meta["q8_layout"] = Q8_LAYOUT
    return meta


def waiting(progress: Callable[[float, str], None], fraction: float) -> Callable[[], None]:
    """The ``on_wait`` of a model lock: says once, in the progress line and on stderr, that this start waits."""

    def say() -> None:
        log.warning("%s.", WAITING)
        progress(fraction, f"{WAITING}\u2026")

    return say


def remove_tree(path: Path) -> None:
    """``shutil.rmtree(path)``, refused unless ``path`` is a folder inside ``cache/`` by its name (never a link).

    The check is on the path as written (no ``..``, under the cache folder), not on where links lead, so a
    user who moved ``cache/models`` to another disk with a link keeps working; a planted link is itself
    refused, and ``rmtree`` never follows links inside the folder.  A path that does not exist is no work.
    """
    if not os.path.lexists(path):
        return
    roots = {Path(os.path.abspath(cache_dir())), cache_dir().resolve()}  # as named, and as quant_dir names it
    target = Path(os.path.abspath(path))
    if path.is_symlink() or target in roots or not any(target.is_relative_to(root) for root in roots):
        raise ValueError(f"refusing to remove {path}: it is not a folder inside {cache_dir()}")
    shutil.rmtree(target, ignore_errors=True)


def _whole(value: object, low: int = 1, high: int = MAX_FEATURES) -> bool:
    return type(value) is int and low <= value <= high


def _check_layer(mode: str, name: str, spec: object) -> None:
    if not isinstance(spec, dict):
        raise StateError(f"layer {name[:80]!r} is not an object")
    if spec.get("kind") not in KINDS[mode]:
        raise StateError(f"layer {name[:80]!r} has kind {str(spec.get('kind'))[:40]!r}, not one of {KINDS[mode]}")
    if not (_whole(spec.get("in")) and _whole(spec.get("out")) and _whole(spec.get("group_size"))):
        raise StateError(f"layer {name[:80]!r}: in, out and group_size must be whole numbers up to {MAX_FEATURES}")
    if not isinstance(spec.get("bias"), bool):
        raise StateError(f"layer {name[:80]!r}: bias must be true or false")
    if spec.get("bits", 8) not in (8, 4) or type(spec.get("bits", 8)) is not int:
        raise StateError(f"layer {name[:80]!r}: bits must be 8 or 4")


def check_meta(value: Any) -> dict[str, Any]:
    """Validator of ``quant.json``: the shape :func:`save_quantized` (or a bnb save) writes; raises StateError."""
    meta = string_map(value)
    mode = meta.get("mode")
    if mode not in MODES or mode == "none":
        raise StateError(f"mode {str(mode)[:40]!r} is not a quantization mode")
    # the cache's keys (absent from a copy saved by hand; _valid then finds no match and rebuilds)
    if ("format" in meta and type(meta["format"]) is not int) or not all(
        isinstance(meta[k], str) for k in ("dtype", "source") if k in meta
    ):
        raise StateError("format must be a whole number, dtype and source texts")
    if "int4_layout" in meta and not isinstance(meta["int4_layout"], str):
        raise StateError("int4_layout must be text")
    if "q8_layout" in meta and type(meta["q8_layout"]) is not int:
        raise StateError("q8_layout must be a whole number")
    if mode not in CPU_MODES:
        return meta
    layers, skipped, aliases = meta.get("layers"), meta.get("skipped"), meta.get("aliases", {})
    if not isinstance(layers, dict) or not _whole(meta.get("group_size")):
        raise StateError("layers must be an object and group_size a whole number")
    for name, spec in layers.items():
        _check_layer(mode, name, spec)
    if not isinstance(skipped, list) or not all(isinstance(n, str) for n in skipped):
        raise StateError("skipped must be a list of layer names")
    string_map(aliases, lambda _name, target: isinstance(target, str))
    return meta


def _valid(folder: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    """``folder``'s quant.json when it is whole and matches ``expected`` (a damaged one is moved aside)."""
    meta = load_state(folder / META, check_meta)
    return meta if meta is not None and all(meta.get(k) == v for k, v in expected.items()) else None


def save_quantized(model: Any, folder: Path, meta: dict[str, Any] | None = None) -> None:
    """Write an fp16-cpu/q8-cpu/int8-cpu/int4-cpu model to ``folder``: config, ``model.safetensors``, ``quant.json``.

    Every tensor of the state dict is saved under its module name (packed int weights,
    scales, and the unquantized rest); tensors shared by several names are saved once.
    """
    from safetensors.torch import save_file

    info = getattr(model, "brisk_quant", None)
    if not info or info.get("mode") not in CPU_MODES:
        raise ValueError(f"save_quantized takes a model quantized by quantize_cpu ({', '.join(CPU_MODES)}).")
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            tensors[name] = tensor.detach().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    full = {**(meta or {}), **info, "aliases": aliases}
    atomic_write(folder / META, json.dumps(full, indent=1))


def load_quantized(folder: Path, dtype: torch.dtype, meta: dict[str, Any] | None = None) -> nn.Module:
    """Build the model from ``folder`` (written by :func:`save_quantized`) without quantizing again.

    ``meta``: its quant.json as :func:`check_meta` returned it (read here when None); raises
    ``ValueError`` when there is none of the right shape, or what loading the weights raises.
    """
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    meta = meta or load_state(folder / META, check_meta)
    if meta is None or meta["mode"] not in CPU_MODES:
        raise ValueError(f"{folder} holds no quantized copy of the fp16/int CPU modes (no valid {META}).")
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False):  # parameters on meta; computed buffers (rotary) real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.device("meta"):
        for name, spec in meta["layers"].items():
            if spec["kind"] == "fp16":
                swap_module(model, name, Fp16Linear(spec["in"], spec["out"], spec["bias"]))
            elif spec["kind"] == "q8":
                swap_module(model, name, Q8Linear(spec["in"], spec["out"], spec["bias"], spec.get("bits", 8)))
            elif spec["kind"] == "int8":
                swap_module(model, name, Int8Linear(spec["in"], spec["out"], spec["bias"]))
            else:
                swap_module(model, name, Int4Linear(spec["in"], spec["out"], spec["bias"], spec["group_size"]))
    # Tensors read from safetensors can start at any byte; the int kernels crash (SIGSEGV) on
    # weights that are not 64-byte aligned, so those are copied into fresh (aligned) memory.
    state = {k: v if v.data_ptr() % 64 == 0 else v.clone() for k, v in load_file(folder / "model.safetensors").items()}
    for name, target in meta.get("aliases", {}).items():
        state[name] = state[target]
    model.load_state_dict(state, strict=True, assign=True)
    if meta["mode"] == "fp16-cpu":
        fuse_fp16(model)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    model.brisk_quant = {k: meta[k] for k in ("mode", "group_size", "layers", "skipped")}
    return model.eval()


@dataclass
class QuantLoad:
    model: Any
    cached: bool  # True: read from the cache; False: quantized now (and saved)
    folder: Path
    seconds: float


def load_quantized_model(
    location: str,
    mode: str,
    dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[float, str], None] | None = None,
) -> QuantLoad:
    """Load ``location`` (a safetensors model folder or hub id) quantized with ``mode``.

    The first time, the model is quantized and a copy saved under :func:`quant_dir`
    (one process at a time); later loads read the copy.  ``dtype`` is the dtype of
    everything not quantized (and the compute dtype of bnb 4-bit, except that float32
    computes in bfloat16).  Raises ``QuantUnavailable`` / ``ValueError`` before touching any file.
    """
    require(mode, device)
    if mode == "none":
        raise ValueError("load_quantized_model needs a quantization mode; load mode 'none' as usual.")
    progress = progress or (lambda _f, _m: None)
    start = time.perf_counter()
    folder = quant_dir(location, mode, dtype)
    expected = _meta(mode, dtype, weights_fingerprint(location))
    if mode == "bnb-int8":  # it logs a warning on every call unless activations are float16
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    failed: list[str] = []
    model = _cached(folder, expected, dtype, device, progress, failed)
    if model is None:
        lock = "quant-" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:32]
        with exclusive(lock, on_wait=waiting(progress, 0.8)):
            if not failed:  # another Brisk may have built it while this one waited
                model = _cached(folder, expected, dtype, device, progress, failed)
            if model is None:
                model = _build(location, folder, expected, dtype, device, progress)
                return QuantLoad(model, False, folder, time.perf_counter() - start)
    return QuantLoad(model.eval(), True, folder, time.perf_counter() - start)


def _cached(
    folder: Path,
    expected: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[float, str], None],
    failed: list[str],
) -> Any:
    """The copy in ``folder`` if it matches ``expected`` and loads; None otherwise (a failure noted in ``failed``)."""
    meta = _valid(folder, expected)
    if meta is None:
        return None
    mode = meta["mode"]
    progress(0.85, f"Loading {mode} weights from the cache")
    try:
        if mode in CPU_MODES:
            return load_quantized(folder, dtype, meta)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map={"": device})
    except Exception as exc:  # a damaged copy only costs quantizing again
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        log.warning("The %s copy in %s could not be loaded (%s); quantizing the model again.", mode, folder, reason)
        failed.append(reason)
        return None


def _build(
    location: str,
    folder: Path,
    expected: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[float, str], None],
) -> Any:
    """Quantize ``location`` and publish its copy at ``folder`` (the caller holds the folder's lock)."""
    from transformers import AutoModelForCausalLM

    mode = expected["mode"]
    progress(0.8, f"Quantizing the model to {mode} (first time only)")
    remove_stale_temps(folder.parent, folder.name)
    remove_tree(folder.with_name(folder.name + ".tmp"))  # left by a Brisk before private names
    tmp = private_name(folder)
    try:
        if mode in CPU_MODES:
            model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype)
            quantize_cpu(model, mode, pack=False)
            save_quantized(model, tmp, expected)
            if mode == "fp16-cpu":
                fuse_fp16(model)  # after saving: the saved copy came from the plain weights
        else:
            compute = torch.float16 if dtype == torch.float16 else torch.bfloat16
            model = AutoModelForCausalLM.from_pretrained(
                location, dtype=dtype, quantization_config=bnb_config(mode, compute), device_map={"": device}
            )
            # Saved before any forward: on AVX512-BF16 CPUs bitsandbytes 0.50 repacks 4-bit weights
            # at the first call, and a model saved after that reloads with wrong weights.
            model.save_pretrained(tmp)
            atomic_write(tmp / META, json.dumps(expected, indent=1))
        publish_dir(tmp, folder)
    finally:
        if tmp.exists():
            remove_tree(tmp)
    return model.eval()
