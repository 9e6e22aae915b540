"""A lean forward pass for the decoder layouts Brisk knows, same arithmetic as transformers', less overhead.

At batch 1 on a CPU a decode step of a small model is short enough that the
Python around the kernels matters: transformers' forward builds masks, output
objects, hub-kernel wrappers and dispatch for every layer, and for a chunk of
several tokens on top of a cache its SDPA path copies every layer's keys and
values once per KV-head group (``repeat_kv``) before attending.  This module
runs the same modules (so quantized layers work unchanged; norms, embedding,
rotary, q/k norms and head are the model's own) with the same operations in the
same order, and attends with ``enable_gqa`` instead of copying keys and values.

The layouts (``engine.model.support``: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2,
Gemma 3 text) and each layer's sliding window come from :func:`engine.model.support.layout`,
the same rules ``support()`` reports to users.  ``FastForward.for_model(model)`` returns
``None`` for anything else (another architecture, another activation, a rotary type that
depends on the length, parts named differently); callers then use the model's own forward.
A windowed layer attends to the last ``sliding_window`` positions only; the cache still
keeps every position (``engine.model.kv`` grows it in place), so memory is not saved.
``engine.model.kv.forward`` makes one per model on first use (``engine.model.kv.fast_forward``).
Equivalence is tested against transformers' forward in ``tests/engine/model/test_fastpath.py``
and ``tests/engine/model/test_architectures.py``.
Decode tokens of fp16-cpu and q8-cpu models of the layouts the native step takes go to it
(``engine.quant.native``: one C++ call for all layers, ``engine.quant.decode_step``) once
it is built; everything else runs here.  Two decode paths, no third.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from engine.model.support import Layout, layout
from engine.quant.decode_step import NativeDecode, rotate

NORMS = ("input_layernorm", "post_attention_layernorm")
# The parts each layout's decoder layers must have (a missing one: not the layout we know).
LAYER_PARTS = {
    "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", *NORMS),
    "qwen3": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", *NORMS),
    "phi3": ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", *NORMS),
    "gemma2": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", *NORMS,
               "pre_feedforward_layernorm", "post_feedforward_layernorm"),
}  # fmt: skip
LAYER_PARTS["gemma3"] = (*LAYER_PARTS["gemma2"], "self_attn.q_norm", "self_attn.k_norm")
ACTIVATIONS = {"llama": F.silu, "qwen3": F.silu, "phi3": F.silu}  # Gemma: GELU (tanh), below


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class FastForward:
    def __init__(self, model: Any, plan: Layout, native_step: bool) -> None:
        self.model = model
        self.plan = plan
        inner = model.model
        for layer in inner.layers:  # the layout we run; a missing part raises AttributeError
            for part in LAYER_PARTS[plan.family]:
                layer.get_submodule(part)
        for part in ("embed_tokens", "rotary_emb", "norm"):
            inner.get_submodule(part)
        model.get_submodule("lm_head")
        if len(plan.windows) != len(inner.layers):
            raise ValueError("the config's layer count is not the model's")
        config = model.config
        first = inner.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        self.q_heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.q_size, self.kv_size = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        self.grouped = self.q_heads != self.kv_heads
        self.gemma = plan.family in ("gemma2", "gemma3")
        self.head_norms = plan.family in ("qwen3", "gemma3")  # q/k norms per head before the rotary embedding
        self.act = ACTIVATIONS.get(plan.family, _gelu_tanh)
        # Gemma 3 rotates sliding and full layers with bases of their own (its rotary module takes the type)
        self.rope_types = list(config.layer_types) if plan.family == "gemma3" else None
        self.native = NativeDecode.for_model(model, self) if native_step else None  # fp16-cpu and q8-cpu decode

    @classmethod
    def for_model(cls, model: Any) -> FastForward | None:
        """A fast forward for ``model``, or None when its architecture is not known to match."""
        config = getattr(model, "config", None)
        to_dict = getattr(config, "to_dict", None)
        if config is None or not callable(to_dict) or not hasattr(model, "model"):
            return None
        settings = {**to_dict(), "_attn_implementation": getattr(config, "_attn_implementation", None)}
        plan, said = layout(settings)  # the rules support() reports (engine.model.support)
        if plan is None:
            return None
        try:
            return cls(model, plan, said.native_step)
        except (AttributeError, ValueError, TypeError):  # a part named differently: not the layout we know
            return None

    def _masks(self, past: int, n: int, device: torch.device) -> dict[int | None, tuple[int, Any, bool]]:
        """For each window of the model's layers: (first key attended, bool mask [n, keys] or None, causal)."""
        total = past + n
        positions = torch.arange(past, total, device=device) if n > 1 else None
        out: dict[int | None, tuple[int, Any, bool]] = {}
        for window in set(self.plan.windows):
            if window is None or window >= total:  # the window covers every position: plain causal
                first, limit = 0, None
            else:
                first, limit = max(0, past - window + 1), window
            if n == 1:
                out[window] = (first, None, False)  # one query attends to every key kept
            elif limit is None and past == 0:
                out[window] = (0, None, True)
            else:
                assert positions is not None
                keys = torch.arange(first, total, device=device)
                mask = keys[None, :] <= positions[:, None]  # [n, keys], True = attend
                if limit is not None:
                    mask &= keys[None, :] > positions[:, None] - limit
                out[window] = (first, mask, False)
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, causal: bool) -> torch.Tensor:
        """Attention of q [1, heads, n, d] over k, v [1, kv heads, keys, d]; soft-capped for Gemma 2."""
        cap = self.plan.softcap
        if cap is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=self.grouped
            )
        # as transformers' eager attention (SDPA cannot soft-cap): scores, cap, mask, softmax in float32
        n, keys, groups = q.shape[2], k.shape[2], self.q_heads // self.kv_heads
        grouped = q.reshape(1, self.kv_heads, groups * n, self.head_dim)  # a KV head's query heads side by side
        scores = (grouped @ k.transpose(2, 3)).view(1, self.q_heads, n, keys) * self.scaling
        scores = torch.tanh(scores / cap) * cap
        if causal:
            mask = torch.ones(n, keys, dtype=torch.bool, device=q.device).tril(keys - n)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = probs.view(1, self.kv_heads, groups * n, keys) @ v
        return out.view(1, self.q_heads, n, self.head_dim)

    def _shared_ok(self, q: torch.Tensor, window: int | None, total: int) -> bool:
        """Whether :meth:`_attend_shared` computes this layer: float32 on the CPU, every position in its
        window, no soft-capping (else the layer's segments are joined, a copy, and attended as one)."""
        covered = window is None or window >= total
        return covered and self.plan.softcap is None and q.dtype == torch.float32 and q.device.type == "cpu"

    def _own_mask(self, q: torch.Tensor, own: int, n: int) -> torch.Tensor:
        """The additive mask of the last ``n`` of ``own`` positions over those ``own`` (each up to its own),
        one copy per query head of a KV head, as :meth:`_attend_shared` lays its rows out."""
        allowed = torch.arange(own, device=q.device)[None, :] <= torch.arange(own - n, own, device=q.device)[:, None]
        mask = torch.zeros(n, own, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
        return mask.repeat(self.q_heads // self.kv_heads, 1)

    def _attend_shared(self, q: torch.Tensor, parts: tuple[Any, ...], n: int, masks: dict[int, Any]) -> torch.Tensor:
        """Attention of q [1, heads, n, d] over a shared prefix and the layer's own positions after it, each
        where it is (no copy): two flash attentions whose outputs are weighed by their log-sum-exps.  Every
        query sees the whole prefix; of its own positions, those up to its own (``masks``: the call's masks by
        the number of own positions, made once for all layers)."""
        (k1, v1), (k2, v2) = parts
        groups, hd = self.q_heads // self.kv_heads, self.head_dim
        rows = q.reshape(1, self.kv_heads, groups * n, hd)  # a KV head's query heads side by side
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        o1, l1 = flash(rows, k1, v1, 0.0, False, scale=self.scaling)
        own = int(k2.shape[2])  # positions shared + 0 .. own - 1; the queries are the last n of them
        if own not in masks:
            masks[own] = self._own_mask(q, own, n)
        o2, l2 = flash(rows, k2, v2, 0.0, False, attn_mask=masks[own], scale=self.scaling)
        top = torch.maximum(l1, l2)
        w1, w2 = torch.exp(l1 - top).unsqueeze(-1), torch.exp(l2 - top).unsqueeze(-1)
        out = (o1 * w1 + o2 * w2) / (w1 + w2)
        return out.to(q.dtype).view(1, self.q_heads, n, hd)

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
        h = inner.embed_tokens(ids)  # Gemma's module scales by sqrt(hidden) in the model's dtype
        positions = torch.arange(past, past + n, device=ids.device).unsqueeze(0)
        if self.rope_types is None:
            cos, sin = inner.rotary_emb(h, positions)
            rope = {None: (cos.unsqueeze(1), sin.unsqueeze(1))}
        else:
            rope = {}
            for kind in set(self.rope_types):
                cos, sin = inner.rotary_emb(h, positions, kind)
                rope[kind] = (cos.unsqueeze(1), sin.unsqueeze(1))
        masks = self._masks(past, n, ids.device)
        hd, family = self.head_dim, self.plan.family
        layers = inner.layers
        shared_masks: dict[int, Any] = {}  # for layers that read a shared prefix where it is
        while len(cache.layers) < len(layers):
            cache.layers.append(cache.layer_class_to_replicate())
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            if family == "phi3":
                q, k, v = attn.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q, k, v = q.view(1, n, -1, hd), k.view(1, n, -1, hd), v.view(1, n, -1, hd)
            if self.head_norms:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            cos, sin = rope[None if self.rope_types is None else self.rope_types[i]]
            rotary = cos.shape[-1]
            if rotary == hd:
                q, k = rotate(q, cos, sin, hd // 2), rotate(k, cos, sin, hd // 2)
            else:  # Phi-3's partial rotary: the first dimensions rotate, the rest pass
                q = torch.cat([rotate(q[..., :rotary], cos, sin, rotary // 2), q[..., rotary:]], dim=-1)
                k = torch.cat([rotate(k[..., :rotary], cos, sin, rotary // 2), k[..., rotary:]], dim=-1)
            window = self.plan.windows[i]
            first, mask, causal = masks[window]
            cached = cache.layers[i]
            parts = cached.append(k, v) if hasattr(cached, "append") else (cached.update(k, v),)
            if len(parts) == 2 and self._shared_ok(q, window, past + n):
                a = self._attend_shared(q, parts, n, shared_masks)  # a shared prefix, read where it is
            else:
                k, v = parts[0] if len(parts) == 1 else (cached.keys, cached.values)  # reading them joins them
                if first:
                    k, v = k[:, :, first:], v[:, :, first:]
                a = self._attend(q, k, v, mask, causal)
            o = attn.o_proj(a.transpose(1, 2).reshape(1, n, -1))
            if self.gemma:
                h = h + layer.post_attention_layernorm(o)
                x = layer.pre_feedforward_layernorm(h)
            else:
                h = h + o
                x = layer.post_attention_layernorm(h)
            if family == "phi3":
                gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
                m = mlp.down_proj(up * self.act(gate))
            else:
                m = mlp.down_proj(self.act(mlp.gate_proj(x)) * mlp.up_proj(x))
            h = h + (layer.post_feedforward_layernorm(m) if self.gemma else m)
        h = inner.norm(h)
        kept = h if logits_to_keep == 0 else h[:, -logits_to_keep:]
        logits = self.model.lm_head(kept)
        cap = self.plan.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
