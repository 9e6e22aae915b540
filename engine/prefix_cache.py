"""Prefix cache: reuse the KV of any earlier prompt that starts the same way.

Entries are whole token sequences with a KV snapshot each, in LRU order.  A
lookup compares the new prompt with every entry (a vectorised compare per
entry; with a few dozen entries it costs well under a millisecond, far less
than one prefill token) and returns a state holding the longest common prefix,
always leaving at least one prompt token to compute.  We chose this over a
radix tree or hashed blocks because a desktop app holds few, long sequences;
matching is exact at token granularity (no block rounding), and snapshots are
views of immutable tensors (see ``engine.kv``), so reuse copies nothing.

Entries are keyed: a conversation's entry is replaced by its next turn, and
system prompts get entries of their own so other conversations find them.
Bytes are counted per tensor storage, so shared views are not counted twice;
entries past ``budget_bytes`` are evicted least recently used first.  One cache
belongs to one model identity (model, dtype, quantization): the engine makes a
new cache when the model changes, so entries never mix.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from engine.decode import common_prefix
from engine.kv import KVState, Snapshot


@dataclass
class Entry:
    tokens: list[int]
    snapshot: Snapshot
    last_used: float


class PrefixCache:
    def __init__(self, identity: str, budget_bytes: int = 512 << 20) -> None:
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def lookup(self, prompt: list[int], prefer: str | None = None) -> KVState:
        """A state holding the longest cached prefix of ``prompt`` (at most len - 1 tokens)."""
        best_key, best_len = None, 0
        keys = list(self.entries)
        if prefer in self.entries:
            keys.insert(0, keys.pop(keys.index(prefer)))
        for key in keys:
            entry = self.entries[key]
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            self.misses += 1
            return KVState()
        self.hits += 1
        entry = self.entries[best_key]
        entry.last_used = time.monotonic()
        self.entries.move_to_end(best_key)
        return KVState.from_snapshot(entry.snapshot, entry.tokens, best_len)

    def insert(self, key: str, state: KVState, length: int | None = None) -> None:
        n = len(state) if length is None else min(length, len(state))
        if n == 0:
            return
        self.entries[key] = Entry(state.tokens[:n], state.snapshot(n), time.monotonic())
        self.entries.move_to_end(key)
        self.evict()

    def drop(self, key: str) -> None:
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()

    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for entry in self.entries.values():
            for pair in entry.snapshot:
                for tensor in pair:
                    storage = tensor.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def evict(self) -> None:
        while len(self.entries) > 1 and self.nbytes() > self.budget_bytes:
            self.entries.popitem(last=False)
        if self.entries and self.nbytes() > self.budget_bytes:
            self.entries.clear()
