"""A model's KV cache together with the token ids it holds.

:class:`KVState` keeps ``cache.get_seq_length() == len(tokens)`` at all times.
Transformers' ``DynamicLayer`` grows by concatenation, which makes new tensors,
so a :meth:`KVState.snapshot` (views of the current tensors) is never changed by
later decoding: snapshots can be shared by many conversations, and a copy is
made only when one of them grows again (copy on write, for free).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

Snapshot = tuple[tuple[torch.Tensor, torch.Tensor], ...]


class KVState:
    def __init__(self, cache: DynamicCache | None = None, tokens: list[int] | None = None) -> None:
        self.cache = cache if cache is not None else DynamicCache()
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
        n = len(self.tokens) if length is None else length
        return tuple((layer.keys[..., :n, :], layer.values[..., :n, :]) for layer in self._layers())

    @classmethod
    def from_snapshot(cls, snap: Snapshot, tokens: list[int], length: int | None = None) -> KVState:
        """A state holding the first ``length`` tokens of ``snap`` without copying tensors."""
        n = len(tokens) if length is None else length
        layers: list[Any] = []
        for keys, values in snap:
            layer = DynamicLayer()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys[..., :n, :], values[..., :n, :]
            layers.append(layer)
        cache = DynamicCache()
        cache.layers = layers
        return cls(cache, tokens[:n])

    def _layers(self) -> list[Any]:
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def nbytes(self) -> int:
        return snapshot_nbytes(self.snapshot()) if self.tokens else 0


def snapshot_nbytes(snap: Snapshot) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in snap)


def storage_ids(snap: Snapshot) -> set[int]:
    return {t.untyped_storage().data_ptr() for pair in snap for t in pair}


@torch.inference_mode()
def forward(model: Any, state: KVState, ids: list[int], all_logits: bool = False) -> torch.Tensor:
    """Run ``ids`` through the model on top of ``state``; return logits [n, vocab] (or [1, vocab])."""
    device = model.device
    out = model(
        input_ids=torch.tensor([ids], device=device),
        cache=state.cache,
        use_cache=True,
        logits_to_keep=0 if all_logits else 1,
    )
    state.tokens.extend(ids)
    return out.logits[0].float()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ta, tb = torch.tensor(a[:n]), torch.tensor(b[:n])
    diff = (ta != tb).nonzero()
    return int(diff[0]) if diff.numel() else n
