"""Which quantization modes exist, what each does, and which run on a given device.

Modes (``MODES``, the same tuple as ``engine.api.QUANT_MODES``):

* ``none``: weights as loaded, in the dtype chosen elsewhere (fp32/bf16/fp16).
* ``fp16-cpu``: weights stored in float16, activations and sums in float32, run by
  fbgemm's packed fp16 GEMM (``quantized::linear_dynamic_fp16``, x86 CPUs).  Every
  ``nn.Linear`` (the output head included) is converted; the weights are packed once
  at load and kept only in that form.  CPU only.
* ``q8-cpu``: 8-bit weights with a float32 step and minimum per group of 32 inputs
  (exact for weights from a 4-bit GGUF), the activations quantized per group to 15-bit
  integers at run time, each group's product summed exactly in int32 by the CPU's
  integer dot product (AVX-512 VNNI, else AVX2) in Brisk's native step
  (``engine.quant.native``), float32 across groups; about 1.25 bytes a weight against
  fp16-cpu's 2, and 0.75 for a layer whose groups all lie on 16 levels (a 4-bit GGUF's),
  kept in 4 bits without rounding anything.  A prompt's rows (``PROMPT_ROWS`` or more)
  multiply the weights made float32 by torch's GEMM.  Where the native step is not built
  the same arithmetic runs in torch, slowly.  Every ``nn.Linear`` whose inputs are a
  multiple of 32 (the head included) is converted.  CPU only.
* ``int8-cpu``: weight-only int8, one scale per output channel, run by torch's
  ``aten._weight_int8pack_mm``.  CPU only.
* ``int4-cpu``: weight-only int4, asymmetric (scale and zero point) per group of
  ``INT4_GROUP`` input channels, run by ``aten._weight_int4pack_mm_for_cpu``;
  the output head stays int8.  CPU only.  Its accuracy depends on the kernel torch
  picks for the CPU (see ``CAVEATS``); it is never a default.
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
* :func:`descriptions` maps every mode to one line for a tooltip, with its caveat
  (:func:`caveat`) where it has one; ``NEVER_DEFAULT`` lists modes that an automatic
  choice must not pick.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.api import QUANT_MODES
from engine.quant.kernels import ACT_DTYPE, Fp16Linear, Int4Linear, Int8Linear, Q8Linear

MODES: tuple[str, ...] = QUANT_MODES
BNB_MODES = ("bnb-int8", "bnb-nf4", "bnb-fp4")
INT_MODES = ("int8-cpu", "int4-cpu")
CPU_MODES = (
    "fp16-cpu",
    "q8-cpu",
    *INT_MODES,
)  # torch's own CPU kernels: quantized by quantize_cpu, cached by save_quantized
BNB_MIN_CPU = (0, 48)

DESCRIPTIONS = {
    "none": "Weights as loaded, in the dtype chosen by Precision.",
    "fp16-cpu": "Float16 weights, float32 arithmetic (fbgemm, x86 CPUs): half of float32's memory, "
    "nearly the same output (99 % next-token agreement on the bundled model).",
    "q8-cpu": "8-bit weights with a step and minimum per group of 32 (exact for weights from a 4-bit GGUF), "
    "15-bit activations, Brisk's native integer kernel (AVX-512 VNNI or AVX2): about 1.25 bytes a weight, "
    "0.75 where a layer's weights lie on 16 levels (a 4-bit GGUF's, kept in 4 bits), against fp16-cpu's 2.",
    "int8-cpu": "8-bit weights, one scale per output row (torch's CPU kernel), bfloat16 arithmetic.",
    "int4-cpu": "4-bit weights in groups of 32 (torch's CPU kernel); the output head stays 8-bit.",
    "bnb-int8": "bitsandbytes LLM.int8 (CUDA, or the CPU with bitsandbytes 0.48 or newer).",
    "bnb-nf4": "bitsandbytes 4-bit NormalFloat (CUDA, or the CPU with bitsandbytes 0.48 or newer).",
    "bnb-fp4": "bitsandbytes 4-bit float (CUDA, or the CPU with bitsandbytes 0.48 or newer).",
}
# Seen on an AVX-512 Xeon (issue 12): int4-cpu answered "L'Étoile, la Mar" where the same
# weights on an AVX2 CPU answer "Paris"; torch picks a different int4 kernel per CPU.
CAVEATS = {
    "int4-cpu": "Its accuracy depends on the int4 kernel torch picks for this CPU (answers can differ between "
    "CPUs); never chosen by default. Measure it here with `brisk bench quant`.",
}
NEVER_DEFAULT = frozenset(CAVEATS)  # an automatic choice of mode never picks these


class QuantUnavailable(Exception):
    """``mode`` cannot run here; ``reason`` says why, for the user."""

    def __init__(self, mode: str, reason: str) -> None:
        super().__init__(f"Quantization {mode!r} is not available: {reason}")
        self.mode = mode
        self.reason = reason


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"Unknown quantization mode {mode!r}; choose one of: {', '.join(MODES)}.")


def caveat(mode: str) -> str | None:
    """What a user should know before choosing ``mode`` even where it runs; None when nothing."""
    check_mode(mode)
    return CAVEATS.get(mode)


def descriptions() -> dict[str, str]:
    """mode -> one line saying what it does (and its caveat, if any), for a tooltip or ``brisk doctor``."""
    return {mode: " ".join(filter(None, (DESCRIPTIONS[mode], CAVEATS.get(mode)))) for mode in MODES}


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


def clear_cache() -> None:
    """Forget what was found (tests that change what is installed call this)."""
    _availability.cache_clear()
    _reason.cache_clear()


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
        "q8-cpu": Q8Linear.from_linear,
        "int8-cpu": Int8Linear.from_linear,
        "int4-cpu": Int4Linear.from_linear,
    }
    try:
        err = _probe(makers[mode], device, torch.float32 if mode in ("fp16-cpu", "q8-cpu") else ACT_DTYPE)
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"this torch build ({torch.__version__}) cannot run the {mode} kernel ({first}). "
            "Upgrade torch or choose another mode."
        )
    if not err < {"fp16-cpu": 0.01, "q8-cpu": 0.02}.get(mode, 0.3):
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
        bnb = import_bnb()
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


def import_bnb() -> Any:
    """The bitsandbytes module (raises whatever its import raises)."""
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
