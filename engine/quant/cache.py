"""The on-disk cache of quantized copies: quantize once, load the copy afterwards.

Contract:

* :func:`load_quantized_model` is the one call a loader needs: it returns a
  quantized model from the cache next to the unquantized weights
  (:func:`quant_dir`), or quantizes and saves it there first.  A copy is used only
  while its ``quant.json`` matches the mode, dtype, ``FORMAT``, the weights'
  fingerprint (``engine.paths.weights_fingerprint``) and, for int4, this CPU's
  packed layout (``engine.quant.kernels.int4_layout``); otherwise it is rebuilt.
* :func:`save_quantized` / :func:`load_quantized` are the int-cpu half of that cache
  (packed weights in safetensors, keyed by module name); bnb models use
  transformers' ``save_pretrained``.  A copy is written into a temporary folder
  and renamed into place, so a reader sees a whole copy or none.
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

from engine.paths import atomic_write, cache_dir, weights_fingerprint
from engine.quant.apply import bnb_config, fuse_fp16, quantize_cpu, swap_module
from engine.quant.kernels import Fp16Linear, Int4Linear, Int8Linear, int4_layout
from engine.quant.modes import CPU_MODES, require

FORMAT = 1  # bump when the saved layout changes; old caches are then rebuilt


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
    return meta


def _valid(folder: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / "quant.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if all(meta.get(k) == v for k, v in expected.items()) else None


def save_quantized(model: Any, folder: Path, meta: dict[str, Any] | None = None) -> None:
    """Write an fp16-cpu/int8-cpu/int4-cpu model to ``folder``: config, ``model.safetensors``, ``quant.json``.

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
    atomic_write(folder / "quant.json", json.dumps(full, indent=1))


def load_quantized(folder: Path, dtype: torch.dtype) -> nn.Module:
    """Build the model from ``folder`` (written by :func:`save_quantized`) without quantizing again."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    meta = json.loads((folder / "quant.json").read_text())
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False):  # parameters on meta; computed buffers (rotary) real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.device("meta"):
        for name, spec in meta["layers"].items():
            if spec["kind"] == "fp16":
                swap_module(model, name, Fp16Linear(spec["in"], spec["out"], spec["bias"]))
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

    The first time, the model is quantized and a copy saved under :func:`quant_dir`;
    later loads read the copy.  ``dtype`` is the dtype of everything not quantized (and
    the compute dtype of bnb 4-bit, except that float32 computes in bfloat16).
    Raises ``QuantUnavailable`` / ``ValueError`` before touching any file.
    """
    from transformers import AutoModelForCausalLM

    require(mode, device)
    if mode == "none":
        raise ValueError("load_quantized_model needs a quantization mode; load mode 'none' as usual.")
    progress = progress or (lambda _f, _m: None)
    start = time.perf_counter()
    folder = quant_dir(location, mode, dtype)
    expected = _meta(mode, dtype, weights_fingerprint(location))
    cached = _valid(folder, expected) is not None
    if mode == "bnb-int8":  # it logs a warning on every call unless activations are float16
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    if cached:
        progress(0.85, f"Loading {mode} weights from the cache")
        if mode in CPU_MODES:
            model = load_quantized(folder, dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map={"": device})
        return QuantLoad(model.eval(), True, folder, time.perf_counter() - start)
    progress(0.8, f"Quantizing the model to {mode} (first time only)")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
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
        atomic_write(tmp / "quant.json", json.dumps(expected, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return QuantLoad(model.eval(), False, folder, time.perf_counter() - start)
