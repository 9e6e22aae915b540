"""Prefix cache: reuse the KV of any earlier prompt that starts the same way.

Entries are whole token sequences with a KV snapshot each, in LRU order.  A
lookup compares the new prompt with every entry (a vectorised compare per
entry; with a few dozen entries it costs well under a millisecond, far less
than one prefill token) and returns a state holding the longest common prefix,
always leaving at least one prompt token to compute.  We chose this over a
radix tree or hashed blocks because a desktop app holds few, long sequences;
matching is exact at token granularity (no block rounding), and snapshots are
views of immutable tensors (see ``engine.model.kv``), so reuse copies nothing.

System-prompt entries are saved to disk (``save``/``load``) so the first
message after a restart is warm too; the file records the model identity and
is ignored when it does not match.

Entries are keyed: a conversation's entry is replaced by its next turn, and
system prompts get entries of their own so other conversations find them.
Bytes are counted per tensor storage, so shared views are not counted twice;
entries past ``budget_bytes`` are evicted least recently used first.  One cache
belongs to one model identity (model, dtype, quantization): the engine makes a
new cache when the model changes, so entries never mix.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from engine.model.kv import KVState, Snapshot, common_prefix

PERSISTED = "system:"  # entries with keys starting so are saved for the next start


@dataclass
class Entry:
    tokens: list[int]
    snapshot: Snapshot
    live: KVState | None = None  # the state itself, handed back so its owner keeps growing in place


class PrefixCache:
    def __init__(self, identity: str, budget_bytes: int = 512 << 20) -> None:
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first

    def lookup(self, prompt: list[int], prefer: str | None = None) -> KVState:
        """A state holding the longest cached prefix of ``prompt`` (at most len - 1 tokens)."""
        best_key, best_len = None, 0
        keys = list(self.entries)
        if prefer is not None and prefer in self.entries:
            keys.insert(0, keys.pop(keys.index(prefer)))
        for key in keys:
            entry = self.entries[key]
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return KVState()
        entry = self.entries[best_key]
        self.entries.move_to_end(best_key)
        if best_key == prefer and entry.live is not None:
            live, entry.live = entry.live, None
            live.crop(best_len)  # the owner continues: in place, unless cropped below a pin
            return live
        return KVState.from_snapshot(entry.snapshot, entry.tokens, best_len)  # another conversation: a branch

    def insert(self, key: str, state: KVState, length: int | None = None, live: bool = False) -> None:
        """Keep the first ``length`` tokens of ``state``; ``live``: also keep the state to extend it later."""
        n = len(state) if length is None else min(length, len(state))
        if n == 0:
            return
        for entry in self.entries.values():
            if entry.live is state:
                entry.live = None  # one live owner per state
        self.entries[key] = Entry(state.tokens[:n], state.snapshot(n), state if live else None)
        self.entries.move_to_end(key)
        self.evict()

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

    def save(self, path: Path) -> int:
        """Write the system-prompt entries to ``path``; return how many."""
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, list[int]] = {}
        for key, entry in self.entries.items():
            if not key.startswith(PERSISTED):
                continue
            meta[key] = entry.tokens
            for i, (k, v) in enumerate(entry.snapshot):
                tensors[f"{key}|{i}|k"] = k.contiguous()
                tensors[f"{key}|{i}|v"] = v.contiguous()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata={"identity": self.identity, "entries": json.dumps(meta)})
        os.replace(tmp, path)
        return len(meta)

    def load(self, path: Path) -> int:
        """Add saved system-prompt entries from ``path`` if they belong to this model; return how many."""
        if not path.is_file():
            return 0
        try:
            with safe_open(str(path), "pt") as fh:
                meta = fh.metadata() or {}
            if meta.get("identity") != self.identity:
                return 0
            entries = json.loads(meta["entries"])
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError, KeyError):
            return 0  # a damaged file only costs a cold start
        for key, tokens in entries.items():
            layers = []
            i = 0
            while f"{key}|{i}|k" in tensors:
                layers.append((tensors[f"{key}|{i}|k"], tensors[f"{key}|{i}|v"]))
                i += 1
            if layers and all(k.shape[-2] == len(tokens) for k, _ in layers):
                self.entries[key] = Entry(list(tokens), tuple(layers))
        self.evict()
        return len(entries)
