"""The native decode step's Python side: the collected weights of an fp16-cpu or q8-cpu model.

``NativeDecode.rows`` runs decode tokens (a plain step, or a speculative step's token
and drafts) through the native C++ step (``engine.quant.native``, ``native_step.cpp``):
every layer, the final norm and the head in one call.  Anything it does not take (a
model of another layout, a cache it cannot write into, the step not built yet) runs on
the eager path (``engine.model.fastpath``): two decode paths, no third.

At batch 1 on a small CPU, the Python between kernels costs as much as the kernels
(measured on the bundled model: about half of a 40 ms step is the interpreter calling
modules and small ops); the native step removes it.  It takes a model whose linears
are all fbgemm fp16 layers (``engine.quant.kernels.Fp16Linear``, q/k/v and gate/up fused
by ``engine.quant.apply.fuse_fp16``, or fused already as Phi-3's ``qkv_proj`` and
``gate_up_proj``) or all q8 layers (``Q8Linear``), a ``FastForward`` layout the native step
takes (its ``FastForward`` makes a ``NativeDecode`` only for those: Llama's, Qwen3's with
its per-head q/k norms, Phi-3's, Gemma 2's and Gemma 3's), float32, layers of one shape, RMS
norms with one epsilon; sliding windows per layer (``FastForward.plan.windows``), soft caps
(``plan.softcap``, ``plan.final_softcap``) and Gemma 3's rotary table per layer type
(``FastForward.rope_types``) go to the step as they are.  Gemma's norms go as the module's own
weights: the step adds their ``1 + w`` itself.  The weights are
collected once into one checked structure (``_collected``) and collected again only when
the model's layers were swapped or fused (``engine.quant.apply.layout_version``), its head
changed, a collected layer took new weights (its ``version``) or a norm's weight is not
the tensor collected.  The C++ side checks every tensor it is given (shape, dtype,
device, contiguity, norm widths).  The cache is duck-typed (this package sits below
``engine.model`` and imports nothing from it): every layer must have ``reserve(m, like)``,
returning a buffer with ``keys`` / ``values`` tensors with room for ``m`` more
positions (position ``p`` at index ``p - start``, its ``start`` attribute, 0 if it has none),
and ``advance(m)``, as ``engine.model.kv.GrowingLayer`` has; a layer whose ``base`` is a
(keys, values) pair holds positions ``0 .. start - 1`` there (a shared prefix, read where it
is); for any other cache the step declines (``None``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.quant import native
from engine.quant.apply import layout_version
from engine.quant.gguf_layers import GgufEmbedding, GgufLinear
from engine.quant.kernels import Fp16Linear, Q8Linear

log = logging.getLogger(__name__)
# Rotary types whose cos/sin of a position do not depend on the sequence's length (tabled once)
STATIC_ROPE = ("default", "linear", "llama3")
# The norms that multiply by (1 + w), which the step takes in Gemma models
GEMMA_NORMS = ("Gemma2RMSNorm", "Gemma3RMSNorm")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Rotary position embedding, as transformers' ``apply_rotary_pos_emb`` (also used by ``engine.model.fastpath``)."""
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class NativeDecode:
    def __init__(self, model: Any, fast: Any) -> None:
        self.model, self.fast = model, fast
        self._seen: tuple[int, int] | None = None  # (layout_version(model), id of the head) of _collected
        self._collected: tuple[list[torch.Tensor], list[Any], tuple[int, int, int], float] | None = None
        self._parts: list[Any] = []  # the Fp16Linear layers collected from, and the sum of their versions
        self._parts_version = 0
        self._changes = (-1, -1)  # (Fp16Linear.changes, Q8Linear.changes) when the versions were last summed
        self.kind = ""  # what was collected: "fp16" (packed fbgemm weights), "q8" (Q8Linear parts) or "gguf"
        self._types: list[list[int]] = []  # "gguf": each projection's parts' ggml types
        self._norm_params: list[dict[str, Any]] = []  # the norms' parameter dicts, in the order of _collected[0]
        self._writable: tuple[int, int] | None = None  # (id, length) of the last cache.layers found writable
        self._native: tuple[Any, Any] | None = None  # (the collected tuple it was made from, native Stepper)
        self._rotary: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None  # (key, cos, sin)
        self._head_norms: list[torch.Tensor] = []  # Qwen3, Gemma 3: each layer's q_norm and k_norm weights
        self._output_norms: list[torch.Tensor] = []  # Gemma: each layer's post-attention and post-feedforward norms

    @classmethod
    def for_model(cls, model: Any, fast: Any) -> NativeDecode | None:
        """The native step's side for ``model`` (whose ``FastForward`` is ``fast``); None without one.

        Whether the model fits is decided at its first call and looked at again when its
        modules or norm weights change (see ``_fitting``); a model that does not fit runs eagerly.
        """
        return cls(model, fast) if fast is not None else None

    def collect(self) -> tuple[list[torch.Tensor], list[Any], tuple[int, int, int], float]:
        """(norm weights, packed weights, (q, kv, intermediate) widths, epsilon) as the model is now.

        Raises TypeError/ValueError/AttributeError when the model is not an fp16-cpu model
        with fused q/k/v and gate/up (``engine.quant.apply.fuse_fp16``).  Remembers the
        layers it read (``_parts``) and their versions.
        """
        inner = self.model.model
        if type(inner.layers[0].self_attn.o_proj) is Q8Linear:
            return self._collect_q8()
        if type(inner.layers[0].self_attn.o_proj) is GgufLinear:
            return self._collect_gguf()
        self.kind = "fp16"
        weights: list[Any] = []
        eps: set[float] = set()
        widths: set[tuple[int, int, int]] = set()
        norms = self._collect_norms(eps)
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if hasattr(attn, "qkv_proj"):  # Phi-3: fused in the checkpoint already, packed as one layer each
                qkv_packed, gate_up_packed = (
                    self._packed(attn.qkv_proj, Fp16Linear),
                    self._packed(mlp.gate_up_proj, Fp16Linear),
                )
                q_size, kv_size = self.fast.q_size, self.fast.kv_size
                if attn.qkv_proj.out_features != q_size + 2 * kv_size or mlp.gate_up_proj.out_features % 2:
                    raise ValueError("q/k/v or gate/up not of the widths of the model's heads")
                intermediate = mlp.gate_up_proj.out_features // 2
            else:
                qkv = self._group(attn.q_proj, attn.k_proj, attn.v_proj)
                gate_up = self._group(mlp.gate_proj, mlp.up_proj)
                if qkv.sizes[1] != qkv.sizes[2] or gate_up.sizes[0] != gate_up.sizes[1]:
                    raise ValueError("keys and values, or gate and up, of different widths")
                qkv_packed, gate_up_packed = qkv.packed, gate_up.packed
                q_size, kv_size, intermediate = qkv.sizes[0], qkv.sizes[1], gate_up.sizes[0]
            weights += [qkv_packed, self._packed(attn.o_proj, Fp16Linear), gate_up_packed]
            weights.append(self._packed(mlp.down_proj, Fp16Linear))
            widths.add((q_size, kv_size, intermediate))
        weights.append(self._packed(self.model.lm_head, Fp16Linear))
        self._parts = [p for layer in inner.layers for p in self._projections(layer)]
        self._parts.append(self.model.lm_head)
        self._parts_version = sum(p.version for p in self._parts)
        self._changes = (Fp16Linear.changes, Q8Linear.changes)
        if len(eps) != 1 or len(widths) != 1 or inner.embed_tokens.weight.dtype != torch.float32:
            raise ValueError("layers of different shapes or epsilons, or not float32")
        return norms, weights, widths.pop(), eps.pop()

    def _collect_q8(self) -> tuple[list[torch.Tensor], list[Any], tuple[int, int, int], float]:
        """As :meth:`collect`, for a model whose projections and head are all ``Q8Linear``: each
        projection is a flat list of (weights, scales, bias) parts, q/k/v and gate/up side by side."""
        self.kind = "q8"
        parts: list[Any] = []

        def flat(*layers: Any) -> list[torch.Tensor]:
            if not all(type(p) is Q8Linear for p in layers):
                raise TypeError("not a q8 layer")
            parts.extend(layers)
            return [t for p in layers for t in p.parts()]

        collected = self._collect_parts(flat)
        self._parts = parts
        self._parts_version = sum(p.version for p in parts)
        if self.model.model.embed_tokens.weight.dtype != torch.float32:
            raise ValueError("not float32")
        return collected

    def _collect_gguf(self) -> tuple[list[torch.Tensor], list[Any], tuple[int, int, int], float]:
        """As :meth:`collect`, for a GGUF file run as it is (every projection and the head ``GgufLinear``):
        each projection a flat list of (blocks, bias) parts, q/k/v and gate/up side by side, and their
        ggml types in :attr:`_types` (the step takes both)."""
        self.kind = "gguf"
        types: list[list[int]] = []

        def flat(*layers: Any) -> list[torch.Tensor]:
            if not all(type(p) is GgufLinear for p in layers):
                raise TypeError("not a GGUF layer")
            types.append([p.kind for p in layers])
            return [t for p in layers for t in p.parts()]

        collected = self._collect_parts(flat)
        self._types = types
        self._parts, self._parts_version = [], 0  # a GGUF layer never changes its blocks
        if type(self.model.model.embed_tokens) is not GgufEmbedding:
            raise ValueError("an embedding not from the file")
        return collected

    def _collect_parts(self, flat: Any) -> tuple[list[torch.Tensor], list[Any], tuple[int, int, int], float]:
        """(norms, each projection's ``flat(*layers)``, widths, epsilon): q/k/v and gate/up side by side (or
        Phi-3's fused two), then the output and down projections, a layer at a time, and the head."""
        inner = self.model.model
        weights: list[Any] = []
        eps: set[float] = set()
        widths: set[tuple[int, int, int]] = set()
        norms = self._collect_norms(eps)
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if hasattr(attn, "qkv_proj"):  # Phi-3: one projection each, q/k/v and gate/up side by side
                weights += [flat(attn.qkv_proj), flat(attn.o_proj), flat(mlp.gate_up_proj), flat(mlp.down_proj)]
                if attn.qkv_proj.out_features != self.fast.q_size + 2 * self.fast.kv_size:
                    raise ValueError("q/k/v not of the widths of the model's heads")
                widths.add((self.fast.q_size, self.fast.kv_size, mlp.gate_up_proj.out_features // 2))
                continue
            weights += [flat(attn.q_proj, attn.k_proj, attn.v_proj), flat(attn.o_proj)]
            weights += [flat(mlp.gate_proj, mlp.up_proj), flat(mlp.down_proj)]
            widths.add((attn.q_proj.out_features, attn.k_proj.out_features, mlp.gate_proj.out_features))
            if attn.k_proj.out_features != attn.v_proj.out_features or (
                mlp.gate_proj.out_features != mlp.up_proj.out_features
            ):
                raise ValueError("keys and values, or gate and up, of different widths")
        weights.append(flat(self.model.lm_head))
        self._changes = (Fp16Linear.changes, Q8Linear.changes)
        if len(eps) != 1 or len(widths) != 1:
            raise ValueError("layers of different shapes or epsilons")
        return norms, weights, widths.pop(), eps.pop()

    def _collect_norms(self, eps: set[float]) -> list[torch.Tensor]:
        """The norm weights the step is made with: two a layer (the input norm, then the one before the
        MLP), then the final norm.  Beside them, Gemma's output norms (``_output_norms``: the attention's
        and the MLP's, two a layer) and Qwen3's and Gemma 3's per-head q/k norms (``_head_norms``, two a
        layer), or none.  Every one is the module's own weight tensor, not a copy: Gemma's ``1 + w`` is
        added in the step, so :meth:`_current` notices a new weight by identity and the step reads an
        in-place change as it is.  Remembers the modules' parameter dicts in that order (``_norm_params``)."""
        inner = self.model.model
        gemma = bool(getattr(self.fast, "gemma", False))

        def pairs(first: str, second: str) -> list[Any]:
            return [layer.get_submodule(name) for layer in inner.layers for name in (first, second)]

        main = pairs("input_layernorm", "pre_feedforward_layernorm" if gemma else "post_attention_layernorm")
        main.append(inner.norm)
        outputs = pairs("post_attention_layernorm", "post_feedforward_layernorm") if gemma else []
        heads = pairs("self_attn.q_norm", "self_attn.k_norm") if getattr(self.fast, "head_norms", False) else []
        modules = main + outputs + heads
        weights = [self._norm(n, eps, gemma) for n in modules]
        self._norm_params = [m._parameters for m in modules]  # a dict lookup a step, not Module.__getattr__
        self._output_norms = weights[len(main) : len(main) + len(outputs)]
        self._head_norms = weights[len(main) + len(outputs) :]
        return weights[: len(main)]

    @staticmethod
    def _projections(layer: Any) -> tuple[Any, ...]:
        """A decoder layer's projections: Phi-3's fused two and the output and down ones, or all seven."""
        attn, mlp = layer.self_attn, layer.mlp
        if hasattr(attn, "qkv_proj"):
            return (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)

    @staticmethod
    def _group(*parts: Any) -> Any:
        group = getattr(parts[0], "group", None)
        fused = group is not None and len(group.sizes) == len(parts)
        if not fused or not all(
            type(p) is Fp16Linear and p.group is group and p.index == i for i, p in enumerate(parts)
        ):
            raise TypeError("not a group of fused fp16 layers")
        return group

    def _current(self, norms: list[torch.Tensor]) -> bool:
        """Whether the collected layers hold the weights collected and the norms are the tensors collected."""
        changes = (Fp16Linear.changes, Q8Linear.changes)
        if changes != self._changes:  # some fp16 or q8 layer changed: were they ours?
            if sum(p.version for p in self._parts) != self._parts_version:
                return False
            self._changes = changes
        return all(
            p.get("weight") is w and w.dtype == torch.float32
            for p, w in zip(self._norm_params, norms + self._output_norms + self._head_norms, strict=True)
        )

    @staticmethod
    def _norm(norm: Any, eps: set[float], gemma: bool) -> torch.Tensor:
        """A norm's weight, its epsilon added to ``eps``; Gemma's norms (which multiply by ``1 + w``) only
        in a Gemma model, and only there."""
        name = type(norm).__name__
        if not name.endswith("RMSNorm") or norm.weight.dtype != torch.float32:
            raise TypeError(f"{name} is not a float32 RMS norm")
        if (name in GEMMA_NORMS) != gemma:
            raise TypeError(f"{name} in a {'Gemma' if gemma else 'non-Gemma'} model")
        value = getattr(norm, "variance_epsilon", None)
        eps.add(float(norm.eps if value is None else value))
        return norm.weight

    @staticmethod
    def _packed(module: Any, kind: type) -> Any:
        packed = getattr(module, "packed", None)
        if type(module) is not kind or packed is None:
            raise TypeError(f"{type(module).__name__} is not a packed fp16 layer")
        return packed

    def _fitting(self, cache: Any) -> list[Any] | None:
        """The cache's layers if the model fits the native step and the cache lets us write into it."""
        # Looking up 200 layers costs about 1 ms a step, so it is done again only when the
        # model's layers were swapped or fused (engine.quant.apply.layout_version), the head
        # changed, a collected layer took new weights (its version), or a norm's weight is not
        # the tensor collected (a check of some 60 attributes and 200 counters, tens of us);
        # a model that does not fit is remembered as such until a swap, a fusing or a new head.
        seen = (layout_version(self.model), id(getattr(self.model, "lm_head", None)))
        if seen == self._seen and self._collected is not None and not self._current(self._collected[0]):
            self._seen = None
        if seen != self._seen:
            try:
                self._collected = self.collect()
            except (TypeError, AttributeError, ValueError):
                self._collected = None
            self._seen = seen
        if self._collected is None:
            return None
        layers = cache.layers
        if self._writable != (id(layers), len(layers)):
            while len(layers) < len(self.model.model.layers):
                layers.append(cache.layer_class_to_replicate())
            if not all(
                callable(getattr(layer, "reserve", None)) and callable(getattr(layer, "advance", None))
                for layer in layers
            ):
                return None  # not a cache that lets a caller write into its buffers
            self._writable = (id(layers), len(layers))
        return list(layers)

    def _stepper(self) -> Any | None:
        """The native step (``engine.quant.native``) for the weights collected; None while it is not built."""
        built = native.module()
        if built is None or self._collected is None:
            return None
        if self._native is None or self._native[0] is not self._collected:
            norms, weights, (q_size, kv_size, intermediate), eps = self._collected
            try:
                shape = (self.fast.head_dim, q_size, kv_size, intermediate, eps, float(self.fast.scaling))
                if self.kind == "gguf":
                    step = built.gguf_stepper(norms, weights, self._types, *shape)
                else:
                    step = (built.q8_stepper if self.kind == "q8" else built.Stepper)(norms, weights, *shape)
                if self._head_norms:
                    step.set_head_norms(self._head_norms)
                if self._output_norms:
                    step.set_gemma(self._output_norms)
                plan = getattr(self.fast, "plan", None)
                windows = [w or 0 for w in getattr(plan, "windows", ())]
                if any(windows):
                    step.set_windows(windows)
                caps = (getattr(plan, "softcap", None) or 0.0, getattr(plan, "final_softcap", None) or 0.0)
                if any(caps):
                    step.set_soft_caps(*caps)
                kinds, tables = self._rope_kinds()
                if len(kinds) > 1:
                    step.set_rotary_tables(tables)
            except RuntimeError as exc:  # a shape it does not take (e.g. head_dim over 1024): the eager path runs
                log.warning("native decode step not used for this model: %s", str(exc).splitlines()[0])
                step = None
            self._native = (self._collected, step)
        return self._native[1]

    def _rope_kinds(self) -> tuple[list[str | None], list[int]]:
        """The rotary tables (Gemma 3: one a layer type, sorted; else one, None) and each layer's table."""
        types = getattr(self.fast, "rope_types", None)
        if not types:
            return [None], []
        kinds: list[str | None] = sorted(set(types))
        return kinds, [kinds.index(t) for t in types]

    def _cos_sin(self, past: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, head_dim] of positions past..past+n-1 ([tables, n, head_dim] where layers rotate
        with tables of their own: Gemma 3), from a table kept while the rotary module is."""
        rotary = self.model.model.rotary_emb
        kinds, _ = self._rope_kinds()
        like = torch.empty((1, 1, 1), dtype=torch.float32)  # the tables' dtype (every step model is float32)

        def tables(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            pairs = [rotary(like, positions) if k is None else rotary(like, positions, k) for k in kinds]
            cos, sin = torch.stack([c[0] for c, _ in pairs]), torch.stack([s[0] for _, s in pairs])
            return (cos[0], sin[0]) if len(kinds) == 1 else (cos, sin)

        key: list[int] = [id(rotary)]
        for kind in kinds:
            rope_type = getattr(rotary, "rope_type", None)
            rope_type = rope_type.get(kind) if isinstance(rope_type, dict) else rope_type
            inv = getattr(rotary, "inv_freq" if kind is None else f"{kind}_inv_freq", None)
            if rope_type not in STATIC_ROPE or not isinstance(inv, torch.Tensor):
                return tables(torch.arange(past, past + n).unsqueeze(0))  # it depends on the length
            key += [inv.data_ptr(), inv._version]
        if self._rotary is None or self._rotary[0] != tuple(key) or self._rotary[1].shape[-2] < past + n:
            size = max(2 * (past + n), 4096)
            cos, sin = tables(torch.arange(size).unsqueeze(0))  # position by position, as for one
            self._rotary = (tuple(key), cos.contiguous(), sin.contiguous())
        cos, sin = self._rotary[1][..., past : past + n, :], self._rotary[2][..., past : past + n, :]
        return (cos, sin) if len(kinds) == 1 else (cos.contiguous(), sin.contiguous())

    def _embedding(self) -> tuple[Any, float] | None:
        """The embedding's weight and the scale its module multiplies rows by (Gemma's sqrt(hidden), in the
        weight's dtype as its module multiplies; else 1); None for an embedding the step does not know."""
        embed = self.model.model.embed_tokens
        if type(embed) is GgufEmbedding:
            return embed, 1.0  # rows looked up by rows_batch (the blocks stay in the file)
        weight = embed.weight
        if weight.dtype != torch.float32 or not weight.is_contiguous():
            return None
        if not getattr(self.fast, "gemma", False):
            return (weight, 1.0) if type(embed) is torch.nn.Embedding else None
        scale = embed._buffers.get("embed_scale")
        if not type(embed).__name__.endswith("ScaledWordEmbedding") or not isinstance(scale, torch.Tensor):
            return None
        return weight, float(scale.to(weight.dtype))

    def rows(self, ids: torch.Tensor, cache: Any, all_rows: bool) -> torch.Tensor | None:
        """Logits [1, rows, vocab] for decode tokens ``ids`` [1, n] by the native step; None where it cannot run.

        rows is n with ``all_rows`` (a speculative step's verification), else 1.  Each row's
        logits are bit for bit what a call with that row alone would give (``native_step.cpp``).
        """
        out = self.rows_batch([(ids[0].tolist(), cache, all_rows)])
        return None if out is None else out[0].unsqueeze(0)

    @torch.inference_mode()
    def rows_batch(self, items: list[tuple[list[int], Any, bool]]) -> list[torch.Tensor] | None:
        """Several sequences' decode tokens in one native call (continuous batching): for each
        ``(ids, cache, all_rows)`` the logits [rows, vocab] that :meth:`rows` would give it alone (bit for
        bit: ``native_step.cpp``'s ``forward_batch``; :meth:`rows` is one sequence of it).  None where the native
        step cannot take all of them (nothing is counted in the caches then); the caller runs them on the eager
        path."""
        fitted = []
        for _, cache, _ in items:
            layers = self._fitting(cache)
            if layers is None:
                return None
            fitted.append(layers)
        step = self._stepper()
        embedded = self._embedding()
        if step is None or self._collected is None or embedded is None:
            return None
        embedding, scale = embedded
        looked_up = type(embedding) is GgufEmbedding  # the step then reads row k of these ids' rows for token k
        if looked_up:
            embedding = embedding.rows(torch.tensor([t for tokens, _, _ in items for t in tokens]))
        head_dim = self.fast.head_dim
        kv_heads = self._collected[2][1] // head_dim
        ids: list[int] = []
        coss, sins, keys, values, pasts, counts, alls = [], [], [], [], [], [], []
        base_keys, base_values, starts = [], [], []
        for (tokens, cache, all_rows), layers in zip(items, fitted, strict=True):
            n, past = len(tokens), int(cache.get_seq_length())
            cos, sin = self._cos_sin(past, n)
            like = embedding.new_empty(1, kv_heads, n, head_dim)  # shaped as the keys written
            bufs = [layer.reserve(n, like) for layer in layers]
            ids.extend(range(len(ids), len(ids) + n) if looked_up else tokens)
            coss.append(cos)
            sins.append(sin)
            keys.append([b.keys for b in bufs])
            values.append([b.values for b in bufs])
            pasts.append(past)
            counts.append(n)
            alls.append(all_rows)
            starts.append([getattr(b, "start", 0) for b in bufs])
            bases = [layer.base if start else None for layer, start in zip(layers, starts[-1], strict=True)]
            base_keys.append([like if pair is None else pair[0] for pair in bases])
            base_values.append([like if pair is None else pair[1] for pair in bases])
        if not any(any(s) for s in starts):
            base_keys, base_values, starts = [], [], []
        try:
            cos, sin = (coss[0], sins[0]) if len(items) == 1 else (torch.cat(coss, -2), torch.cat(sins, -2))
            logits = step.forward_batch(
                torch.tensor(ids), embedding, cos, sin, keys, values, pasts, counts, alls, scale,
                base_keys, base_values, starts,
            )  # fmt: skip
        except RuntimeError as exc:  # its checks failed: nothing counted in the caches; the other paths run
            log.warning("native decode step failed, not used for this model again: %s", str(exc).splitlines()[0])
            self._native = (self._collected, None)
            return None
        out, at = [], 0
        for (tokens, _, all_rows), layers in zip(items, fitted, strict=True):
            rows = len(tokens) if all_rows else 1
            out.append(logits[at : at + rows])
            at += rows
            for layer in layers:
                layer.advance(len(tokens))
        return out
