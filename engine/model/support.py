"""Which models run on Brisk's fast paths, decided from a model's config alone.

``support(config)`` takes a model's ``config.json`` as a dict (for a loaded model,
``model.config.to_dict()``) and says whether the lean forward (``engine.model.fastpath``)
and the native decode step (``engine.quant.native``, fp16-cpu and q8-cpu) take it, and
if not, why, in a sentence a user can read.  ``support_for_gguf(arch)`` does the same
for a GGUF file's ``general.architecture``.  ``FastForward.for_model`` decides by
:func:`layout`, the same rules, so ``support()`` never says yes where the fast path
declines.  The model library calls this on folders on disk, so this module imports
only the standard library: no torch, no transformers.

A config the fast path takes is one of these decoder layouts:

* ``llama`` (llama, mistral, qwen2): ``x + attn(norm(x))``, ``x + down(silu(gate) * up)(norm(x))``;
* ``qwen3``: the same with an RMS norm on each query and key head before the rotary embedding;
* ``phi3``: the same with q/k/v and gate/up fused in one projection each;
* ``gemma2`` and ``gemma3`` (text): a scaled embedding, ``(1 + w)`` norms, GELU (tanh),
  norms after attention and after the MLP too, ``query_pre_attn_scalar``, soft-capped
  attention and final logits (Gemma 2), q/k norms and a local rotary base for the
  sliding layers (Gemma 3).

Any layer may attend through a sliding window (only the last ``sliding_window``
positions).  Missing keys take the value transformers would give them.

The native decode step runs every one of these layouts, windows, soft-capping and
Gemma 3's two rotary bases included; it declines only Phi-3 with a rotary embedding
over part of each head (that runs on the eager fast path).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SLOWER = "this model runs on transformers' forward (slower)"
EAGER = "its decode steps run on the eager fast path"
# The model types taken, with the layout each one runs and a name for messages.
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "Llama"),
    "mistral": ("llama", "Mistral"),
    "qwen2": ("llama", "Qwen2"),
    "qwen3": ("qwen3", "Qwen3"),
    "phi3": ("phi3", "Phi-3"),
    "gemma2": ("gemma2", "Gemma 2"),
    "gemma3_text": ("gemma3", "Gemma 3"),
}
# GGUF architectures whose files run on their own blocks (engine.model.gguf_model): the value says whether
# llama.cpp's converter permuted their query and key rows (put back at load)
GGUF_AS_IS: dict[str, bool] = {"llama": True, "mistral": True, "qwen2": False, "qwen3": False}
# Layouts whose decode steps the native step takes (fp16-cpu, q8-cpu): all of them.
NATIVE_LAYOUTS = ("llama", "qwen3", "phi3", "gemma2", "gemma3")
# Rotary types whose cos/sin of a position do not depend on the sequence's length.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# A GGUF file's general.architecture -> the model_type it corresponds to (Mistral GGUFs say "llama").
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
}
# Some model types declined, named so the message says what the model is.
OTHER_NAMES = {
    "gemma": "Gemma (1) models",
    "gemma3": "Gemma 3 models with a vision tower",
    "mixtral": "Mixtral models",
    "qwen2_moe": "Qwen2-MoE models",
    "qwen3_moe": "Qwen3-MoE models",
    "phi": "Phi-2 models",
    "llama4": "Llama 4 models",
}


@dataclass(frozen=True)
class Support:
    """What runs fast for a model: the lean forward, the native decode step, and why not ("" when both)."""

    fast_path: bool
    native_step: bool
    reason: str

    @property
    def sentence(self) -> str:
        """The paths that run the model, or why the fast ones do not (``ModelInfo.fast_path``, ``brisk doctor``)."""
        if self.fast_path and self.native_step:
            return "lean forward and native decode step"
        return f"lean forward; {self.reason}" if self.fast_path else self.reason


@dataclass(frozen=True)
class Layout:
    """What the fast path runs for a config: the layout and each layer's sliding window (None: all positions)."""

    family: str
    windows: tuple[int | None, ...]
    softcap: float | None  # Gemma 2's attention logit soft-capping
    final_softcap: float | None  # soft-capping of the output logits
    partial_rotary: bool  # Phi-3 with a rotary embedding over part of each head


def support(config: Mapping[str, Any]) -> Support:
    """Whether the fast path and the native step take a model with this ``config.json`` (a dict)."""
    return layout(config)[1]


def support_for_gguf(arch: str) -> Support:
    """As :func:`support`, for a GGUF file's ``general.architecture`` (with that layout's usual settings)."""
    model_type = GGUF_ARCHITECTURES.get(arch)
    if model_type is None:
        return Support(False, False, f"GGUF models of architecture {arch!r} are not on the fast path yet; {SLOWER}")
    return support({"model_type": model_type})


def layout(config: Mapping[str, Any]) -> tuple[Layout | None, Support]:
    """The layout the fast path runs for ``config`` (None when it declines) and what :func:`support` says."""
    model_type = str(config.get("model_type") or "")
    if model_type not in FAMILIES:
        if not model_type:
            return None, Support(False, False, f"A config without a model_type is not on the fast path; {SLOWER}")
        name = OTHER_NAMES.get(model_type, f"Models of type {model_type!r}")
        return None, Support(False, False, f"{name} are not on the fast path yet; {SLOWER}")
    family, name = FAMILIES[model_type]
    try:
        found = _layout(config, family)
    except _Declined as why:
        return None, Support(False, False, f"{name} with {why} is not on the fast path yet; {SLOWER}")
    if family not in NATIVE_LAYOUTS:
        native = f"{name}'s layout is not in the native decode step yet; {EAGER}"
    elif found.partial_rotary:
        native = f"{name} with a rotary embedding over part of each head is not in the native decode step yet; {EAGER}"
    else:
        native = ""
    return found, Support(True, not native, native)


class _Declined(Exception):
    """What in a config the fast path does not take (the message completes a sentence)."""


def _layout(config: Mapping[str, Any], family: str) -> Layout:
    gemma = family in ("gemma2", "gemma3")
    act = (config.get("hidden_activation") or config.get("hidden_act")) if gemma else config.get("hidden_act")
    act = act or ("gelu_pytorch_tanh" if gemma else "silu")
    if act != ("gelu_pytorch_tanh" if gemma else "silu"):
        raise _Declined(f"the activation {act!r}")
    if config.get("pretraining_tp", 1) not in (1, None):
        raise _Declined("pretraining_tp above 1 (split projections)")
    if config.get("use_bidirectional_attention"):
        raise _Declined("bidirectional attention (an embedding model)")
    softcap = _number(config, "attn_logit_softcapping", 50.0 if family == "gemma2" else None)
    implementation = config.get("_attn_implementation") or config.get("attn_implementation")
    allowed = ("sdpa", "eager") if gemma else ("sdpa",)
    if implementation is not None and implementation not in allowed:
        raise _Declined(f"the attention implementation {implementation!r}")
    if softcap is not None and family != "gemma2":
        raise _Declined("attention logit soft-capping")
    partial = _rope(config, family)
    return Layout(
        family=family,
        windows=_windows(config, family),
        softcap=softcap,
        final_softcap=_number(config, "final_logit_softcapping", 30.0 if family == "gemma2" else None),
        partial_rotary=partial,
    )


def _number(config: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = config.get(key, default)
    return float(value) if value else None


def _rope(config: Mapping[str, Any], family: str) -> bool:
    """Check the rotary embedding's settings; True when it covers only part of each head (Phi-3)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise _Declined("a rotary embedding described as something other than a mapping")
    nested = [p for p in params.values() if isinstance(p, Mapping)]  # Gemma 3: one set per layer type
    factors = []
    for p in nested or [params]:
        kind = p.get("rope_type") or p.get("type") or "default"
        if kind not in STATIC_ROPE:
            raise _Declined(f"the rotary scaling {kind!r} (which changes with the sequence's length)")
        factors.append(p.get("partial_rotary_factor"))
    factors.append(config.get("partial_rotary_factor"))
    partial = any(f is not None and float(f) != 1.0 for f in factors)
    if partial and family != "phi3":
        raise _Declined("a rotary embedding over part of each head")
    return partial


def _windows(config: Mapping[str, Any], family: str) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: it attends to every position), as transformers reads the config."""
    layers = int(config.get("num_hidden_layers") or 1)
    default_window = {"gemma2": 4096, "gemma3": 4096}.get(family)
    if config.get("model_type") == "mistral":
        default_window = 4096
    window = config.get("sliding_window", default_window)
    if config.get("model_type") == "llama" or (
        config.get("model_type") in ("qwen2", "qwen3") and not config.get("use_sliding_window", False)
    ):
        window = None  # Llama has no window; Qwen's is off unless use_sliding_window
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise _Declined(f"a sliding window of {window!r}")
    types = config.get("layer_types")
    if family in ("llama", "phi3") and config.get("model_type") != "qwen2":
        if types and any(t != "full_attention" for t in types):
            raise _Declined("layers of other attention types")
        return tuple([window] * layers)  # Mistral and Phi-3: every layer windowed, or none
    if not types:
        if family == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        elif family == "gemma3":
            pattern = int(config.get("sliding_window_pattern") or 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        else:  # Qwen2 and Qwen3: sliding from max_window_layers on, when a window is used
            first = int(config.get("max_window_layers", 28))
            types = ["sliding_attention" if window and i >= first else "full_attention" for i in range(layers)]
    unknown = sorted({str(t) for t in types} - {"full_attention", "sliding_attention"})
    if unknown:
        raise _Declined(f"layers of attention type {', '.join(unknown)}")
    return tuple(window if t == "sliding_attention" else None for t in types)
