"""A GGUF file run as it is: its blocks memory-mapped, multiplied where they lie, nothing converted.

``engine.model.loader`` loads a ``.gguf`` file with these steps, in seconds and in about the
file's size of memory: :func:`read_header` parses the header with transformers' ``struct`` reader
(no per-string numpy views), :func:`check` and :func:`check_memory` refuse what this path does not
run or what would not fit, :func:`read_tokenizer` builds the tokenizer from the file's vocabulary
by transformers' own GGUF converter, :func:`read_config` maps the config, and :func:`build_model`
builds the model on the meta device with every projection, the embedding and the head replaced
by layers that keep views of the memory-mapped file (:class:`GgufLinear`, :class:`GgufEmbedding`).
Their products run in the native step's block kernels (``engine/quant/gguf_*.cpp``: dot products
on the blocks for a decode step's rows, tiles de-quantized for torch's GEMM for a prompt's);
norms and biases (float32 in the files) are views too.  Nothing is written to the data folder.

Only architectures whose tensors this module maps exactly run here (``engine.model.support.GGUF_AS_IS``:
llama's and mistral's query and key rows are put back in the order transformers' rotary
embedding expects, a permutation of whole rows, so no block changes); any other file, and any
tensor type the kernels do not read (:data:`TYPES`), raises :class:`Unsupported` with the reason
and the caller converts the file through transformers as before.  A file that is truncated or
inconsistent raises :class:`engine.model.source.ModelLoadError`.

The memory a load takes is predicted from the file alone by :func:`predict_bytes` (the file's
mapped tensors, the KV cache for the context, and a measured allowance for the runtime).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.model.headers import AS_IS_RUNTIME_BYTES, KV_CONTEXT, kv_bytes
from engine.model.source import ModelLoadError
from engine.model.support import GGUF_AS_IS
from engine.quant.gguf_layers import TYPES, GgufEmbedding, GgufLinear, dequantize

# (weights a block, bytes a block) of those types
BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          20: (32, 18), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}  # fmt: skip


class Unsupported(Exception):
    """The file is a GGUF this module does not run as it is (the reason is the message)."""


@dataclasses.dataclass
class GgufFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], int, int]]  # name -> (torch shape, ggml type, absolute offset)
    size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{name}", default)


def _reader() -> Any:
    try:
        import importlib

        return importlib.import_module("transformers.integrations.gguf.reader")
    except ImportError as exc:  # an older transformers: the conversion path reads the file
        raise Unsupported(f"this transformers has no fast GGUF reader ({exc})") from exc


def read_header(path: Path, string_arrays: tuple[str, ...] = ()) -> GgufFile:
    """The file's metadata and tensor table (no tensor data read); ModelLoadError for a damaged file."""
    import numpy

    fast = _reader()
    try:
        blob = numpy.memmap(path, dtype=numpy.uint8, mode="r")
        metadata, count, pos = fast._read_metadata(blob, str(path), string_arrays)
        entries, pos = fast._read_tensor_table(blob, count, pos)
    except (ValueError, struct.error, IndexError, OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path.name} is not a readable GGUF file: {exc}") from exc
    alignment = int(metadata.get("general.alignment", 32) or 32)
    start = (pos + alignment - 1) // alignment * alignment
    size = int(blob.shape[0])
    tensors = {}
    for name, shape, kind, offset in entries:
        tensors[name] = (tuple(int(d) for d in shape), int(kind), start + int(offset))
    file = GgufFile(path, metadata, tensors, size)
    for name, (shape, kind, offset) in tensors.items():
        if kind in BLOCKS and offset + tensor_bytes(shape, kind) > size:
            raise ModelLoadError(f"{path.name} is truncated: tensor {name} runs past the end of the file.")
    return file


def tensor_bytes(shape: tuple[int, ...], kind: int) -> int:
    block, size = BLOCKS[kind]
    elements = 1
    for d in shape:
        elements *= d
    return elements // block * size


def check(file: GgufFile) -> None:
    """Raise :class:`Unsupported` unless this module runs ``file`` as it is."""
    arch = file.architecture
    if arch not in GGUF_AS_IS:
        raise Unsupported(f"architecture {arch!r} is not one Brisk runs on a GGUF's own blocks")
    odd = sorted({TYPES.get(k, str(k)) for _, k, _ in file.tensors.values() if k not in BLOCKS})
    if odd:
        raise Unsupported(f"tensor types {', '.join(odd)} are not read by Brisk's block kernels")
    for name, (shape, kind, _) in file.tensors.items():
        if not shape or min(shape) <= 0:
            raise ModelLoadError(f"{file.path.name}: tensor {name} has the shape {list(shape)}.")
        if len(shape) > 2:
            raise Unsupported(f"tensor {name} has {len(shape)} dimensions")
        if shape[-1] % BLOCKS[kind][0]:
            raise Unsupported(f"tensor {name}'s rows are not whole blocks")


def fingerprint(file: GgufFile) -> str:
    """A cheap identity of the file's weights (for KV and prefix caches): its size, its header and
    tensor table, and samples of its data, hashed; a file changed in place changes it."""
    digest = hashlib.sha256()
    digest.update(str(file.size).encode())
    with open(file.path, "rb") as f:
        first = min(file.tensors.values(), key=lambda t: t[2])[2] if file.tensors else 0
        digest.update(f.read(min(first, 8 << 20)))
        step = max(1, file.size // 16)
        for at in range(first, file.size, step):
            f.seek(at)
            digest.update(f.read(4096))
    return digest.hexdigest()


def predict_bytes(file: GgufFile, context: int) -> dict[str, int]:
    """What loading ``file`` will take, before anything is read: the mapped tensors (all of them, since
    a decode step reads every one), the KV cache for ``context`` positions in float32, the runtime."""
    weights = sum(tensor_bytes(s, k) for s, k, _ in file.tensors.values() if k in BLOCKS)
    layers = _count(file.key("block_count"), 0)
    heads = _count(file.key("attention.head_count"), 1) or 1
    kv_heads = _count(file.key("attention.head_count_kv"), heads) or heads
    hidden = _count(file.key("embedding_length"), 0)
    head_dim = _count(file.key("attention.key_length"), hidden // heads)
    kv = kv_bytes(layers, kv_heads * head_dim, context)
    runtime = AS_IS_RUNTIME_BYTES
    return {"weights": weights, "kv": kv, "runtime": runtime, "total": weights + kv + runtime}


def _count(value: Any, default: int) -> int:
    """A metadata count as a non-negative int (a list, as some files give per layer: its largest); else default."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int)), default=default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def context_of(file: GgufFile) -> int:
    return _count(file.key("context_length"), 0) or 2048


def check_memory(file: GgufFile) -> None:
    """Refuse (ModelLoadError), before anything is read, a file whose load would not fit in the memory this
    machine has free: its tensors, the runtime and the KV of ``KV_CONTEXT`` positions (as ``brisk models``
    counts it: ``engine.model.headers.memory_needs``)."""
    from engine.model.headers import available_memory

    need = predict_bytes(file, min(context_of(file), KV_CONTEXT))
    free = available_memory()
    if free and need["total"] > free:
        raise ModelLoadError(
            f"{file.path.name} needs about {need['total'] / 2**30:.1f} GB of memory ({need['weights'] / 2**30:.1f} GB "
            f"of weights mapped from the file, {need['kv'] / 2**30:.1f} GB for {KV_CONTEXT:,} positions of context, "
            f"{need['runtime'] / 2**30:.1f} GB for the runtime) and this machine has {free / 2**30:.1f} GB free. "
            "Close other programs, or pick a smaller model or a smaller quantization of it."
        )


def read_tokenizer(path: Path) -> Any:
    """The file's tokenizer, built from its vocabulary by transformers' GGUF converter (about 2 s for
    Qwen2.5's 151,936 tokens; ``AutoTokenizer(gguf_file=)`` parses the whole file first, about 17 s)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    try:
        architecture, vocabulary, config = get_gguf_tokenizer(str(path))
        backend, extra = convert_gguf_tokenizer(architecture, vocabulary)
        return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
    except Exception as exc:  # noqa: BLE001 (transformers raises many types for vocabularies it lacks)
        raise Unsupported(f"its tokenizer could not be built ({type(exc).__name__}: {exc})") from exc


def read_config(file: GgufFile) -> Any:
    """The transformers config of ``file``: transformers' own GGUF mapping (``load_gguf_checkpoint`` without
    tensors) over the header already parsed, instead of ``gguf.GGUFReader``'s parse (12 s for Qwen2.5's
    vocabulary, which the config does not need)."""
    import gguf
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from engine.model.source import _field

    # the string arrays left unread (their counts in the header parse) go in empty: the config takes none
    arrays = ("tokens", "merges", "token_type", "scores")
    counts = {f"tokenizer.ggml.{a}": file.metadata.get(f"tokenizer.ggml.{a}") for a in arrays}
    counts = {n: v for n, v in counts.items() if isinstance(v, int)}

    class Header:  # what load_gguf_checkpoint reads of a gguf.GGUFReader: fields and tensor names
        fields = {name: _field(name, [] if name in counts else value) for name, value in file.metadata.items()}
        tensors = [dataclasses.make_dataclass("T", ["name"])(n) for n in file.tensors]

    reader = gguf.GGUFReader
    gguf.GGUFReader = lambda *_a, **_k: Header()  # type: ignore[misc,assignment]  # put back below
    try:
        values = dict(load_gguf_checkpoint(str(file.path), return_tensors=False)["config"])
    except Exception as exc:  # noqa: BLE001 (transformers raises many types for files it cannot map)
        raise Unsupported(f"transformers maps no config for it ({type(exc).__name__}: {exc})") from exc
    finally:
        gguf.GGUFReader = reader  # type: ignore[misc]
    embed = file.tensors.get("token_embd.weight")
    if embed is not None:
        values["vocab_size"] = embed[0][0]  # the embedding's rows (the header's token count may be fewer)
    elif "tokenizer.ggml.tokens" in counts:
        values["vocab_size"] = counts["tokenizer.ggml.tokens"]
    model_type = values.pop("model_type", file.architecture)
    values.pop("_model_name_or_path", None)
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError, KeyError) as exc:
        raise Unsupported(f"no transformers config for {model_type!r}: {exc}") from exc


def _view(file: GgufFile, data: torch.Tensor, name: str) -> tuple[torch.Tensor, int, tuple[int, ...]]:
    """(uint8 [rows, bytes a row] view of tensor ``name``, its type, its torch shape)."""
    shape, kind, offset = file.tensors[name]
    size = tensor_bytes(shape, kind)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return data[offset : offset + size].view(rows, size // rows), kind, shape


def _floats(file: GgufFile, data: torch.Tensor, name: str) -> torch.Tensor:
    """A small tensor (a norm, a bias) as float32."""
    raw, kind, shape = _view(file, data, name)
    if kind == 0:
        return raw.reshape(-1).view(torch.float32).view(shape)
    return dequantize(raw, kind, shape[-1]).view(shape)


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's permutation of a query or key projection (as transformers'
    GGUF loader does for these architectures): rows [heads, half, 2] -> [heads, 2, half]."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def build_model(file: GgufFile, config: Any) -> nn.Module:
    """The transformers model of ``config`` with every weight a view of ``file``'s memory-mapped blocks."""
    import gguf
    import numpy
    from transformers import AutoModelForCausalLM

    blob = numpy.memmap(file.path, dtype=numpy.uint8, mode="c")  # copy-on-write: writable views, nothing copied
    data = torch.from_numpy(blob)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    arch_ids = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    names = gguf.get_tensor_name_map(arch_ids[file.architecture], int(config.num_hidden_layers))
    permuted = GGUF_AS_IS[file.architecture]
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    used: set[str] = set()

    def gguf_name(module_name: str, suffix: str) -> str | None:
        found = names.get_name(module_name)
        return f"{found}{suffix}" if found is not None and f"{found}{suffix}" in file.tensors else None

    for module_name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            weight = gguf_name(module_name, ".weight")
            if weight is None and module_name == "lm_head":
                weight = "token_embd.weight"  # tied to the embedding
            if weight is None:
                raise Unsupported(f"the file has no tensor for {module_name}")
            blocks, kind, shape = _view(file, data, weight)
            if shape != (module.out_features, module.in_features):
                raise ModelLoadError(f"{file.path.name}: {weight} is {list(shape)}, the config says "
                                     f"[{module.out_features}, {module.in_features}].")  # fmt: skip
            bias_name = gguf_name(module_name, ".bias")
            bias = _floats(file, data, bias_name) if bias_name else None
            if module.bias is not None and bias is None:
                raise Unsupported(f"the file has no bias for {module_name}")
            if permuted and module_name.endswith(("q_proj", "k_proj")):
                order = _unpermute(module.out_features, heads if module_name.endswith("q_proj") else kv_heads)
                blocks = blocks[order].contiguous()  # whole rows move; the query and key rows only
                bias = bias[order].contiguous() if bias is not None else None
            used.update(n for n in (weight, bias_name) if n)
            model.set_submodule(module_name, GgufLinear(blocks, kind, module.in_features, bias))
        elif isinstance(module, nn.Embedding):
            weight = gguf_name(module_name, ".weight") or "token_embd.weight"
            blocks, kind, shape = _view(file, data, weight)
            used.add(weight)
            model.set_submodule(module_name, GgufEmbedding(blocks, kind, shape[-1]))
    for module_name, module in model.named_modules():
        for pname, _param in list(module.named_parameters(recurse=False)):
            found = gguf_name(module_name, f".{pname}")
            if found is None:
                raise Unsupported(f"the file has no tensor for {module_name}.{pname}")
            used.add(found)
            module._parameters[pname] = nn.Parameter(_floats(file, data, found), requires_grad=False)
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is not None:
        model.model.rotary_emb = type(rotary)(config=model.config)  # its tables, computed on the CPU
    left = [n for n, b in model.named_buffers() if b.device.type == "meta"]
    if left:
        raise Unsupported(f"buffers not made: {', '.join(left[:3])}")
    model.eval()
    return model
