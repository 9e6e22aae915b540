"""A model's KV cache together with the token ids it holds.

:class:`KVState` keeps ``cache.get_seq_length() == len(tokens)`` at all times.

Its layers (:class:`GrowingLayer`) write new keys and values in place into a
buffer with spare room, instead of transformers' concatenation, which copies
the whole cache on every step.  Sharing is copy-on-branch: a
:meth:`KVState.snapshot` is a view of the first ``n`` positions and *pins*
them; the state that owns a buffer may keep appending past the pinned length
in place (the snapshot never sees those positions), while a state that
adopted a snapshot, or an owner cropped below a pin (regenerate, edit),
copies into a buffer of its own on its next write.  So a conversation extends
in place turn after turn, and a copy happens only when it branches.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.model.fastpath import FastForward

MIN_CAPACITY = 256
USE_FASTPATH = os.environ.get("BRISK_FASTPATH", "1") != "0"  # 0: transformers' own forward (for comparison)


class Buffer:
    """Key and value storage with room to grow, shared by snapshots."""

    __slots__ = ("keys", "values", "pinned", "_owner")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, owner: object) -> None:
        self.keys, self.values = keys, values
        # A weak reference: layer -> buffer -> layer would be a cycle, and cycles of megabyte
        # tensors wait for the garbage collector, so an evicted conversation's memory would stay
        # taken (and new buffers would fault in fresh pages) until a collection ran.
        self._owner = weakref.ref(owner)
        self.pinned = 0  # positions below this are seen by snapshots and never rewritten

    @property
    def owner(self) -> object:
        return self._owner()

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[-2])


class _CutView:
    """``keys`` or ``values`` of a :class:`GrowingLayer`: after an ``advance``, cut from its buffer when read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, layer: GrowingLayer | None, owner: type | None = None) -> Any:
        if layer is None:
            return self
        if layer._stale:
            layer._cut()
        return getattr(layer, self.slot)

    def __set__(self, layer: GrowingLayer, value: torch.Tensor | None) -> None:
        if layer._stale:
            layer._cut()
        setattr(layer, self.slot, value)


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends in place and copies only on a branch."""

    # ``keys``/``values`` are views of the first ``length`` positions of ``buf``; :meth:`advance`
    # only counts, and the views are cut when next read (a decode step advances 30 layers or so,
    # and most steps never read the views).
    keys = _CutView()  # type: ignore[assignment]
    values = _CutView()  # type: ignore[assignment]
    _keys: torch.Tensor | None = None
    _values: torch.Tensor | None = None
    _stale = False

    def __init__(self) -> None:
        super().__init__()
        self.buf: Buffer | None = None
        self.length = 0

    def _cut(self) -> None:
        self._stale = False
        assert self.buf is not None
        n = self.length
        self._keys, self._values = self.buf.keys[..., :n, :], self.buf.values[..., :n, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, m = self.length, key_states.shape[-2]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        buf = self.reserve(m, key_states)
        buf.keys[..., n : n + m, :] = key_states
        buf.values[..., n : n + m, :] = value_states
        self.advance(m)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def reserve(self, m: int, like: torch.Tensor) -> Buffer:
        """A buffer of this layer's own with room for ``m`` positions after ``length``.

        For a caller that writes those positions itself (``engine.quant.decode_step``) and then
        calls :meth:`advance`; ``like`` is a tensor shaped as the keys it will write.
        """
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        n, buf = self.length, self.buf
        if buf is None or buf.owner is not self or n < buf.pinned or n + m > buf.capacity:
            buf = self._reallocate(n + m, like)
        return buf

    def advance(self, m: int) -> None:
        """Count ``m`` positions written after ``length`` into the reserved buffer."""
        assert self.buf is not None
        self.length += m
        self._stale = True  # the views are cut when next read

    def _reallocate(self, needed: int, like: torch.Tensor) -> Buffer:
        # Room for a quarter more (at least MIN_CAPACITY tokens): growth stays amortised while a
        # branch of a long shared prefix does not double its memory for a short reply.
        shape = list(like.shape)
        shape[-2] = needed + max(MIN_CAPACITY, needed // 4)
        keys = like.new_empty(shape)
        values = like.new_empty(shape)
        assert self.keys is not None and self.values is not None
        keys[..., : self.length, :] = self.keys[..., : self.length, :]
        values[..., : self.length, :] = self.values[..., : self.length, :]
        self.buf = Buffer(keys, values, self)
        return self.buf

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        shape = list(key_states.shape)
        shape[-2] = 0
        self.keys = key_states.new_empty(shape)
        self.values = value_states.new_empty(shape)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        assert self.keys is not None and self.values is not None
        self.keys, self.values = self.keys[..., : self.length, :], self.values[..., : self.length, :]

    def pin(self, length: int) -> None:
        if self.buf is not None:
            self.buf.pinned = max(self.buf.pinned, length)

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start from a snapshot's views; the first write copies them (a branch)."""
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.length = keys, values, int(keys.shape[-2])


def new_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layers = []
    cache.layer_class_to_replicate = GrowingLayer
    return cache


Snapshot = tuple[tuple[torch.Tensor, torch.Tensor], ...]


class KVState:
    def __init__(self, cache: DynamicCache | None = None, tokens: list[int] | None = None) -> None:
        self.cache = cache if cache is not None else new_cache()
        self.tokens: list[int] = list(tokens or [])

    def __len__(self) -> int:
        return len(self.tokens)

    def cache_length(self) -> int:
        return int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens."""
        drop = len(self.tokens) - length
        if drop > 0:
            self.cache.crop(-drop)
            del self.tokens[length:]

    def snapshot(self, length: int | None = None) -> Snapshot:
        """Views of the first ``length`` positions, pinned so no later write changes them."""
        n = len(self.tokens) if length is None else length
        layers = self._layers()
        for layer in layers:
            if isinstance(layer, GrowingLayer):
                layer.pin(n)
        return tuple((layer.keys[..., :n, :], layer.values[..., :n, :]) for layer in layers)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, tokens: list[int], length: int | None = None) -> KVState:
        """A state holding the first ``length`` tokens of ``snap`` without copying tensors."""
        n = len(tokens) if length is None else length
        cache = new_cache()
        for keys, values in snap:
            layer = GrowingLayer()
            layer.adopt(keys[..., :n, :], values[..., :n, :])
            cache.layers.append(layer)
        return cls(cache, tokens[:n])

    def _layers(self) -> list[Any]:
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def nbytes(self) -> int:
        return snapshot_nbytes(self.snapshot()) if self.tokens else 0


def snapshot_nbytes(snap: Snapshot) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in snap)


def fast_forward(model: Any) -> FastForward | None:
    """The model's lean forward (see ``engine.model.fastpath``), made once per model; None if it has none."""
    if "_brisk_fast" not in model.__dict__:
        model.__dict__["_brisk_fast"] = FastForward.for_model(model) if USE_FASTPATH else None
    return model.__dict__["_brisk_fast"]


@torch.inference_mode()
def forward(model: Any, state: KVState, ids: list[int], all_logits: bool = False, decode: bool = False) -> torch.Tensor:
    """Run ``ids`` through the model on top of ``state``; return logits [n, vocab] (or [1, vocab]).

    ``decode``: ``ids`` are decode tokens (a step's token and its drafts), not a prompt (see
    ``engine.model.fastpath``: fp16-cpu models decode with the native step).
    """
    input_ids = torch.tensor([ids], device=model.device)
    keep = 0 if all_logits else 1
    fast = fast_forward(model)
    if fast is not None:
        logits = fast(input_ids, state.cache, keep, decode)
    else:
        logits = model(input_ids=input_ids, cache=state.cache, use_cache=True, logits_to_keep=keep).logits
    state.tokens.extend(ids)
    return logits[0].float()


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists.

    Compares slices (a C-level list comparison) and bisects on the first mismatch, so a
    1,200-token prompt costs a few microseconds, not a tensor build per call.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@torch.inference_mode()
def forward_many(model: Any, jobs: list[tuple[KVState, list[int], bool]]) -> list[torch.Tensor]:
    """Decode tokens of several states in one model step (continuous batching): for each ``(state, ids,
    all_logits)`` what ``forward(model, state, ids, all_logits, decode=True)`` gives it alone, bit for bit.
    One native call reads the weights once for every row (fp16-cpu and q8-cpu, ``engine.quant.decode_step``);
    any other model runs the jobs one after another."""
    fast = fast_forward(model)
    out = None
    if fast is not None and fast.native is not None and len(jobs) > 1:
        items = [(ids, state.cache, all_logits or len(ids) == 1) for state, ids, all_logits in jobs]
        out = fast.native.rows_batch(items)
    if out is None:
        return [forward(model, state, ids, all_logits, decode=True) for state, ids, all_logits in jobs]
    for (state, ids, _), _logits in zip(jobs, out, strict=True):
        state.tokens.extend(ids)
    return [logits.float() for logits in out]
