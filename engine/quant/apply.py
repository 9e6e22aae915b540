"""Putting the CPU kernels into a model, and measuring what a model's weights hold.

Contract:

* :func:`quantize_cpu` replaces every ``nn.Linear`` (``lm_head`` included) by
  :class:`~engine.quant.kernels.Fp16Linear` / ``Int8Linear`` / ``Int4Linear``, in place.
  A tied ``lm_head`` gets its own quantized copy; the embedding it shared stays as it
  was.  A layer whose shape the kernel cannot take is left as it is and listed in
  ``model.brisk_quant["skipped"]``.
* :func:`fuse_fp16` groups each decoder layer's q/k/v and gate/up fp16 layers.
* :func:`swap_module` is the one way this package replaces a submodule; it and
  :func:`fuse_fp16` mark the model changed (:func:`layout_version`), so code that keeps
  what a model's layers hold (``engine.quant.decode_step``) knows when to look again.
* :func:`weight_bytes` counts the bytes held by weights, whatever their kernel.
* :func:`bnb_config` is the ``quantization_config`` transformers applies for a bnb mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.quant.kernels import INT4_GROUP, Fp16Group, Fp16Linear, Int4Linear, Int8Linear, Q8Linear
from engine.quant.modes import BNB_MODES, CPU_MODES, check_mode, require

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig

FP16_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
_LAYOUT = "_brisk_layout_version"  # in the model's __dict__: how many times its layers were changed here


def layout_version(model: nn.Module) -> int:
    """How many times :func:`swap_module` or :func:`fuse_fp16` changed ``model``'s layers."""
    return int(model.__dict__.get(_LAYOUT, 0))


def mark_changed(model: nn.Module) -> None:
    """Record that ``model``'s layers changed (for whoever compares :func:`layout_version`)."""
    model.__dict__[_LAYOUT] = layout_version(model) + 1


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
            elif mode == "q8-cpu":
                if not Q8Linear.fits(module):
                    skipped.append(name)
                    continue
                kind = "q8"
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
            elif kind == "q8":
                new = Q8Linear.from_linear(module)
            elif kind == "int8":
                new = Int8Linear.from_linear(module)
            else:
                new = Int4Linear.from_linear(module, group_size)
            plan[name] = {"kind": kind, "in": module.in_features, "out": module.out_features}
            plan[name].update(bias=module.bias is not None, group_size=group_size)
            if kind == "q8":
                plan[name]["bits"] = getattr(new, "bits", 8)
            swap_module(model, name, new)
    if mode == "fp16-cpu" and pack:
        fuse_fp16(model)
    setattr(model, "brisk_quant", {"mode": mode, "group_size": group_size, "layers": plan, "skipped": skipped})  # noqa: B010
    return model


def _head_name(model: nn.Module) -> str:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return next((name for name, m in model.named_modules() if m is head), "") if head is not None else ""


def swap_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule called ``name`` is, and mark ``model`` changed."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)
    mark_changed(model)


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


def fuse_fp16(model: nn.Module) -> int:
    """Group each decoder layer's q/k/v and gate/up :class:`Fp16Linear` (see :class:`Fp16Group`),
    pack every layer still waiting to be, and mark ``model`` changed; return how many groups.

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
    mark_changed(model)
    return grouped - results.count(None)


def _try_group(parts: list[Fp16Linear]) -> Fp16Group | None:
    try:
        return Fp16Group(parts)
    except ValueError:
        return None


def bnb_config(mode: str, compute_dtype: torch.dtype) -> BitsAndBytesConfig:
    """The ``quantization_config`` for ``from_pretrained`` in a bnb mode."""
    check_mode(mode)
    if mode not in BNB_MODES:
        raise ValueError(f"{mode!r} is not a bitsandbytes mode; bnb_config takes one of {', '.join(BNB_MODES)}.")
    from transformers import BitsAndBytesConfig

    if mode == "bnb-int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode[4:], bnb_4bit_compute_dtype=compute_dtype)
