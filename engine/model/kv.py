"""A model's KV cache together with the token ids it holds.

:class:`KVState` keeps ``cache.get_seq_length() == len(tokens)`` at all times.

Its layers (:class:`GrowingLayer`) write new keys and values in place into a
buffer with spare room, instead of transformers' concatenation, which copies
the whole cache on every step.  Sharing copies nothing: a
:meth:`KVState.snapshot` is a view of the first ``n`` positions and *pins*
them; the state that owns a buffer may keep appending past the pinned length
in place (the snapshot never sees those positions), and a state that adopted
a snapshot keeps reading the shared positions where they are and writes its
own after them in a buffer of its own (an owner cropped below a pin copies
its own positions into a new buffer).  So a conversation extends in place
turn after turn, and a new chat about a 3,500-token document shares the
document's KV instead of copying 160 MB of it.
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


Pair = tuple[torch.Tensor, torch.Tensor]  # keys and values, [1, KV heads, positions, head dim]
LayerSnapshot = tuple[Pair, ...]  # a layer's positions in order: one segment, or a shared prefix and the rest


class Buffer:
    """Key and value storage with room to grow, shared by snapshots.

    Index 0 holds position ``start``: a branch's buffer holds only the positions after the prefix it shares.
    """

    __slots__ = ("keys", "values", "start", "pinned", "_owner")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, owner: object, start: int = 0) -> None:
        self.keys, self.values = keys, values
        # A weak reference: layer -> buffer -> layer would be a cycle, and cycles of megabyte
        # tensors wait for the garbage collector, so an evicted conversation's memory would stay
        # taken (and new buffers would fault in fresh pages) until a collection ran.
        self._owner = weakref.ref(owner)
        self.start = start
        self.pinned = 0  # positions below this are seen by snapshots and never rewritten

    @property
    def owner(self) -> object:
        return self._owner()

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[-2])

    @property
    def end(self) -> int:
        """The position after the last one the buffer has room for."""
        return self.start + self.capacity


class _Borrowed:
    """The owner of a :class:`Buffer` that wraps another layer's positions (``GrowingLayer.adopt``): never
    the layer reading it, so its first write copies them into a buffer of its own."""


_BORROWED = _Borrowed()


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
    """A ``DynamicLayer`` that appends in place and never copies a prefix it shares.

    Its positions are two segments: ``base``, views of the first positions of another buffer (a snapshot's,
    pinned there, so never rewritten), and its own buffer after them.  Attention reads both where it runs
    on :meth:`segments` (the eager path in ``engine.model.fastpath``, the native step); reading ``keys`` or
    ``values`` of a layer with both joins them into one buffer of its own (a copy), for any other reader.
    """

    # ``keys``/``values`` are views of the first ``length`` positions; :meth:`advance` only counts, and the
    # views are cut when next read (a decode step advances 30 layers or so, and most steps never read them).
    keys = _CutView()  # type: ignore[assignment]
    values = _CutView()  # type: ignore[assignment]
    _keys: torch.Tensor | None = None
    _values: torch.Tensor | None = None
    _stale = False

    def __init__(self) -> None:
        super().__init__()
        self.buf: Buffer | None = None
        self.base: Pair | None = None  # the shared prefix: positions 0 .. base_len - 1
        self.length = 0

    @property
    def base_len(self) -> int:
        return 0 if self.base is None else int(self.base[0].shape[-2])

    def segments(self, length: int | None = None) -> LayerSnapshot:
        """Views of the first ``length`` positions (all by default): the shared prefix, then the layer's own."""
        n = self.length if length is None else length
        shared = self.base_len
        if self.base is not None and n <= shared:
            return ((self.base[0][..., :n, :], self.base[1][..., :n, :]),)
        if self.buf is None:  # nothing written yet
            return ((self._keys, self._values),) if self._keys is not None and self._values is not None else ()
        own = (self.buf.keys[..., : n - shared, :], self.buf.values[..., : n - shared, :])
        return (own,) if self.base is None else (self.base, own)

    def _cut(self) -> None:
        if self.base is not None and self.length > self.base_len:
            self._join()
        self._stale = False
        parts = self.segments()
        if parts:
            self._keys, self._values = parts[0]

    def _join(self, needed: int = 0) -> Buffer:
        """One buffer of the layer's own for all its positions (a copy of the shared prefix), with room up to
        position ``needed``."""
        assert self.base is not None
        parts = self.segments()
        n = max(self.length, needed)
        shape = list(parts[0][0].shape)
        shape[-2] = n + max(MIN_CAPACITY, n // 4)
        keys, values = parts[0][0].new_empty(shape), parts[0][1].new_empty(shape)
        at = 0
        for k, v in parts:
            m = int(k.shape[-2])
            keys[..., at : at + m, :] = k
            values[..., at : at + m, :] = v
            at += m
        self.base = None
        self.buf = Buffer(keys, values, self)
        self._stale = True
        return self.buf

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' cache API: append, and return all keys and values as one tensor each."""
        self.append(key_states, value_states)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> LayerSnapshot:
        """Write new positions after ``length``; return :meth:`segments` (no copy of a shared prefix)."""
        n, m = self.length, key_states.shape[-2]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        buf = self.reserve(m, key_states)
        at = n - buf.start
        buf.keys[..., at : at + m, :] = key_states
        buf.values[..., at : at + m, :] = value_states
        self.advance(m)
        return self.segments()

    def reserve(self, m: int, like: torch.Tensor) -> Buffer:
        """A buffer of this layer's own with room for ``m`` positions after ``length``.

        For a caller that writes those positions itself (``engine.quant.decode_step``: position ``p`` at
        index ``p - start``) and then calls :meth:`advance`; ``like`` is a tensor shaped as the keys it will write.
        """
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        n, buf = self.length, self.buf
        if buf is None or buf.owner is not self or n < buf.pinned or n < buf.start or n + m > buf.end:
            buf = self._reallocate(n + m, like)
        return buf

    def advance(self, m: int) -> None:
        """Count ``m`` positions written after ``length`` into the reserved buffer."""
        assert self.buf is not None
        self.length += m
        self._stale = True  # the views are cut when next read

    def _reallocate(self, needed: int, like: torch.Tensor) -> Buffer:
        # The positions after the shared prefix, with room for a quarter more (at least MIN_CAPACITY
        # tokens): growth stays amortised while a branch of a long shared prefix holds only its own.
        # Once its own would outgrow the prefix (a document prefilled on top of a system prompt), the
        # prefix is copied in too: a copy no larger than what is written, and one segment for whoever
        # shares this layer's positions next (a branch of a branch shares the first and copies the rest).
        start = self.base_len
        if self.base is not None and needed - start > start:
            return self._join(needed)
        own = needed - start
        shape = list(like.shape)
        shape[-2] = own + max(MIN_CAPACITY, own // 4)
        keys = like.new_empty(shape)
        values = like.new_empty(shape)
        mine = self.length - start
        if mine > 0:
            assert self.buf is not None
            at = start - self.buf.start
            keys[..., :mine, :] = self.buf.keys[..., at : at + mine, :]
            values[..., :mine, :] = self.buf.values[..., at : at + mine, :]
        self.buf = Buffer(keys, values, self, start)
        self._stale = True
        return self.buf

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        shape = list(key_states.shape)
        shape[-2] = 0
        self._keys = key_states.new_empty(shape)
        self._values = value_states.new_empty(shape)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.base is not None and self.length <= self.base_len:
            self.base = (self.base[0][..., : self.length, :], self.base[1][..., : self.length, :])
            self.buf = None  # nothing of its own left
        self._stale = True

    def pin(self, length: int) -> None:
        if self.buf is not None and length > self.buf.start:
            self.buf.pinned = max(self.buf.pinned, length)

    def adopt(self, parts: LayerSnapshot) -> None:
        """Start from a snapshot's views: its first segment is shared (never copied), a second (a branch of a
        branch: the positions after the shared prefix) is copied when this layer first writes, so a state
        made to read (a reply's first token from a hint's logits) copies nothing before it."""
        first = parts[0]
        # what lazy_initialization sets, without its empty tensors: the views are cut from the segments
        self.device, self.is_initialized = first[0].device, True
        self._keys, self._values = first
        shared = int(first[0].shape[-2])
        self.base, self.buf, self.length = (first if shared else None), None, shared
        if len(parts) > 1:  # read where they are until this layer first writes (reserve then copies them)
            k, v = parts[1]
            self.buf = Buffer(k, v, _BORROWED, shared)
            self.length += int(k.shape[-2])
        self._stale = True


def new_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layers = []
    cache.layer_class_to_replicate = GrowingLayer
    return cache


Snapshot = tuple[LayerSnapshot, ...]  # one a layer


def cut_segments(parts: LayerSnapshot, n: int) -> LayerSnapshot:
    """The first ``n`` positions of a layer's segments."""
    if n >= sum(int(k.shape[-2]) for k, _ in parts):
        return parts  # all of them: no views to cut
    out: list[Pair] = []
    for k, v in parts:
        m = min(n, int(k.shape[-2]))
        if m > 0 or not out:
            out.append((k[..., :m, :], v[..., :m, :]))
        n -= m
        if n <= 0:
            break
    return tuple(out)


def joined(snap: Snapshot) -> tuple[Pair, ...]:
    """One contiguous (keys, values) a layer: the segments joined (a copy where there are two)."""
    out = []
    for parts in snap:
        if len(parts) == 1:
            out.append((parts[0][0].contiguous(), parts[0][1].contiguous()))
        else:
            out.append((torch.cat([k for k, _ in parts], -2), torch.cat([v for _, v in parts], -2)))
    return tuple(out)


def plain(pairs: tuple[Pair, ...] | list[Pair]) -> Snapshot:
    """A snapshot of one segment a layer (saved KV read back)."""
    return tuple((pair,) for pair in pairs)


class KVState:
    def __init__(self, cache: DynamicCache | None = None, tokens: list[int] | None = None) -> None:
        self.cache = cache if cache is not None else new_cache()
        self.tokens: list[int] = list(tokens or [])
        # of a state a lookup made: positions computed while it was made (cache reuse's gaps), not cached ones
        self.computed = 0

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
        out: list[LayerSnapshot] = []
        for layer in self._layers():
            if isinstance(layer, GrowingLayer):
                layer.pin(n)
                out.append(layer.segments(n))
            else:
                out.append(((layer.keys[..., :n, :], layer.values[..., :n, :]),))
        return tuple(out)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, tokens: list[int], length: int | None = None) -> KVState:
        """A state holding the first ``length`` tokens of ``snap``: it shares the first segment of each layer
        (no copy, ever) and reads a second one (a branch of a branch: the positions after the shared prefix)
        where it is until its first write copies it (:meth:`GrowingLayer.adopt`)."""
        n = len(tokens) if length is None else length
        cache = new_cache()
        for parts in snap:
            layer = GrowingLayer()
            layer.adopt(cut_segments(parts, n))
            cache.layers.append(layer)
        return cls(cache, tokens[:n])

    def _layers(self) -> list[Any]:
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def nbytes(self) -> int:
        return snapshot_nbytes(self.snapshot()) if self.tokens else 0


def snapshot_nbytes(snap: Snapshot) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for parts in snap for k, v in parts)


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
