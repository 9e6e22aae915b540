"""After a reload, prefill the last used system prompts again, in the background, one chunk at a time.

A reload (another quantization mode or dtype, from the latency panel or
Settings) builds a new, empty prefix cache, so the next reply would prefill
its whole system prompt again: a cold time to first token.  Before the switch
the engine takes :func:`hot_prompts`, the token ids of the old cache's most
recently used system-prompt entries (most recent first); when the new model
reads the same vocabulary (:func:`same_vocabulary`, so the ids mean the same
text), :meth:`Rewarm.start` queues them for the new model and cache, skipping
those the cache already holds (saved on disk for this model identity).

The engine thread calls :meth:`Rewarm.step` only while its queue is empty, and
each step prefills at most ``engine.runtime.steps.PREFILL_CHUNK`` tokens with
the same ``forward`` a reply's prefill uses, so a request that arrives waits
for one chunk at most.  After each chunk the part done so far is in the cache
under a key of its own (never saved), so a request that comes first reuses
it; a prompt the cache came to hold whole meanwhile (a request with it) is
dropped.  A finished prompt is returned by ``step`` for the engine to keep as
a system-prompt entry, exactly as a reply keeps one.  Nothing here samples
or changes a reply: the KV it computes is the one a request's prefill of the
same tokens computes, so greedy output is the same with or without it.
``idle`` is set whenever nothing is queued (tests wait on it).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.model.kv import KVState, common_prefix, forward
from engine.runtime.prefix_cache import PERSISTED, PrefixCache
from engine.runtime.steps import PREFILL_CHUNK

REWARM_PROMPTS = 2  # system prompts prefilled again after a reload, most recently used first
PARTIAL = "rewarm:"  # the key prefix of a prompt's part done so far (not PERSISTED: never saved)


def hot_prompts(cache: PrefixCache | None, limit: int = REWARM_PROMPTS) -> list[list[int]]:
    """The token ids of ``cache``'s most recently used system-prompt entries, most recent first."""
    if cache is None:
        return []
    found = [list(e.tokens) for key, e in reversed(cache.entries.items()) if key.startswith(PERSISTED)]
    return found[:limit]


def same_vocabulary(old: Any, new: Any) -> bool:
    """Whether token ids of the tokenizer ``old`` mean the same text for ``new``.

    A reload in another mode or dtype reads the same tokenizer files again: the same
    folder and size answer at once (comparing two vocabularies takes about 80 ms).
    """
    if old is new:
        return True
    folder = getattr(old, "name_or_path", "")
    if folder and folder == getattr(new, "name_or_path", None) and len(old) == len(new):
        return True
    return bool(old.get_vocab() == new.get_vocab())


@dataclass
class Job:
    tokens: list[int]
    key: str  # the cache key of its part done so far
    state: KVState = field(default_factory=KVState)


class Rewarm:
    """System prompts waiting to be prefilled for one model and its prefix cache."""

    def __init__(self) -> None:
        self.jobs: deque[Job] = deque()
        self.model: Any = None
        self.cache: PrefixCache | None = None
        self.idle = threading.Event()
        self.idle.set()

    def start(self, model: Any, cache: PrefixCache, prompts: list[list[int]]) -> int:
        """Queue ``prompts`` for ``model`` and ``cache`` in place of anything queued before; return how many."""
        self.clear()
        self.model, self.cache = model, cache
        for i, tokens in enumerate(prompts):
            if tokens and not self._held(tokens):
                self.jobs.append(Job(tokens, f"{PARTIAL}{i}"))
        if self.jobs:
            self.idle.clear()
        return len(self.jobs)

    def pending(self) -> bool:
        return bool(self.jobs)

    def clear(self) -> None:
        """Forget what is queued, and its parts done so far."""
        while self.jobs:
            self._drop(self.jobs.popleft())
        self.model = self.cache = None
        self.idle.set()

    def step(self) -> KVState | None:
        """Prefill one chunk of the first queued prompt; return its state once the whole prompt is in it.

        The caller keeps a returned state, then calls :meth:`clear` when nothing is ``pending``
        (or when ``step`` raised: a half-written state is not kept).
        """
        job = self.jobs[0]
        if self._held(job.tokens):  # a request kept it meanwhile
            self._drop(self.jobs.popleft())
            return None
        begin = len(job.state)
        forward(self.model, job.state, job.tokens[begin : begin + PREFILL_CHUNK])
        if len(job.state) < len(job.tokens):
            assert self.cache is not None
            self.cache.insert(job.key, job.state)  # a request that comes first starts from here
            return None
        self._drop(self.jobs.popleft())
        return job.state

    def _held(self, tokens: list[int]) -> bool:
        """Whether the cache holds all of ``tokens`` already (a part done so far does not count)."""
        assert self.cache is not None
        return any(
            common_prefix(entry.tokens, tokens) == len(tokens)
            for key, entry in self.cache.entries.items()
            if not key.startswith(PARTIAL)
        )

    def _drop(self, job: Job) -> None:
        if self.cache is not None:
            self.cache.entries.pop(job.key, None)
