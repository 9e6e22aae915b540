"""Facts about the machine and the loaded model as a person reads them (no Qt).

:func:`model_facts` turns a :class:`~engine.api.Loaded` event into an ordered
``{label: text}`` dict: every :class:`~engine.api.ModelInfo` field has a human
label (:data:`LABELS`) and a format (sizes in MB/GB, times in seconds, the
dtype probe as a sentence, yes/no); fields that say nothing (no draft model,
no quantization cache) are left out.  :func:`machine_facts` does the same for
``engine.doctor``'s report, whose keys are labelled when known and otherwise
shown as written.  :func:`precision_text` is what the status bar says about
the weights: the quantization mode when there is one, else the dtype; for a
model on a remote server (``Loaded.device == "remote"``) it names the server
(``ModelInfo.endpoint``) instead.  The dtype probe's sentence ends with its
``reason`` for the choice.
Nothing is estimated: every value comes from the event or the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any
from urllib.parse import urlsplit

from engine.api import Loaded, ModelInfo

LABELS: dict[str, str] = {
    # engine.doctor.report()
    "python": "Python",
    "torch": "PyTorch",
    "transformers": "Transformers",
    "bitsandbytes": "bitsandbytes",
    "cpu": "CPU",
    "cpu_threads": "CPU threads",
    "cuda": "CUDA available",
    "gpu": "GPU",
    "gpu_memory_gb": "GPU memory",
    "bf16_supported": "bfloat16 on GPU",
    "memory_gb": "Memory",
    "dtypes": "Working dtypes",
    # Loaded
    "model": "Model",
    "device": "Device",
    "dtype": "Precision",
    "load_s": "Load time",
    # ModelInfo: one label per field (a test checks that none is missing)
    "parameters": "Parameters",
    "weight_bytes": "Weights in memory",
    "quant": "Quantization",
    "packed_linears": "Packed linear layers",
    "quant_cached": "Quantized copy from the cache",
    "quant_load_s": "Quantization time",
    "decode_step": "Native decode step",
    "dtype_probe": "CPU precision check",
    "mode_probe": "Weight mode check",
    "kv_reserved_bytes": "Memory reserved for the KV cache",
    "warm_prefixes": "Warm prompt caches from disk",
    "draft_model": "Draft model",
    "draft_quant": "Draft quantization",
    "endpoint": "Server",
    "context_length": "Context length (tokens)",
    "fast_path": "Fast path",
    "tool_template": "Chat template carries tools",
    "thinking_switch": "Chat template has a thinking switch",
}
EMPTY = "\u2014"


def size_text(n: float) -> str:
    """Bytes as a person reads them: ``512 bytes``, ``12.5 KB``, ``257.5 MB``, ``1.26 GB``."""
    if n < 1024:
        return f"{n:.0f} bytes"
    for unit in ("KB", "MB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.2f} GB"


def count_text(n: float) -> str:
    """A parameter count: ``135.0 M``, ``1.24 B``."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def dtype_probe_text(record: Mapping[str, Any]) -> str:
    """The CPU precision check as a sentence, from whichever numbers it recorded."""
    chosen = record.get("dtype")
    parts = [f"Chose {chosen}" if chosen else "Measured"]
    fp32, bf16 = record.get("float32_step_ms"), record.get("bfloat16_step_ms")
    if _number(fp32) and _number(bf16):
        parts.append(f": a decode step took {fp32:.1f} ms in float32 and {bf16:.1f} ms in bfloat16")
    fp32_p, bf16_p = record.get("float32_prefill32_ms"), record.get("bfloat16_prefill32_ms")
    if _number(fp32_p) and _number(bf16_p):
        parts.append(f", reading 32 tokens {fp32_p:.1f} ms and {bf16_p:.1f} ms")
    agreement = record.get("bfloat16_agreement")
    if _number(agreement):
        parts.append(f"; bfloat16 agreed with float32 on {100 * agreement:.1f} % of next tokens")
    return "".join(parts) + "." + _why(record)


def mode_probe_text(record: Mapping[str, Any]) -> str:
    """The weight-mode check (``quant="auto"``) as a sentence: the choice, each mode's decode step, why."""
    chosen = record.get("chosen") or record.get("mode")
    parts = [f"Chose {chosen}" if chosen else "Measured"]
    modes = record.get("modes")
    if isinstance(modes, Mapping):
        steps = []
        for name, figures in modes.items():
            if isinstance(figures, Mapping) and _number(figures.get("step_ms")):
                agreement = figures.get("agreement")
                agreed = f", {100 * agreement:.1f} % agreement" if _number(agreement) else ""
                steps.append(f"{name} {figures['step_ms']:.1f} ms{agreed}")
        if steps:
            parts.append(": a decode step took " + "; ".join(steps))
    return "".join(parts) + "." + _why(record)


def _why(record: Mapping[str, Any]) -> str:
    """A probe record's reason for its choice, and whether it is measured again next time."""
    said = ""
    reason = record.get("reason")
    if isinstance(reason, str) and reason.strip():
        reason = reason.strip().rstrip(".")
        said += f" Why: {reason[0].upper()}{reason[1:]}."
    if record.get("saved") is False:
        said += " Not saved: it is measured again at the next start."
    return said


def show_value(key: str, value: Any) -> str:
    """A fact as a person reads it: units, yes/no, thousands separators."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return EMPTY
    if key == "dtype_probe" and isinstance(value, Mapping):
        return dtype_probe_text(value)
    if key == "mode_probe" and isinstance(value, Mapping):
        return mode_probe_text(value)
    if _number(value):
        if key.endswith("_gb"):
            return f"{value:g} GB"
        if key.endswith("_bytes"):
            return size_text(value)
        if key.endswith("_s"):
            return f"{value:.2f} s"
        if key == "parameters":
            return count_text(value)
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{LABELS.get(str(k), str(k))}: {show_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(show_value("", v) for v in value)
    return str(value)


def label(key: str) -> str:
    return LABELS.get(key, key)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _says_something(key: str, value: Any, info: ModelInfo) -> bool:
    if value is None or value == "":
        return False
    if key == "draft_quant":
        return bool(info.draft_model)
    return not (key in ("packed_linears", "kv_reserved_bytes") and value == 0)


def model_facts(loaded: Loaded | None) -> dict[str, str]:
    """``{label: text}`` for the loaded model, in a stable order (empty when none is loaded)."""
    if loaded is None:
        return {}
    facts = {
        label("model"): loaded.model_name,
        label("device"): loaded.device,
        label("dtype"): loaded.dtype or EMPTY,  # a remote server does not say
        label("load_s"): show_value("load_s", loaded.load_s),
    }
    if is_remote(loaded):
        del facts[label("dtype")]
    for f in fields(ModelInfo):
        value = getattr(loaded.info, f.name)
        if _says_something(f.name, value, loaded.info):
            if is_remote(loaded) and (value == 0 or value == "none"):
                continue  # a server does not tell its parameters, memory or quantization: not zero, unknown
            facts[label(f.name)] = show_value(f.name, value)
    return facts


def machine_facts(report: Mapping[str, Any]) -> dict[str, str]:
    return {label(str(key)): show_value(str(key), value) for key, value in report.items()}


def is_remote(loaded: Loaded) -> bool:
    """True for a model served by a remote server (``engine.remote``): its weights are not ours to describe."""
    return loaded.device == "remote"


def endpoint_text(endpoint: str) -> str:
    """A server's base URL as the status bar shows it: ``host:port`` (the whole URL when it has no host)."""
    host = urlsplit(endpoint).netloc
    return host or endpoint or "a server"


def precision_text(loaded: Loaded) -> tuple[str, str]:
    """(what the status bar shows about the weights, its tooltip); for a server: where it is."""
    if is_remote(loaded):
        where = loaded.info.endpoint
        return endpoint_text(where), (
            f"Replies come from the server at {where or 'an unknown address'}. TTFT and tokens/s are "
            "measured here, as the tokens arrive; prompt and cache figures are the server's own, where it reports them."
        )
    quant = loaded.info.quant
    if quant and quant != "none":
        return quant, f"Weights quantized with {quant}; the other tensors are {loaded.dtype}."
    return loaded.dtype, f"Weights and arithmetic in {loaded.dtype}."
