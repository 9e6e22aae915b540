"""Load-time quantization: which modes run where, and how to apply and cache them.

Modes (``MODES``):

* ``none``: weights as loaded, in the dtype chosen elsewhere (fp32/bf16/fp16).
* ``fp16-cpu``: weights stored in float16, activations and sums in float32, run by
  fbgemm's packed fp16 GEMM (``quantized::linear_dynamic_fp16``, x86 CPUs).  Every
  ``nn.Linear`` (the output head included) is converted; the weights are packed once
  at load and kept only in that form.  CPU only.
* ``int8-cpu``: weight-only int8, one scale per output channel, run by torch's
  ``aten._weight_int8pack_mm``.  CPU only.
* ``int4-cpu``: weight-only int4, asymmetric (scale and zero point) per group of
  ``INT4_GROUP`` input channels, run by ``aten._weight_int4pack_mm_for_cpu``;
  the output head stays int8 (see :func:`quantize_cpu`).  CPU only.
* ``bnb-int8`` / ``bnb-nf4`` / ``bnb-fp4``: bitsandbytes LLM.int8 and 4-bit,
  applied by transformers' ``BitsAndBytesConfig`` while the safetensors load
  (transformers keeps ``lm_head`` unquantized).  CUDA, and CPU with
  bitsandbytes >= 0.48.  On CPUs with AVX512-BF16, bitsandbytes 0.50 wants a
  hub kernel (``kernels`` package, network) for fast 4-bit and otherwise uses
  its slower built-in one, which is what Brisk runs.

Contract:

* :func:`availability` maps every mode to ``None`` (usable on that device) or a
  reason a user can read.  It runs each kernel once on tiny tensors, so it is
  exact for this machine; results are cached per device.
* :func:`require` raises :class:`QuantUnavailable` for a mode that cannot run
  and ``ValueError`` for an unknown mode name.  Nothing falls back silently.
* :func:`quantize_cpu` replaces every ``nn.Linear`` (``lm_head`` included) by
  :class:`Int8Linear` / :class:`Int4Linear`, in place.  A tied ``lm_head`` gets
  its own quantized copy; the embedding it shared stays as it was.  A layer
  whose shape the kernel cannot take is left as it is and listed in
  ``model.brisk_quant["skipped"]``.
* The int kernels run on bf16 activations (their fp32 paths measured 10-30x
  slower here); the layers cast their input to bf16 and the result back.  They
  are GEMV kernels: for more than ``GEMV_ROWS`` rows (a prefill chunk) an int8
  layer dequantizes to bf16 and runs a GEMM instead; int4 has no such path (its
  packed layout is private to the kernel), so int4 prefill is slower than bf16.
* :func:`load_quantized_model` is the one call a loader needs: it returns a
  quantized model from the cache next to the unquantized weights, or quantizes
  and saves it there first.  :func:`save_quantized` / :func:`load_quantized` are
  the int-cpu half of that cache (packed weights in safetensors, keyed by
  module name); bnb models use transformers' ``save_pretrained``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.paths import cache_dir

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig

MODES: tuple[str, ...] = ("none", "fp16-cpu", "int8-cpu", "int4-cpu", "bnb-int8", "bnb-nf4", "bnb-fp4")
BNB_MODES = ("bnb-int8", "bnb-nf4", "bnb-fp4")
INT_MODES = ("int8-cpu", "int4-cpu")
CPU_MODES = ("fp16-cpu", *INT_MODES)  # torch's own CPU kernels: quantized by quantize_cpu, cached by save_quantized
# Next-token agreement on the bundled model (int4 head): 0.868 at group 32, 0.687 at 64; 128
# does not divide its width (576).  Its GGUF weights are Q4_1, groups of 32: int4/32 keeps them.
INT4_GROUP = 32
ACT_DTYPE = torch.bfloat16  # the int kernels' fast path
# Above this many rows an int8 layer dequantizes to bf16 and runs a GEMM: at 200 rows the
# GEMV kernel took 4.6 ms for a 1536x576 layer, dequantize + bf16 linear 0.9 ms (1 thread).
GEMV_ROWS = 32
FORMAT = 1  # bump when the saved layout changes; old caches are then rebuilt
BNB_MIN_CPU = (0, 48)


class QuantUnavailable(Exception):
    """``mode`` cannot run here; ``reason`` says why, for the user."""

    def __init__(self, mode: str, reason: str) -> None:
        super().__init__(f"Quantization {mode!r} is not available: {reason}")
        self.mode = mode
        self.reason = reason


# -- what can run where ----------------------------------------------------------------------


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"Unknown quantization mode {mode!r}; choose one of: {', '.join(MODES)}.")


def require(mode: str, device: torch.device) -> None:
    """Raise ``QuantUnavailable`` unless ``mode`` can run on ``device``."""
    check_mode(mode)
    reason = _reason(mode, str(torch.device(device)))  # only this mode: importing bitsandbytes takes seconds
    if reason is not None:
        raise QuantUnavailable(mode, reason)


def availability(device: torch.device) -> dict[str, str | None]:
    """mode -> None if it can run on ``device``, else why not (cached per device)."""
    return dict(_availability(str(torch.device(device))))


@functools.cache
def _availability(device_name: str) -> tuple[tuple[str, str | None], ...]:
    return tuple((mode, _reason(mode, device_name)) for mode in MODES)


@functools.cache
def _reason(mode: str, device_name: str) -> str | None:
    device = torch.device(device_name)
    if mode in CPU_MODES:
        return _int_reason(mode, device)
    if mode in BNB_MODES:
        return _bnb_reason(mode, device)
    return None


def _int_reason(mode: str, device: torch.device) -> str | None:
    if device.type != "cpu":
        if mode == "fp16-cpu":
            return "fp16-cpu uses fbgemm's CPU kernel and runs only on the CPU; on a GPU choose dtype float16 instead."
        return f"{mode} uses torch's CPU kernels and runs only on the CPU; on a GPU choose bnb-int8 or bnb-nf4."
    if mode == "fp16-cpu" and "fbgemm" not in torch.backends.quantized.supported_engines:
        return "fp16-cpu runs on fbgemm, which this torch build does not have (torch ships it for x86 CPUs only)."
    makers: dict[str, Callable[[nn.Linear], nn.Module]] = {
        "fp16-cpu": Fp16Linear.from_linear,
        "int8-cpu": Int8Linear.from_linear,
        "int4-cpu": Int4Linear.from_linear,
    }
    try:
        err = _probe(makers[mode], device, torch.float32 if mode == "fp16-cpu" else ACT_DTYPE)
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"this torch build ({torch.__version__}) cannot run the {mode} kernel ({first}). "
            "Upgrade torch or choose another mode."
        )
    if not err < (0.01 if mode == "fp16-cpu" else 0.3):
        return f"torch {torch.__version__}'s kernel for {mode} gives wrong results here (relative error {err:.2f})."
    return None


def _probe(make: Callable[[nn.Linear], nn.Module], device: torch.device, dtype: torch.dtype = ACT_DTYPE) -> float:
    """Relative error of ``make(linear)`` against a random 64x64 linear; leaves the global RNG as it was."""
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(0)
        linear = nn.Linear(64, 64, bias=False)
        x = torch.randn(2, 64)
        y = make(linear).to(device)(x.to(device, dtype)).float().cpu()
        return float((y - linear(x)).norm() / linear(x).norm())


def _bnb_reason(mode: str, device: torch.device) -> str | None:
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed; install it with `pip install bitsandbytes` (0.48 or newer for the CPU)."
    if importlib.util.find_spec("accelerate") is None:
        return "transformers needs the accelerate package for bitsandbytes; install it with `pip install accelerate`."
    if device.type not in ("cpu", "cuda"):
        return f"bitsandbytes is not supported on {device.type} devices in Brisk; use the CPU or a CUDA GPU."
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU is available to this torch build; choose the CPU."
    try:
        bnb = _import_bnb()
    except Exception as exc:  # a broken native library raises many kinds of errors
        return f"bitsandbytes is installed but does not import ({type(exc).__name__}: {exc}). Reinstall it."
    version = tuple(int(p) for p in bnb.__version__.split(".")[:2] if p.isdigit())
    if device.type == "cpu" and version < BNB_MIN_CPU:
        return f"bitsandbytes {bnb.__version__} has no CPU backend; upgrade to 0.48 or newer."
    try:
        _bnb_probe(bnb, mode, device)
    except Exception as exc:  # the probe is the only reliable test of a native backend
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"bitsandbytes {bnb.__version__} cannot run {mode} on {device.type} ({first})."
    return None


def _import_bnb() -> Any:
    # On CPUs with AVX512-BF16 bitsandbytes tries to fetch a hub kernel at import and logs a
    # warning when it cannot; it then uses its built-in kernel, which is what we measure.
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import bitsandbytes

        return bitsandbytes
    finally:
        logger.setLevel(level)


def _bnb_probe(bnb: Any, mode: str, device: torch.device) -> None:
    def make(linear: nn.Linear) -> nn.Module:
        if mode == "bnb-int8":
            layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
            layer.load_state_dict(linear.state_dict())
            return layer
        layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_type=mode[4:])
        layer.weight = bnb.nn.Params4bit(linear.weight.data.clone(), requires_grad=False, quant_type=mode[4:])
        return layer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        err = _probe(make, device, torch.float16 if mode == "bnb-int8" else torch.bfloat16)
    if not err < 0.3:
        raise RuntimeError(f"wrong results (relative error {err:.2f})")


def bnb_config(mode: str, compute_dtype: torch.dtype) -> BitsAndBytesConfig:
    """The ``quantization_config`` for ``from_pretrained`` in a bnb mode."""
    check_mode(mode)
    if mode not in BNB_MODES:
        raise ValueError(f"{mode!r} is not a bitsandbytes mode; bnb_config takes one of {', '.join(BNB_MODES)}.")
    from transformers import BitsAndBytesConfig

    if mode == "bnb-int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode[4:], bnb_4bit_compute_dtype=compute_dtype)


# -- torch's weight-only CPU kernels -----------------------------------------------------------


class Fp16Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` rounded to float16 and packed for fbgemm; x, y and sums in float32.

    The packed weight is the only copy (an opaque object, not a tensor): the state dict
    unpacks it to a float16 ``weight16`` and loading packs that again, so a saved copy
    is plain safetensors.  ``packed_nbytes`` is what it holds, for :func:`weight_bytes`.
    Layers that take the same input can share one packed matrix (:class:`Fp16Group`,
    made by :func:`fuse_fp16`); each then holds ``group`` and its ``index`` in it.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.has_bias = in_features, out_features, bias
        self.packed: Any = None  # torch.ScriptObject once weights are set (None while in a group)
        self.group: Fp16Group | None = None
        self.index = 0
        self.pending: tuple[torch.Tensor, torch.Tensor | None] | None = None  # loaded, not packed yet

    @classmethod
    def from_linear(cls, linear: nn.Linear, pack: bool = True) -> Fp16Linear:
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        bias = None if linear.bias is None else linear.bias.detach()
        layer.set_weights(linear.weight.detach().to(torch.float16), bias, pack=pack)
        return layer

    def set_weights(self, weight16: torch.Tensor, bias: torch.Tensor | None, pack: bool = True) -> None:
        """Take new weights; packed now, or (``pack=False``) at :meth:`pack` or the first call."""
        if tuple(weight16.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight16 is {tuple(weight16.shape)}, not {(self.out_features, self.in_features)}")
        if (bias is not None) != self.has_bias:
            raise ValueError("a bias was given to a layer without one, or none to a layer with one")
        global generation
        generation += 1
        if self.group is not None:  # its own weights now; the group keeps serving the others
            self.group.leave(self.index)
        self.packed, self.group = None, None
        self.pending = (weight16.to(torch.float16), None if bias is None else bias.float())
        if pack:
            self.pack()

    def pack(self) -> None:
        if self.pending is not None:
            weight16, bias = self.pending
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight16.float().contiguous(), bias)
            self.pending = None

    @property
    def has_weights(self) -> bool:
        return self.packed is not None or self.group is not None or self.pending is not None

    @property
    def packed_nbytes(self) -> int:
        return self.out_features * self.in_features * 2 + (self.out_features * 4 if self.has_bias else 0)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight as float16, bias as float32 or None), unpacked."""
        if self.group is not None:
            return self.group.part_weights(self.index)
        if self.pending is not None:
            return self.pending
        if self.packed is None:
            raise RuntimeError("Fp16Linear has no weights yet (load a state dict first)")
        weight, bias = torch.ops.quantized.linear_unpack_fp16(self.packed)
        return weight.to(torch.float16), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.group.output(x, self.index)
        self.pack()
        if self.packed is None:
            raise RuntimeError("Fp16Linear has no weights yet (load a state dict first)")
        y = torch.ops.quantized.linear_dynamic_fp16(x.float(), self.packed)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        if self.has_weights:
            weight, bias = self.weights()
            destination[prefix + "weight16"] = weight
            if self.has_bias:
                destination[prefix + "bias"] = bias

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        keys = [prefix + "weight16"] + ([prefix + "bias"] if self.has_bias else [])
        missing = [k for k in keys if k not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        try:
            # packed by fuse_fp16 (several at once) or at the first call
            self.set_weights(state_dict[keys[0]], state_dict[keys[1]] if self.has_bias else None, pack=False)
        except (ValueError, RuntimeError) as exc:
            error_msgs.append(f"{prefix}: {exc}")

    def extra_repr(self) -> str:
        fused = f", fused={self.index}/{len(self.group.sizes)}" if self.group is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}{fused}"


class Fp16Group:
    """Several :class:`Fp16Linear` that take the same input (q, k, v; gate, up) as one packed matrix.

    One wide matmul is cheaper than three narrow ones at batch 1 (measured on the bundled
    model's shapes: 41 us for q, k, v together against 81 us apart).  Each part still
    works as a layer of its own: the first part called with an input computes every
    part's rows and keeps them until the other parts have taken theirs for the same
    input (the same tensor object), so transformers' forward, which calls q, k and v
    one by one, does the work once too.  The parts' weights live only here.
    """

    def __init__(self, parts: list[Fp16Linear]) -> None:
        if len({(p.in_features, p.has_bias) for p in parts}) != 1 or not all(p.has_weights for p in parts):
            raise ValueError("an Fp16Group takes layers with weights, the same input width and all or no biases")
        unpacked = [p.weights() for p in parts]
        bias = torch.cat([b for _, b in unpacked if b is not None]) if parts[0].has_bias else None
        weight = torch.cat([w.float() for w, _ in unpacked])
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        self.sizes = [p.out_features for p in parts]
        self.starts = [sum(self.sizes[:i]) for i in range(len(parts))]
        self._memo: tuple[torch.Tensor, torch.Tensor, set[int]] | None = None
        self.active = set(range(len(parts)))  # parts still served from here (see leave)
        global generation
        generation += 1
        for i, part in enumerate(parts):
            part.packed, part.pending, part.group, part.index = None, None, self, i

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        memo = self._memo
        if memo is None or memo[0] is not x or index in memo[2]:
            y = torch.ops.quantized.linear_dynamic_fp16(x.float(), self.packed)
            memo = (x, y if x.dtype == torch.float32 else y.to(x.dtype), set())
        memo[2].add(index)
        self._memo = None if memo[2] >= self.active else memo  # every part served: let it go
        start = self.starts[index]
        return memo[1][..., start : start + self.sizes[index]]

    def leave(self, index: int) -> None:
        """Part ``index`` took weights of its own: stop keeping outputs for it (its rows stay, unused)."""
        self.active.discard(index)
        self._memo = None

    def part_weights(self, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight, bias = torch.ops.quantized.linear_unpack_fp16(self.packed)
        rows = slice(self.starts[index], self.starts[index] + self.sizes[index])
        return weight[rows].to(torch.float16), None if bias is None else bias[rows].clone()


FP16_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def fuse_fp16(model: nn.Module) -> int:
    """Group each decoder layer's q/k/v and gate/up :class:`Fp16Linear` (see :class:`Fp16Group`)
    and pack every layer still waiting to be; return how many groups.

    Packing is fbgemm's and single-threaded (about 2 s for the bundled model), so the
    layers are packed on a pool of short-lived threads, one per torch thread (1.7x on 2).
    """
    from concurrent.futures import ThreadPoolExecutor

    jobs: list[Callable[[], object]] = []
    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers if isinstance(layers, nn.ModuleList) else ():
        for owner_name, names in FP16_GROUPS:
            owner = getattr(layer, owner_name, None)
            parts = [p for p in (getattr(owner, name, None) for name in names) if isinstance(p, Fp16Linear)]
            if len(parts) == len(names) and all(p.group is None and p.has_weights for p in parts):
                jobs.append(functools.partial(_try_group, parts))
    grouped = len(jobs)
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        results = list(pool.map(lambda job: job(), jobs))
        singles = [m for m in model.modules() if isinstance(m, Fp16Linear) and m.pending is not None]
        list(pool.map(Fp16Linear.pack, singles))
    return grouped - results.count(None)


def _try_group(parts: list[Fp16Linear]) -> Fp16Group | None:
    try:
        return Fp16Group(parts)
    except ValueError:
        return None


class Int8Linear(nn.Module):
    """``y = x @ (q * s).T + b``: int8 ``q`` [out, in], one scale per output channel."""

    qweight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=ACT_DTYPE))
        self.register_buffer("bias", torch.zeros(out_features, dtype=ACT_DTYPE) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach().float()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
        layer.qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        layer.scales = scales.to(ACT_DTYPE)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().to(ACT_DTYPE).clone()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(ACT_DTYPE).contiguous()
        if flat.shape[0] > GEMV_ROWS:  # prefill: a bf16 copy and a GEMM beat the GEMV kernel
            y = nn.functional.linear(flat, self.qweight.to(ACT_DTYPE) * self.scales[:, None], self.bias)
        else:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int4Linear(nn.Module):
    """Group-wise asymmetric int4: ``w = (q - 8) * scale + zero`` per group of ``group_size`` inputs.

    ``qweight`` is in the kernel's packed layout (rows padded to a multiple of 16, as the
    kernel needs); that layout can differ between torch builds and CPU instruction sets,
    so saved copies carry :func:`int4_layout` and are rebuilt when it changes.
    ``scales_zeros`` is [in / group_size, padded out, 2].
    """

    qweight: torch.Tensor
    scales_zeros: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int = INT4_GROUP) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        rows = -(-out_features // 16) * 16
        self.register_buffer("qweight", torch.zeros(rows, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales_zeros", torch.zeros(in_features // group_size, rows, 2, dtype=ACT_DTYPE))
        self.register_buffer("bias", torch.zeros(out_features, dtype=ACT_DTYPE) if bias else None)

    @staticmethod
    def fits(linear: nn.Linear, group_size: int = INT4_GROUP) -> bool:
        return linear.in_features % group_size == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = INT4_GROUP) -> Int4Linear:
        n, k = linear.out_features, linear.in_features
        layer = cls(k, n, linear.bias is not None, group_size)
        rows = layer.qweight.shape[0]
        w = torch.zeros(rows, k)
        w[:n] = linear.weight.detach().float()
        groups = w.reshape(-1, group_size)
        lo, hi = groups.amin(dim=1, keepdim=True), groups.amax(dim=1, keepdim=True)
        scales = ((hi - lo) / 15).clamp(min=1e-6)
        q = ((groups - lo) / scales).round().clamp(0, 15).to(torch.int32).reshape(rows, k)
        layer.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        zeros = lo + 8 * scales
        pairs = torch.cat([scales.reshape(rows, -1, 1), zeros.reshape(rows, -1, 1)], dim=2)
        layer.scales_zeros = pairs.transpose(0, 1).contiguous().to(ACT_DTYPE)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().to(ACT_DTYPE).clone()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(ACT_DTYPE).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group_size, self.scales_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


@functools.cache
def int4_layout() -> str:
    """Fingerprint of the int4 kernel's packed layout on this torch build and CPU."""
    pattern = (torch.arange(32 * 128, dtype=torch.int32).reshape(32, 128) * 7919 // 13) % 16
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(pattern, 1)
    return hashlib.sha256(packed.numpy().tobytes()).hexdigest()[:16]


def quantize_cpu(
    model: nn.Module, mode: str, group_size: int = INT4_GROUP, head: str = "int8", pack: bool = True
) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (on the CPU) by an fp16/int8/int4 layer, in place.

    fp16-cpu layers are fused and packed (:func:`fuse_fp16`) unless ``pack=False``, which
    leaves them holding plain float16 weights (packed at their first call, or fused by a
    later ``fuse_fp16``): a copy saved before packing skips unpacking every layer again.
    In ``int4-cpu`` the output head is int8 unless ``head="int4"``: measured on the bundled
    model, an int4 head alone cost about 10 points of next-token agreement.
    """
    check_mode(mode)
    if mode not in CPU_MODES:
        raise ValueError(f"quantize_cpu takes {' or '.join(CPU_MODES)}, not {mode!r}.")
    require(mode, next(model.parameters()).device)
    head_name = _head_name(model)
    plan: dict[str, dict[str, Any]] = {}
    skipped = []
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            if type(module) is not nn.Linear:
                continue
            if mode == "fp16-cpu":
                kind = "fp16"
            elif mode == "int8-cpu" or (name == head_name and head == "int8"):
                kind = "int8"
            elif Int4Linear.fits(module, group_size):
                kind = "int4"
            else:
                skipped.append(name)
                continue
            new: nn.Module
            if kind == "fp16":
                new = Fp16Linear.from_linear(module, pack=False)
            elif kind == "int8":
                new = Int8Linear.from_linear(module)
            else:
                new = Int4Linear.from_linear(module, group_size)
            plan[name] = {"kind": kind, "in": module.in_features, "out": module.out_features}
            plan[name].update(bias=module.bias is not None, group_size=group_size)
            swap_module(model, name, new)
    if mode == "fp16-cpu" and pack:
        fuse_fp16(model)
    setattr(model, "brisk_quant", {"mode": mode, "group_size": group_size, "layers": plan, "skipped": skipped})  # noqa: B010
    return model


def _head_name(model: nn.Module) -> str:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return next((name for name, m in model.named_modules() if m is head), "") if head is not None else ""


# Bumped by every swap_module and Fp16Linear.set_weights: code that caches what a model's
# layers hold (engine.quant.scripted) knows when to look again.
generation = 0


def swap_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule called ``name`` is."""
    global generation
    generation += 1
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by weights: parameters, buffers and bitsandbytes' quantization state.

    Tensors that share storage (tied weights) count once; meta tensors count zero.
    """
    seen: set[tuple[int, int]] = set()
    total = 0

    def add(t: torch.Tensor | None) -> None:
        nonlocal total
        if t is None or t.device.type == "meta":
            return
        if t.layout != torch.strided or t.is_mkldnn:  # opaque (a packed weight): no storage to share
            total += t.numel() * t.element_size()
            return
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()

    for t in [*model.parameters(), *model.buffers()]:
        add(t)
    for module in model.modules():  # bitsandbytes keeps scales outside parameters and buffers
        if isinstance(module, Fp16Linear):
            total += module.packed_nbytes if module.has_weights else 0  # opaque packed objects, no tensors
            continue
        weight = getattr(module, "weight", None)
        add(getattr(weight, "SCB", None))
        state = getattr(weight, "quant_state", None)
        while state is not None:
            add(getattr(state, "absmax", None))
            add(getattr(state, "code", None))
            add(getattr(state, "offset", None))
            state = getattr(state, "state2", None)
    return total


# -- the cache of quantized copies ------------------------------------------------------------


def quant_dir(location: str, mode: str, dtype: torch.dtype) -> Path:
    """Where the quantized copy of ``location`` lives: beside a converted model, else in ``cache/quant``."""
    name = f"{mode}-{str(dtype).removeprefix('torch.')}"
    path = Path(location)
    cache = cache_dir().resolve()
    if path.is_dir() and path.resolve().is_relative_to(cache):
        return path / "quant" / name
    key = hashlib.sha256(str(path.resolve() if path.is_dir() else location).encode()).hexdigest()[:16]
    return cache / "quant" / key / name


def source_stamp(location: str) -> str:
    """Names, sizes and modification times of the weight files: a changed model invalidates its copies."""
    folder = Path(location)
    if not folder.is_dir():
        return location  # a hub id
    files = sorted(p for p in folder.iterdir() if p.suffix in {".safetensors", ".bin"} or p.name == "config.json")
    return "".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}|" for p in files)


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
    (folder / "quant.json").write_text(json.dumps(full, indent=1))


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
    expected = _meta(mode, dtype, source_stamp(location))
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
        (tmp / "quant.json").write_text(json.dumps(expected, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return QuantLoad(model.eval(), False, folder, time.perf_counter() - start)
