"""Moving cached keys to other positions: the re-rotation llama.cpp's ``--cache-reuse`` shifts KV with.

Brisk stores keys after the rotary embedding (``engine.model.fastpath`` rotates
them before ``GrowingLayer.append``; the native decode step writes them the same
way), so a key computed at position ``p`` is ``R(p) k``, with ``R(p)`` a rotation
of each pair of dimensions ``(i, i + half)`` by the angle ``p * inv_freq[i]``
(transformers' ``rotate_half`` layout).  Rotations of one plane compose, so
``R(d) R(p) k == R(p + d) k``: :meth:`RopeShift.shift` moves keys by ``d``
positions without the key before its rotation.  Values carry no position and
move as they are.  A shifted key is what the same token would have given at its
new position, but the token still attended to its old left context, so reusing
shifted KV is an approximation (as in llama.cpp): opt-in, never on by default.
:func:`moved_state` builds a state from such moves (``engine.runtime.prefix_cache``
says which).

:meth:`RopeShift.for_model` takes the models whose every layer rotates all of
its head's dimensions with one static table (rope types ``default``, ``linear``,
``llama3``: Llama, Mistral, Qwen2, Qwen3; YaRN's scale multiplies a key, which a
further rotation keeps) and raises ``ValueError`` saying why for the rest (a
table that depends on the length, Phi-3's partial rotary, Gemma 3's two tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.model.kv import GrowingLayer, KVState, LayerSnapshot, Pair, Snapshot, fast_forward

STATIC = ("default", "linear", "llama3", "yarn")  # inv_freq does not depend on the sequence's length


class RopeShift:
    """Re-rotates keys by a position delta for one model's rotary embedding."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        self.inv_freq = inv_freq.detach().to(torch.float64).cpu()  # [head_dim / 2]

    @classmethod
    def for_model(cls, model: Any) -> RopeShift:
        """The shift for ``model``'s rotary embedding; ``ValueError`` (saying why) when it is not one it handles."""
        inner = getattr(model, "model", None)
        rotary = getattr(inner, "rotary_emb", None)
        config = getattr(model, "config", None)
        name = getattr(config, "model_type", type(model).__name__)
        fast = fast_forward(model)
        cannot = f"Cache reuse cannot move the KV of a {name} model:"
        if rotary is None or fast is None:
            raise ValueError(f"{cannot} its rotary embedding is not one Brisk knows.")
        if getattr(fast, "rope_types", None) is not None:
            raise ValueError(f"{cannot} its layers rotate with tables of their own.")
        rope_type = getattr(rotary, "rope_type", "default")
        inv = getattr(rotary, "inv_freq", None)
        if rope_type not in STATIC or not isinstance(inv, torch.Tensor):
            raise ValueError(f"{cannot} its rotary embedding ({rope_type}) depends on the length of the text.")
        head_dim = int(getattr(fast, "head_dim", 0))
        if 2 * int(inv.numel()) != head_dim:
            raise ValueError(f"{cannot} it rotates {2 * int(inv.numel())} of each head's {head_dim} dimensions.")
        return cls(inv)

    def shift(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """``keys`` [..., positions, head_dim] rotated as if each were ``delta`` positions later (a new tensor)."""
        if delta == 0:
            return keys.clone()
        angle = float(delta) * self.inv_freq  # float64: a delta of thousands keeps its angle exact
        cos = torch.cat([angle.cos(), angle.cos()]).to(torch.float32)
        sin = torch.cat([angle.sin(), angle.sin()]).to(torch.float32)
        k = keys.to(torch.float32)
        half = k.shape[-1] // 2
        rotated = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        return (k * cos + rotated * sin).to(keys.dtype)


Move = tuple[int, int, int]  # (from, to, length): cached positions from..from+length-1 go to to..to+length-1


def span(parts: LayerSnapshot, start: int, end: int) -> Pair:
    """Keys and values of positions ``start`` .. ``end - 1`` of a layer's segments (views where one segment holds
    them, else a copy)."""
    keys, values, at = [], [], 0
    for k, v in parts:
        m = int(k.shape[-2])
        lo, hi = max(start, at), min(end, at + m)
        if lo < hi:
            keys.append(k[..., lo - at : hi - at, :])
            values.append(v[..., lo - at : hi - at, :])
        at += m
    if len(keys) == 1:
        return keys[0], values[0]
    return torch.cat(keys, -2), torch.cat(values, -2)


@torch.inference_mode()
def moved_state(
    snapshot: Snapshot,
    cached: list[int],
    prompt: list[int],
    prefix: int,
    moves: list[Move],
    rope: RopeShift,
    compute: Callable[[KVState, list[int]], object] | None = None,
) -> KVState:
    """A state holding ``prompt[:prefix]`` from ``snapshot`` of the ``cached`` tokens (shared, not copied), then
    each move's cached positions in order, their keys re-rotated to where they go.  The prompt's tokens between
    one move and a later one's target are computed first with ``compute(state, ids)`` (``engine.model.kv
    .forward``), counted in the state's ``computed``."""
    state = KVState.from_snapshot(snapshot, cached, prefix)
    for source, target, length in moves:
        if target > len(state):
            if compute is None:
                raise ValueError(f"the tokens before position {target} must be computed, and nothing computes them")
            state.computed += target - len(state)
            compute(state, prompt[len(state) : target])
        if target != len(state):
            raise ValueError(f"a move to position {target} does not follow the state's {len(state)} positions")
        for layer, parts in zip(state.cache.layers, snapshot, strict=True):
            assert isinstance(layer, GrowingLayer)  # from_snapshot makes them so
            k, v = span(parts, source, source + length)
            layer.append(rope.shift(k, target - source), v)
        state.tokens.extend(cached[source : source + length])
    return state
