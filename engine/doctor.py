"""``brisk doctor``: what this machine can do, as a flat dict of facts.

For each quantization mode: ``works``, or why it cannot run here; a mode that works but
has a caveat (``engine.quant.caveat``: int4-cpu's accuracy depends on the CPU's kernel)
says so after ``works``.  For each model that ``quant="auto"`` measured on this machine
(``engine.model.mode_probe``): the mode it chose and why, with the figures.
"""

from __future__ import annotations

import os
import platform
from typing import Any


def report() -> dict[str, Any]:
    """The facts; its probes run torch kernels, so on a thread of their own (``engine.runtime.threads``)."""
    from engine.runtime.threads import isolated

    return isolated(_report)


def _report() -> dict[str, Any]:
    import torch
    import transformers

    data: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        data["gpu"] = props.name
        data["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        data["bf16_supported"] = torch.cuda.is_bf16_supported()
    from engine import quant

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        data["bitsandbytes"] = quant.import_bnb().__version__
    except Exception as exc:  # noqa: BLE001 - report any import failure
        data["bitsandbytes"] = f"not usable ({exc})"
    data["dtypes"] = ", ".join(name for name in ("float32", "bfloat16", "float16") if dtype_works(name, device))
    for mode, reason in quant.availability(device).items():
        data[f"quant {mode}"] = "works" if reason is None else f"unavailable: {reason}"
        if reason is None and (note := quant.caveat(mode)):
            data[f"quant {mode}"] += f" (caveat: {note})"
    from engine.quant import native

    # fp16-cpu's decode step in C++ (engine.quant.native): loaded if its checksum matches, else tested or rebuilt here
    native.module(wait=True)
    built = "prebuilt" if native.prebuilt_folder() is not None else native.build_name()
    data["native decode step"] = f"{native.status()} ({built})"
    from engine.model import mode_probe

    here = mode_probe.machine()
    for key, record in mode_probe.all_records().items():
        if record.get("machine") == here:  # quant="auto": what it chose for a model on this machine, and why
            data[f"quant auto (model {key.split('|', 1)[0][:12]})"] = f"{record['chosen']}: {record['reason']}"
    data.update(_model_support())
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        data["memory_gb"] = round(pages / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return data


def _model_support() -> dict[str, str]:
    """The model Settings names (the bundled one when none): which of Brisk's paths runs it, or why not."""

    from engine.model.headers import HeaderError, describe
    from engine.model.source import ModelLoadError, model_path
    from engine.storage import Settings

    source = Settings.load().model
    try:
        path = model_path(source)
        if path is None:
            return {"model": source, "model fast path": "not on disk (a hub id or a missing path): not checked"}
        facts = describe(path, vocab=False)
    except (HeaderError, ModelLoadError, OSError) as exc:
        return {"model": source or "bundled", "model fast path": f"cannot be read: {exc}"}
    text = f"cannot load: {facts.problem}" if facts.problem else facts.support().sentence
    return {"model": f"{path.name} ({facts.architecture or 'unknown architecture'})", "model fast path": text}


def dtype_works(name: str, device: Any) -> bool:
    import torch

    try:
        x = torch.ones(4, 4, dtype=getattr(torch, name), device=device)
        return bool(torch.isfinite((x @ x).float()).all())
    except (RuntimeError, TypeError):
        return False
