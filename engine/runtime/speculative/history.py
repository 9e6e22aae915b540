"""Drafts from the whole local history: every earlier reply's tokens, indexed by their n-grams.

Suffix decoding (vLLM's, over earlier outputs) in its simplest form: replies on one
machine repeat phrasings, lists, code and boilerplate across questions that are not
alike, where :class:`~engine.runtime.speculative.drafters.AnswerDrafts` (similar
questions) and :class:`~engine.runtime.speculative.drafters.PromptLookup` (this
conversation) find nothing.  :class:`HistoryIndex` keeps the token ids of earlier
replies (the engine adds every finished one and the history the window seeds) and maps
each n-gram of them, for n in ``ORDERS`` (longest first), to where it last occurred;
:meth:`HistoryIndex.continuation` finds the longest n-gram ending the context and
returns what followed it there.  A lookup is a few dictionary probes (microseconds),
so a context it has nothing for costs nothing a user could see; the controller asks
such a source less often anyway (``Controller.record_empty``).  Drafts are only
proposals: the target verifies them, so greedy output is unchanged.

Memory is bounded: past ``capacity`` tokens the oldest replies go, and the index is
rebuilt without them once their stale entries are as many as the live ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.api import Sampling

ORDERS = (8, 5, 3)  # n-gram lengths tried, longest first: a long match predicts better
MIN_REPLY = 4  # shorter replies hold no n-gram worth indexing


class HistoryIndex:
    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity  # tokens kept at most
        self._replies: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (reply number, where it ends)
        self._next = 0
        self._tokens = 0
        self._stale = 0  # index entries that may point at replies gone

    def __len__(self) -> int:
        return len(self._replies)

    def add(self, ids: Sequence[int]) -> None:
        """Index one reply's token ids (the newest occurrence of an n-gram wins)."""
        reply = tuple(int(t) for t in ids)
        if len(reply) < MIN_REPLY:
            return
        number = self._next
        self._next += 1
        self._replies[number] = reply
        self._tokens += len(reply)
        self._put(number, reply)
        while self._tokens > self.capacity and len(self._replies) > 1:
            _, gone = self._replies.popitem(last=False)
            self._tokens -= len(gone)
            self._stale += len(gone) * len(ORDERS)
        if self._stale > len(self._index) // 2:
            self._rebuild()

    def continuation(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest indexed n-gram ending ``context``."""
        for n in ORDERS:
            if len(context) < n:
                continue
            tail = tuple(context[-n:])
            hit = self._index.get(tail)
            if hit is None:
                continue
            reply = self._replies.get(hit[0])
            end = hit[1]
            if reply is None or reply[end - n : end] != tail or end >= len(reply):
                continue  # a reply that went, or nothing after it
            return list(reply[end : end + k])
        return []

    def clear(self) -> None:
        self._replies.clear()
        self._index.clear()
        self._tokens = self._stale = 0

    def _put(self, number: int, reply: tuple[int, ...]) -> None:
        for n in ORDERS:
            for end in range(n, len(reply)):  # an n-gram with something after it
                self._index[reply[end - n : end]] = (number, end)

    def _rebuild(self) -> None:
        self._index.clear()
        self._stale = 0
        for number, reply in self._replies.items():
            self._put(number, reply)


class HistoryDrafts:
    """The draft source over :class:`HistoryIndex`: what followed this context in an earlier reply."""

    name = "history"

    def __init__(self, index: HistoryIndex) -> None:
        self.index = index

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        return self.index.continuation(context, k), None
