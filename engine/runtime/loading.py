"""Everything that belongs to one model, built before the engine switches to it.

``build(spec, options, progress)`` runs on the engine thread (the KV memory
reserved here comes from that thread's malloc arena).  It loads the model
(``engine.model.loader.load_model``, reporting through ``progress``) and
returns a :class:`Built`: the model, its
:class:`~engine.runtime.decode.Decoder`, a new
:class:`~engine.runtime.prefix_cache.PrefixCache` holding the system-prompt KV
saved for this model identity (when ``options.persist_prefixes``), the draft
model when the spec names one, the :class:`~engine.api.ModelInfo` for
``Loaded`` and the warnings to send after it.  Before it returns, the model is
warmed up (:func:`warm_up`: a throwaway prefill and step) so the first reply
does not pay for first calls.

It raises only what loading the model itself raises (``ModelLoadError``, or
anything unexpected); saved prompt caches that cannot be read, or a draft
model that cannot be loaded, are warnings and never fail the load.  It changes
nothing in the engine: the caller switches to the result all at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.api import ModelInfo, ModelSpec, Warning
from engine.model.kv import KVState, forward
from engine.model.loader import LoadedModel, ModelLoadError, load_draft, load_model
from engine.model.source import set_request_gate
from engine.model.support import support
from engine.model.template import takes_thinking_switch
from engine.model.tool_template import template_renders_tools
from engine.paths import cache_dir
from engine.quant import native
from engine.runtime import activity
from engine.runtime.decode import Decoder
from engine.runtime.memory import reserve
from engine.runtime.options import EngineOptions
from engine.runtime.prefix_cache import PrefixCache, kv_layout
from engine.runtime.speculative import DraftModel

log = logging.getLogger(__name__)
set_request_gate(activity.wait_idle)  # a first start's converted copy is written between requests

KV_RESERVE_BYTES = 256 << 20  # memory made ready for KV buffers at load (engine.runtime.memory.reserve)


def kv_file(identity: str) -> Path:
    """Where the system-prompt KV of the model ``identity`` is saved."""
    return cache_dir() / "kv" / f"{identity}.safetensors"


@dataclass
class Built:
    """A loaded model and what belongs to it, ready to be switched to."""

    loaded: LoadedModel
    decoder: Decoder
    prefix_cache: PrefixCache
    draft: DraftModel | None
    dtype: str  # the model's dtype without the "torch." prefix
    info: ModelInfo
    warnings: list[Warning] = field(default_factory=list)


def build(
    spec: ModelSpec,
    options: EngineOptions,
    progress: Callable[[float, str], None],
    loaded: LoadedModel | None = None,
) -> Built:
    """Load ``spec`` and build its decoder, prefix cache and draft model (see the module docstring).

    ``loaded``: the model is already loaded (the mode a background measurement chose): only the rest is built.
    """
    loaded = loaded or load_model(spec, progress, defer_probe=options.defer_probe)
    warnings: list[Warning] = []
    if getattr(loaded.model, "brisk_quant", {}).get("mode") == "fp16-cpu":
        loaded.info["decode_step"] = native.prepare()  # loaded now, or built in the background
    decoder = Decoder(loaded.model, loaded.tokenizer, loaded.eos_ids)
    # on this (the engine's) thread, whose malloc arena the KV buffers will come from
    loaded.info["kv_reserved_bytes"] = reserve(min(options.prefix_cache_bytes, KV_RESERVE_BYTES))
    prefix_cache = PrefixCache(loaded.identity, options.prefix_cache_bytes)
    if options.persist_prefixes:
        try:
            loaded.info["warm_prefixes"] = prefix_cache.load(kv_file(loaded.identity), layout=kv_layout(loaded.model))
            if prefix_cache.load_problems:
                problems = "; ".join(prefix_cache.load_problems)
                warnings.append(
                    Warning("cache", f"Some saved prompt caches were not used ({problems}); they start cold.")
                )
        except Exception as exc:  # saved prompt caches only save time: start cold
            traceback.print_exc()
            prefix_cache = PrefixCache(loaded.identity, options.prefix_cache_bytes)
            loaded.info["warm_prefixes"] = 0
            message = f"Saved prompt caches were not used ({exc}); the first reply starts cold."
            warnings.append(Warning("cache", message))
    loaded.info["warm_up_s"] = warm_up(loaded.model)
    draft = None
    if spec.draft:
        try:
            draft = DraftModel(load_draft(spec, loaded).model)
            loaded.info["draft_model"] = spec.draft
            loaded.info["draft_quant"] = getattr(spec, "draft_quant", "none")
        except Exception as exc:  # the target runs without it
            if not isinstance(exc, ModelLoadError):
                traceback.print_exc()
                exc = ModelLoadError(f"{type(exc).__name__}: {exc}")
            warnings.append(Warning("draft", f"Draft model not used: {exc}"))
    dtype = str(loaded.dtype).removeprefix("torch.")
    loaded.info["context_length"] = loaded.context_length
    loaded.info["fast_path"] = fast_path_text(loaded.model)
    loaded.info["tool_template"] = template_renders_tools(loaded.tokenizer)
    loaded.info["thinking_switch"] = takes_thinking_switch(loaded.tokenizer)
    known = {f.name for f in dataclasses.fields(ModelInfo)}
    info = ModelInfo(**{k: v for k, v in loaded.info.items() if k in known})
    return Built(loaded, decoder, prefix_cache, draft, dtype, info, warnings)


WARM_UP_TOKENS = 8


def warm_up(model: Any) -> float:
    """A short prefill and one decode step on a throwaway cache, on the engine's thread (``build`` runs there),
    so that the first reply does not pay for first calls: the thread team of the native step and of torch,
    the kernels' first use, the rotary tables (measured on the bundled model: the first question's prefill
    took some 17 ms longer than the next).  Returns the seconds it took (0 where it failed: it only saves
    time, so it never stops a load)."""
    started = time.perf_counter()
    try:
        with torch.inference_mode():
            state = KVState()
            logits = forward(model, state, list(range(WARM_UP_TOKENS)))
            forward(model, state, [int(logits[-1].argmax())], decode=True)
    except Exception:  # a model this cannot run will say so in its first reply
        log.warning("warm-up after load failed", exc_info=True)
        return 0.0
    return time.perf_counter() - started


def fast_path_text(model: object) -> str:
    """What ``ModelInfo.fast_path`` says: the paths that run ``model``, or why the fast ones do not."""
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return ""
    return support(to_dict()).sentence
