"""What a loaded model is, read off its modules and tokenizer: its parameter count, its end-of-turn ids.

:func:`count_parameters` counts the parameters as the checkpoint has them,
whatever kernels hold the weights after loading (packed, quantized, tied).
:func:`check_special_tokens` collects the ids that end a turn and refuses,
with :class:`~engine.model.source.ModelLoadError`, a model that has none or
has no chat template.  Both only read the model; neither changes it.
"""

from __future__ import annotations

import math
from typing import Any

from engine.model.source import ModelLoadError


def count_parameters(model: Any) -> int:
    """The model's parameter count as its checkpoint has it, whatever kernels hold the weights now.

    Packed and quantized layers (``PackedLinear``, fp16/int8/int4 CPU layers) keep their
    weights in buffers or opaque objects, outside ``model.parameters()``: such a layer counts
    ``in_features * out_features`` (plus its bias).  A bitsandbytes 4-bit weight counts its
    original shape, not its packed bytes.  A quantized output head tied to the embedding in
    the checkpoint (``tie_word_embeddings``) is the embedding's copy and counts nothing.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        out_features, in_features = getattr(module, "out_features", None), getattr(module, "in_features", None)
        if "weight" not in own and isinstance(out_features, int) and isinstance(in_features, int):
            if module is head and tied:
                continue
            has_bias = getattr(module, "has_bias", None)
            if has_bias is None:
                has_bias = getattr(module, "bias", None) is not None
            total += in_features * out_features + (out_features if has_bias else 0)
            continue
        for param in own.values():
            if id(param) in seen:
                continue
            seen.add(id(param))
            shape = getattr(getattr(param, "quant_state", None), "shape", None)
            total += math.prod(shape) if shape is not None else param.numel()
    return total


def check_special_tokens(model: Any, tokenizer: Any) -> frozenset[int]:
    """Collect end-of-turn ids from the tokenizer and config; refuse a model with none."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, model.config.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    if not ids:
        raise ModelLoadError("The model defines no end-of-sequence token, so replies could never end.")
    if tokenizer.chat_template is None:
        raise ModelLoadError("The model has no chat template; Brisk needs an instruction-tuned chat model.")
    return frozenset(ids)
