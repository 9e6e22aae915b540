"""What a model on disk is, read from its headers alone: no torch, no weights, milliseconds a model.

:func:`describe` takes a GGUF file or a Hugging Face model folder and returns
:class:`Facts`: architecture, parameter count (and how many of them are the
embedding and the output head), format and quantization, context length, layer
and key/value widths, whether a tokenizer and a chat template are there, and a
fingerprint of the tokenizer's vocabulary (two models with the same fingerprint
can draft for each other).  A GGUF file is read up to its tensor list (its
metadata and tensor shapes; the data after them is never touched); a folder
through ``config.json``, the safetensors headers (8 bytes of length, then JSON)
and the tokenizer files.  Anything that would stop Brisk from loading the model
is a sentence in ``Facts.problem`` (no tokenizer, no chat template, an
architecture transformers cannot read from GGUF, MLX or GPTQ weights), so the
model library can say so before anything loads; a file that is not what it
claims raises :class:`HeaderError`.

:func:`memory_needs` estimates the memory a model takes in each CPU mode Brisk
runs (weights as each mode stores them, the KV cache of a full context, the
runtime), and :func:`available_memory` what this machine has free, so the
library and the loader can refuse a model that cannot fit before reading it.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.model.support import GGUF_AS_IS, Support, support, support_for_gguf

# GGUF architectures transformers can read (its GGUF_CONFIG_MAPPING; tests/engine/library checks the list)
GGUF_READABLE = frozenset(
    {
        "bloom", "deci", "falcon", "gemma2", "gemma3", "gemma4", "gpt2", "gpt_oss", "lfm2", "llama", "mamba",
        "minimax_m2", "mistral", "nemotron", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "stablelm",
        "starcoder2", "t5", "umt5",
    }
)  # fmt: skip
GGUF_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
# general.file_type -> the name llama.cpp and LM Studio show (gguf.LlamaFileType without "MOSTLY_")
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
# ggml tensor types -> name, for files without general.file_type (the most common type among 2-D weights)
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
    12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16",
}  # fmt: skip
SAFETENSORS_DTYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "U8": "U8"}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tiktoken.model", "qwen.tiktoken",
)  # fmt: skip
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one
RUNTIME_BYTES = 600 << 20  # Python, torch, the window and Brisk's caches, measured as RSS before a model loads
# a GGUF file run on its blocks: the runtime beside the mapped file (torch, transformers, the tokenizer,
# buffers), measured as RSS less the file's pages on both real files (docs/PERFORMANCE.md)
AS_IS_RUNTIME_BYTES = 650 << 20
KV_CONTEXT = 4096  # the KV cache counted: one conversation of this many tokens, float32
# Bytes one linear-layer weight takes in each CPU mode (engine.quant.modes); the embedding stays float32
MODE_BYTES = {"none": 4.0, "fp16-cpu": 2.0, "q8-cpu": 1.25}
# q8-cpu keeps the layers of a 4-bit GGUF in 4 bits (0.75 bytes a weight); its head stays 8 bits
FOUR_BIT_FILES = ("Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M")
Q4_BYTES = 0.75
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class HeaderError(Exception):
    """A file is not the model file it claims to be (the message names it and says what is wrong)."""


@dataclass
class Facts:
    """What :func:`describe` read; 0 or "" where the headers do not say."""

    path: str
    format: str  # "gguf", "safetensors" or "pytorch"
    architecture: str = ""  # transformers' model_type ("llama", "qwen2", ...)
    parameters: int = 0
    embedding_parameters: int = 0  # vocab x hidden, once
    tied: bool = True  # the output head is the embedding (not counted twice in ``parameters``)
    quant: str = ""  # "Q4_K_M", "F16", "BF16", "F32", "GPTQ", ...
    size_bytes: int = 0  # on disk, every file the model needs
    context: int = 0
    layers: int = 0
    kv_width: int = 0  # key/value heads x head size, per layer
    tokenizer: bool = False
    chat_template: bool = False
    vocab: str = ""  # fingerprint of the tokenizer's vocabulary (token -> id); "" when unknown
    config: dict[str, Any] = field(default_factory=dict)  # config.json, or what a GGUF file says of it
    problem: str = ""  # why Brisk cannot load it, for the user; "" when nothing is known to stop it

    def support(self) -> Support:
        """Which of Brisk's paths would run this model (``engine.model.support``): by the GGUF architecture for
        a GGUF file, by ``config.json`` for a folder."""
        if self.format == "gguf":
            return support_for_gguf(str(self.config.get("gguf_architecture", self.architecture)))
        return support(self.config)


def describe(path: Path, vocab: bool = True) -> Facts:
    """:class:`Facts` of a GGUF file or a model folder; ``vocab=False`` skips the vocabulary fingerprint.
    A header whose values have the wrong type or size (a string where a count goes, arrays nested past
    Python's stack) raises :class:`HeaderError` too."""
    try:
        if path.is_file():
            return describe_gguf(path, vocab)
        if path.is_dir():
            return describe_folder(path, vocab)
    except (ValueError, TypeError, OverflowError, KeyError, RecursionError, struct.error) as exc:
        raise HeaderError(f"{path.name} has a damaged header ({type(exc).__name__}: {str(exc)[:200]}).") from None
    raise HeaderError(f"{path} does not exist.")


# -- GGUF -------------------------------------------------------------------------------------------


class _Reader:
    """Little-endian reads over a memory-mapped GGUF file, with a clear error past its end."""

    def __init__(self, data: Any, path: Path) -> None:
        self.data, self.at, self.path = data, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise HeaderError(f"{self.path.name} ends inside its GGUF header: the file is truncated.")
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def text(self) -> str:
        size = self.take("<Q")
        if size > len(self.data) - self.at:
            raise HeaderError(f"{self.path.name} has a damaged GGUF header (a string longer than the file).")
        raw = bytes(self.data[self.at : self.at + size])
        self.at += size
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _GGUF_SCALARS:
            return self.take(_GGUF_SCALARS[kind])
        if kind == 8:
            return self.text()
        if kind == 9:
            item, count = self.take("<I"), self.take("<Q")
            if item in _GGUF_SCALARS:
                size = struct.calcsize(_GGUF_SCALARS[item]) * count
                if size > len(self.data) - self.at:
                    raise HeaderError(f"{self.path.name} has a damaged GGUF header (an array longer than the file).")
                start = self.at
                self.at += size
                return bytes(self.data[start : self.at]) if keep else count
            if item == 8:
                if count > (len(self.data) - self.at) // 8:  # each string takes 8 bytes of length at least
                    raise HeaderError(f"{self.path.name} has a damaged GGUF header (an array longer than the file).")
                if not keep:
                    for _ in range(count):
                        length = self.take("<Q")
                        self.at += length
                    if self.at > len(self.data):
                        raise HeaderError(f"{self.path.name} ends inside its GGUF header: the file is truncated.")
                    return count
                return [self.text() for _ in range(count)]
            return [self.value(item, keep) for _ in range(count)]
        raise HeaderError(f"{self.path.name} has a damaged GGUF header (unknown value type {kind}).")


def read_gguf(path: Path, keep_tokens: bool = False) -> tuple[dict[str, Any], list[tuple[str, list[int], int]]]:
    """(metadata, [(tensor name, shape, ggml type)]) of a GGUF file; arrays other than the token list are
    counted, not kept (``keep_tokens``: ``tokenizer.ggml.tokens`` as a list of strings)."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 24:
                raise HeaderError(f"{path.name} is too short to be a GGUF model file ({size} bytes).")
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise HeaderError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    try:
        if data[:4] != b"GGUF":
            raise HeaderError(f"{path.name} is not a GGUF model file (it does not start with the GGUF signature).")
        read = _Reader(data, path)
        read.at = 4
        version = read.take("<I")
        if version not in (2, 3):
            raise HeaderError(f"{path.name} is GGUF version {version}; Brisk reads versions 2 and 3.")
        tensors, entries = read.take("<Q"), read.take("<Q")
        if tensors > 1_000_000 or entries > 100_000:
            raise HeaderError(f"{path.name} has a damaged GGUF header ({tensors} tensors, {entries} entries).")
        meta: dict[str, Any] = {}
        for _ in range(entries):
            key = read.text()
            kind = read.take("<I")
            keep = keep_tokens and key == "tokenizer.ggml.tokens"
            meta[key] = read.value(kind, keep)
        shapes = []
        for _ in range(tensors):
            name = read.text()
            dims = read.take("<I")
            if dims > 8:
                raise HeaderError(f"{path.name} has a damaged GGUF header (a tensor of {dims} dimensions).")
            shape = [read.take("<Q") for _ in range(dims)]
            kind = read.take("<I")
            read.take("<Q")  # offset of its data
            shapes.append((name, shape, kind))
        return meta, shapes
    finally:
        data.close()


def gguf_architecture(name: str) -> str:
    """transformers' model_type for a GGUF ``general.architecture``."""
    return GGUF_ALIASES.get(name, name)


def describe_gguf(path: Path, vocab: bool = True) -> Facts:
    meta, tensors = read_gguf(path, keep_tokens=vocab)
    raw_arch = str(meta.get("general.architecture", ""))
    arch = gguf_architecture(raw_arch)
    facts = Facts(path=str(path), format="gguf", architecture=arch, size_bytes=path.stat().st_size)
    names = {name: shape for name, shape, _ in tensors}
    facts.parameters = sum(math.prod(shape) for shape in names.values())
    embed = names.get("token_embd.weight")
    facts.embedding_parameters = math.prod(embed) if embed else 0
    facts.tied = "output.weight" not in names
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int) and file_type in GGUF_FILE_TYPES:
        facts.quant = GGUF_FILE_TYPES[file_type]
    else:
        kinds = [kind for _, shape, kind in tensors if len(shape) == 2]
        common = max(set(kinds), key=kinds.count) if kinds else -1
        facts.quant = GGML_TYPES.get(common, f"type {common}" if common >= 0 else "")
    facts.context = int(meta.get(f"{raw_arch}.context_length", 0) or 0)
    facts.layers = int(meta.get(f"{raw_arch}.block_count", 0) or 0)
    heads = int(meta.get(f"{raw_arch}.attention.head_count", 0) or 0)
    kv_heads = meta.get(f"{raw_arch}.attention.head_count_kv", heads)
    kv_heads = int(kv_heads if isinstance(kv_heads, int) else heads)
    width = int(meta.get(f"{raw_arch}.embedding_length", 0) or 0)
    head_dim = int(meta.get(f"{raw_arch}.attention.key_length", 0) or (width // heads if heads else 0))
    facts.kv_width = kv_heads * head_dim
    facts.tokenizer = "tokenizer.ggml.tokens" in meta
    facts.chat_template = bool(meta.get("tokenizer.chat_template"))
    tokens = meta.get("tokenizer.ggml.tokens")
    if vocab and isinstance(tokens, list):
        facts.vocab = fingerprint(enumerate(tokens))
    facts.config = {
        "model_type": arch,
        "hidden_size": width,
        "num_hidden_layers": facts.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": facts.context,
        "tie_word_embeddings": facts.tied,
        "gguf_architecture": raw_arch,
    }
    window = meta.get(f"{raw_arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0:
        facts.config["sliding_window"] = window
    if not raw_arch:
        facts.problem = "The GGUF file does not say its architecture (general.architecture)."
    elif arch not in GGUF_READABLE:
        facts.problem = (
            f"A GGUF model of architecture {raw_arch!r}, which transformers cannot read from GGUF; "
            "use its Hugging Face (safetensors) folder instead."
        )
    elif not facts.tokenizer:
        facts.problem = "The GGUF file has no tokenizer (tokenizer.ggml.tokens)."
    elif not facts.chat_template:
        facts.problem = "The GGUF file has no chat template: Brisk needs an instruction-tuned chat model."
    return facts


# -- Hugging Face folders ---------------------------------------------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HeaderError(f"{path.name} is too short to be a safetensors file.")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER:
                raise HeaderError(f"{path.name} is not a safetensors file (its header would be {size} bytes).")
            body = fh.read(size)
    except OSError as exc:
        raise HeaderError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    try:
        header = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise HeaderError(f"{path.name} is not a safetensors file (its header is not JSON).") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name} is not a safetensors file.")
    return header


def _weight_files(folder: Path) -> tuple[str, list[Path]]:
    """(format, the weight files) of a model folder: safetensors first, then PyTorch ``.bin``."""
    for fmt, pattern, index in (
        ("safetensors", "*.safetensors", "model.safetensors.index.json"),
        ("pytorch", "*.bin", "pytorch_model.bin.index.json"),
    ):
        index_path = folder / index
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text(encoding="utf-8")).get("weight_map", {})
                names = sorted({str(v) for v in weight_map.values()}) if isinstance(weight_map, dict) else []
            except (OSError, ValueError, AttributeError):
                names = []
            files = [folder / n for n in names if "/" not in n and (folder / n).is_file()]
            if files:
                return fmt, files
        files = sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.startswith("training_args"))
        if files:
            return fmt, files
    return "", []


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past the stack
        return {}
    return value if isinstance(value, dict) else {}


def describe_folder(folder: Path, vocab: bool = True) -> Facts:
    config = _read_json(folder / "config.json")
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    inner = dict(text_config or config)
    fmt, files = _weight_files(folder)
    facts = Facts(path=str(folder), format=fmt or "none", config=inner)
    facts.architecture = str(inner.get("model_type") or config.get("model_type") or "")
    dtypes: dict[str, int] = {}
    for file in files:
        facts.size_bytes += file.stat().st_size
        if fmt != "safetensors":
            continue
        for name, entry in safetensors_header(file).items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = math.prod(int(d) for d in entry.get("shape", []))
            facts.parameters += count
            dtype = str(entry.get("dtype", ""))
            dtypes[dtype] = dtypes.get(dtype, 0) + count
            if name.endswith("embed_tokens.weight") or name.endswith("wte.weight"):
                facts.embedding_parameters = count
    for extra in folder.iterdir():
        if extra.is_file() and extra not in files and extra.suffix in (".json", ".model", ".txt", ".jinja"):
            facts.size_bytes += extra.stat().st_size
    hidden = int(inner.get("hidden_size", 0) or 0)
    vocab_size = int(inner.get("vocab_size", 0) or 0)
    if not facts.embedding_parameters:
        facts.embedding_parameters = hidden * vocab_size
    facts.tied = bool(inner.get("tie_word_embeddings", config.get("tie_word_embeddings", True)))
    if fmt == "pytorch" and not facts.parameters:
        facts.parameters = _index_total(folder) or 0
    facts.context = int(inner.get("max_position_embeddings", 0) or 0)
    facts.layers = int(inner.get("num_hidden_layers", 0) or 0)
    heads = int(inner.get("num_attention_heads", 0) or 0)
    kv_heads = int(inner.get("num_key_value_heads", heads) or heads)
    head_dim = int(inner.get("head_dim", 0) or (hidden // heads if heads else 0))
    facts.kv_width = kv_heads * head_dim
    quantization = config.get("quantization_config") or config.get("quantization")
    if isinstance(quantization, dict):
        method = str(quantization.get("quant_method") or ("mlx" if "group_size" in quantization else "")).upper()
        facts.quant = method or "quantized"
    elif dtypes:
        facts.quant = SAFETENSORS_DTYPES.get(max(dtypes, key=lambda k: dtypes[k]), "")
    else:
        facts.quant = str(inner.get("torch_dtype") or config.get("dtype") or "").upper().replace("FLOAT", "F")
    facts.tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    facts.chat_template = bool(
        tokenizer_config.get("chat_template")
        or (folder / "chat_template.jinja").is_file()
        or (folder / "chat_template.json").is_file()
    )
    if vocab and (folder / "tokenizer.json").is_file():
        facts.vocab = _tokenizer_fingerprint(folder / "tokenizer.json")
    facts.problem = _folder_problem(facts, config, fmt)
    return facts


def _index_total(folder: Path) -> int:
    metadata = _read_json(folder / "pytorch_model.bin.index.json").get("metadata", {})
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return int(total) // 4 if isinstance(total, int) else 0  # bytes of float32 weights


def _folder_problem(facts: Facts, config: dict[str, Any], fmt: str) -> str:
    if not config:
        return "The folder has no readable config.json, so it is not a Hugging Face model folder."
    if not fmt:
        return "The folder has a config.json but no weights (*.safetensors or pytorch_model*.bin)."
    if facts.quant == "MLX" or "quantization" in config:
        return "MLX weights (Apple's format) that transformers cannot run; pick the GGUF or safetensors version."
    if facts.quant in ("GPTQ", "AWQ", "EXL2", "AQLM", "HQQ", "FP8", "COMPRESSED-TENSORS"):
        return f"{facts.quant} weights need a GPU kernel Brisk does not use on this machine; pick a GGUF version."
    if not facts.tokenizer:
        return "The folder has weights but no tokenizer (tokenizer.json or tokenizer.model), so Brisk cannot read text."
    if not facts.chat_template:
        return "The tokenizer has no chat template: Brisk needs an instruction-tuned chat model."
    return ""


def _tokenizer_fingerprint(path: Path) -> str:
    data = _read_json(path)
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    vocab = model.get("vocab") if isinstance(model, dict) else None
    pairs: dict[int, str] = {}
    if isinstance(vocab, dict):
        pairs = {int(i): str(t) for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):  # unigram: [[piece, score], ...]
        pairs = {i: str(item[0]) for i, item in enumerate(vocab) if isinstance(item, list) and item}
    for added in data.get("added_tokens", []) or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            pairs[int(added["id"])] = str(added.get("content", ""))
    return fingerprint(sorted(pairs.items())) if pairs else ""


def fingerprint(pairs: Any) -> str:
    """A short digest of a vocabulary given as (id, token) pairs in id order."""
    digest = hashlib.sha256()
    count = 0
    for index, token in pairs:
        digest.update(f"{index}\x00{token}\x01".encode("utf-8", errors="replace"))
        count += 1
    return f"{count}:{digest.hexdigest()[:16]}"


# -- memory -----------------------------------------------------------------------------------------


def memory_needs(facts: Facts) -> dict[str, int]:
    """Bytes the model takes in each CPU mode: its linear weights as the mode stores them (the output head
    is a linear layer of its own in every mode, tied or not), the embedding in float32, the KV cache of one
    ``KV_CONTEXT``-token conversation in float32, and the runtime.  {} when the parameter count is unknown."""
    if facts.parameters <= 0:
        return {}
    embed = facts.embedding_parameters
    linear = max(facts.parameters - embed - (0 if facts.tied else embed), 0) + embed  # + the head
    kv = kv_bytes(facts.layers, facts.kv_width, min(KV_CONTEXT, facts.context or KV_CONTEXT))
    needs = {mode: int(4 * embed + per * linear + kv + RUNTIME_BYTES) for mode, per in MODE_BYTES.items()}
    if facts.format == "gguf" and facts.quant in FOUR_BIT_FILES:
        needs["q8-cpu"] = int(
            4 * embed + Q4_BYTES * (linear - embed) + MODE_BYTES["q8-cpu"] * embed + kv + RUNTIME_BYTES
        )
    if runs_as_is(facts):  # the file's blocks mapped as they are: what a load of it takes (listed first)
        needs = {AS_IS: facts.size_bytes + kv + AS_IS_RUNTIME_BYTES, **needs}
    return needs


AS_IS = "gguf"  # memory_needs' key for a GGUF file run on its own blocks


def kv_bytes(layers: int, kv_width: int, positions: int) -> int:
    """The KV cache of ``positions`` positions: keys and values, float32, ``kv_width`` wide a layer."""
    return 2 * layers * kv_width * 4 * positions


def runs_as_is(facts: Facts) -> bool:
    """Whether Brisk runs this GGUF file on its own blocks (memory-mapped, nothing converted)."""
    arch = str(facts.config.get("gguf_architecture", facts.architecture))
    return facts.format == "gguf" and arch in GGUF_AS_IS


def headline_mode(needs: dict[str, int]) -> str:
    """The mode whose memory a table shows: the file as it is where it runs so, else fp16-cpu."""
    return AS_IS if AS_IS in needs else "fp16-cpu"


def load_peak(facts: Facts) -> int:
    """Bytes loading takes at its peak: a GGUF file is read into memory and de-quantized to float32 before
    it is saved and quantized again; a folder's weights are read in float32."""
    if runs_as_is(facts):
        return facts.size_bytes + AS_IS_RUNTIME_BYTES  # mapped, not read into memory or converted
    if facts.parameters <= 0:
        return 0
    peak = 4 * facts.parameters + RUNTIME_BYTES
    return peak + (facts.size_bytes if facts.format == "gguf" else 0)


def available_memory() -> int:
    """Bytes of memory this machine has free for a new process (MemAvailable on Linux); 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


# -- Ollama -----------------------------------------------------------------------------------------

OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_MANIFEST_BYTES = 1 << 20  # Ollama's manifests are a few hundred bytes; a larger file is not one


@dataclass(frozen=True)
class OllamaModel:
    """One manifest of Ollama's models folder: its ``model:tag`` name and the GGUF blob of its model layer."""

    name: str  # "llama3.2:1b" for the default registry's library, else "host/namespace/model:tag"
    manifest: Path
    blob: Path | None  # None when the manifest cannot be read or names no model layer
    problem: str = ""  # why it cannot be loaded ("" when the blob is there)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a link to a place this user may not look (EACCES): not a manifest
        return False


def ollama_models(root: Path) -> Iterator[OllamaModel]:
    """The models of Ollama's folder ``root`` (``manifests/<host>/<namespace>/<model>/<tag>`` pointing to
    ``blobs/sha256-<hex>``), in name order; a missing blob or a bad manifest is a model with a ``problem``."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if _is_file(p)):
        parts = manifest.relative_to(manifests).parts
        if len(parts) < 3:
            continue
        *where, model, tag = parts
        host_ns = "/".join(where)
        name = f"{model}:{tag}" if host_ns in ("registry.ollama.ai/library", "library") else f"{host_ns}/{model}:{tag}"
        try:
            if manifest.stat().st_size > OLLAMA_MANIFEST_BYTES:
                raise ValueError("too large for a manifest")
            data = json.loads(manifest.read_text(encoding="utf-8"))
            layers = [layer for layer in data.get("layers", []) if layer.get("mediaType") == OLLAMA_MODEL]
            digest = str(layers[0]["digest"]) if layers else ""
        except (OSError, ValueError, AttributeError, KeyError, TypeError, RecursionError):
            yield OllamaModel(name, manifest, None, f"Ollama's manifest for {name} cannot be read ({manifest}).")
            continue
        if not re.fullmatch(r"sha256[:-][0-9a-f]{64}", digest):
            yield OllamaModel(name, manifest, None, f"Ollama's manifest for {name} names no model layer.")
            continue
        blob = root / "blobs" / digest.replace(":", "-")
        missing = f"Ollama's manifest for {name} points to {blob.name}, which is missing; run `ollama pull {name}`."
        yield OllamaModel(name, manifest, blob, "" if blob.is_file() else missing)
