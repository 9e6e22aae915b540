"""Load-time quantization, as one package of four jobs (each module states its contract):

* :mod:`engine.quant.modes`: which modes exist (``MODES`` is ``engine.api.QUANT_MODES``),
  what each does (:func:`descriptions`, :func:`caveat`) and which run on a device
  (:func:`availability`, :func:`require`, :class:`QuantUnavailable`).
* :mod:`engine.quant.kernels`: the layers of torch's fp16/int8/int4 CPU kernels and Brisk's q8 layer.
* :mod:`engine.quant.apply`: putting them into a model (:func:`quantize_cpu`,
  :func:`fuse_fp16`, :func:`swap_module`) and :func:`weight_bytes`.
* :mod:`engine.quant.cache`: quantized copies on disk (:func:`load_quantized_model`).

:mod:`engine.quant.decode_step` and :mod:`engine.quant.native` are the native decode step
for fp16-cpu and q8-cpu models (C++, built on this machine), which the fast forward
(``engine.model.fastpath``) runs decode tokens through.
This package imports nothing above it (no ``engine.model``, ``engine.runtime``).
"""

from __future__ import annotations

from engine.quant.apply import (
    FP16_GROUPS,
    bnb_config,
    fuse_fp16,
    layout_version,
    mark_changed,
    quantize_cpu,
    swap_module,
    weight_bytes,
)
from engine.quant.cache import FORMAT, QuantLoad, load_quantized, load_quantized_model, quant_dir, save_quantized
from engine.quant.kernels import (
    ACT_DTYPE,
    GEMV_ROWS,
    INT4_GROUP,
    Fp16Group,
    Fp16Linear,
    Int4Linear,
    Int8Linear,
    Q8Linear,
    int4_layout,
)
from engine.quant.modes import (
    BNB_MIN_CPU,
    BNB_MODES,
    CPU_MODES,
    INT_MODES,
    MODES,
    NEVER_DEFAULT,
    QuantUnavailable,
    availability,
    caveat,
    check_mode,
    descriptions,
    import_bnb,
    require,
)

__all__ = [
    "ACT_DTYPE",
    "BNB_MIN_CPU",
    "BNB_MODES",
    "CPU_MODES",
    "FORMAT",
    "FP16_GROUPS",
    "GEMV_ROWS",
    "INT4_GROUP",
    "INT_MODES",
    "MODES",
    "NEVER_DEFAULT",
    "Fp16Group",
    "Fp16Linear",
    "Int4Linear",
    "Int8Linear",
    "Q8Linear",
    "QuantLoad",
    "QuantUnavailable",
    "availability",
    "bnb_config",
    "caveat",
    "check_mode",
    "descriptions",
    "fuse_fp16",
    "import_bnb",
    "int4_layout",
    "layout_version",
    "load_quantized",
    "load_quantized_model",
    "mark_changed",
    "quant_dir",
    "quantize_cpu",
    "require",
    "save_quantized",
    "swap_module",
    "weight_bytes",
]
