"""A lean forward pass for Llama-family models, same arithmetic as transformers', less overhead.

At batch 1 on a CPU a decode step of a small model is short enough that the
Python around the kernels matters: transformers' forward builds masks, output
objects, hub-kernel wrappers and dispatch for every layer, and for a chunk of
several tokens on top of a cache its SDPA path copies every layer's keys and
values once per KV-head group (``repeat_kv``) before attending.  This module
runs the same modules (so quantized layers work unchanged; norms, embedding,
rotary and head are the model's own) with the same operations in the same
order, and attends with ``enable_gqa`` instead of copying keys and values.

``FastForward.for_model(model)`` returns ``None`` for anything it does not
know to be equivalent (another architecture, sliding windows, another
activation); callers then use the model's own forward.  ``engine.model.kv.forward``
makes one per model on first use (``engine.model.kv.fast_forward``).
Equivalence is tested against transformers' forward in ``tests/engine/model/test_fastpath.py``.
Decode tokens of fp16-cpu and q8-cpu models go to the native step (``engine.quant.native``:
one C++ call for all layers, ``engine.quant.decode_step``) once it is built; everything
else runs here.  Two decode paths, no third.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from engine.quant.decode_step import NativeDecode, rotate

# Architectures whose decoder layer is exactly: x + attn(rmsnorm(x)); x + down(silu(gate) * up)(rmsnorm(x)).
ARCHITECTURES = ("llama", "mistral", "qwen2")
LAYER_PARTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


class FastForward:
    def __init__(self, model: Any) -> None:
        self.model = model
        inner = model.model
        for layer in inner.layers:  # the layout we run; a missing part raises AttributeError
            for part in LAYER_PARTS:
                layer.get_submodule(part)
        for part in ("embed_tokens", "rotary_emb", "norm"):
            inner.get_submodule(part)
        model.get_submodule("lm_head")
        first = inner.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.grouped = first.num_key_value_groups > 1
        self.native = NativeDecode.for_model(model, self)  # decode steps of fp16-cpu and q8-cpu models

    @classmethod
    def for_model(cls, model: Any) -> FastForward | None:
        """A fast forward for ``model``, or None when its architecture is not known to match."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in ARCHITECTURES:
            return None
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
            return None
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return None  # windowed attention masks differently
        if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", None):
            return None
        try:
            return cls(model)
        except AttributeError:  # a part named differently: not the layout we know
            return None

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, cache: Any, logits_to_keep: int = 1, decode: bool = False) -> torch.Tensor:
        """Logits [1, kept, vocab] for ``ids`` [1, n] on top of ``cache`` (a DynamicCache), which it extends.

        ``decode``: these are decode tokens (a plain step, or a token and its drafts), not a
        prompt; fp16-cpu and q8-cpu models then run the native step (``engine.quant.native``),
        which computes each row as a one-row call would, so a speculative step's verification
        and plain steps agree bit for bit.  Prompts keep this eager path, so a prompt's KV is
        the same whether a prefix of it was cached or not.
        """
        # Modules are looked up on every call (microseconds), so a later swap (quantization) or
        # dtype change of the model is always what runs.
        inner = self.model.model
        n = ids.shape[1]
        if decode and self.native is not None:
            logits = self.native.rows(ids, cache, all_rows=logits_to_keep == 0 or logits_to_keep >= n)
            if logits is not None:
                return logits if logits_to_keep in (0, n) else logits[:, -logits_to_keep:]
        past = int(cache.get_seq_length())
        h = inner.embed_tokens(ids)
        positions = torch.arange(past, past + n, device=ids.device).unsqueeze(0)
        cos, sin = inner.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = None
        causal = False
        if n > 1 and past == 0:
            causal = True
        elif n > 1:
            keys = torch.arange(past + n, device=ids.device)
            mask = keys[None, :] <= positions[0, :, None]  # [n, past + n], True = attend
        half = self.head_dim // 2
        layers = inner.layers
        while len(cache.layers) < len(layers):
            cache.layers.append(cache.layer_class_to_replicate())
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, n, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, n, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, n, -1, self.head_dim).transpose(1, 2)
            q, k = rotate(q, cos, sin, half), rotate(k, cos, sin, half)
            k, v = cache.layers[i].update(k, v)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=self.grouped
            )
            h = h + attn.o_proj(a.transpose(1, 2).reshape(1, n, -1))
            x = layer.post_attention_layernorm(h)
            h = h + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        h = inner.norm(h)
        kept = h if logits_to_keep == 0 else h[:, -logits_to_keep:]
        return self.model.lm_head(kept)
