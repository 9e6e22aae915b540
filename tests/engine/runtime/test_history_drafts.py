"""Drafts from the whole local history (engine.runtime.speculative.history): earlier replies' n-grams."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.api import Sampling
from engine.runtime.speculative import Controller, HistoryDrafts, HistoryIndex


def test_the_longest_indexed_ngram_ending_the_context_says_what_follows() -> None:
    index = HistoryIndex()
    index.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    index.add([20, 3, 4, 5, 90, 91, 92])  # a later reply: its 3-gram (3, 4, 5) is the newest
    assert index.continuation([0, 0, 3, 4, 5], 3) == [90, 91, 92]
    # a longer match wins over a newer shorter one
    assert index.continuation([1, 2, 3, 4, 5], 2) == [6, 7]
    assert index.continuation([7, 7, 7], 4) == []  # nothing like it
    assert index.continuation([8, 9, 10], 4) == [], "an n-gram at a reply's end has nothing after it"
    assert index.continuation([4, 5], 2) == [], "shorter than the shortest n-gram"
    index.add([1, 2, 3])  # too short to index
    assert len(index) == 2


def test_memory_is_bounded_and_old_replies_stop_drafting() -> None:
    index = HistoryIndex(capacity=40)
    index.add(list(range(100, 120)))
    for start in range(0, 200, 20):
        index.add(list(range(start, start + 20)))
    assert index._tokens <= 40 and len(index) == 2
    assert index.continuation([100, 101, 102], 2) == [], "the oldest reply went"
    assert index.continuation([180, 181, 182], 2) == [183, 184]
    assert len(index._index) < 200, "stale entries are dropped by a rebuild (11 replies hold 484 n-grams)"


def test_history_drafts_do_not_change_a_greedy_reply(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from engine.model.kv import KVState
    from engine.runtime.steps import Step, generate_steps

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    prompt = list(range(5, 20))

    def reply(drafters: list[HistoryDrafts]) -> tuple[list[int], int]:
        controller = Controller()
        controller.record_plain(1.0)  # a slow plain step, so drafting always pays here
        ids: list[int] = []
        accepted = 0
        for event in generate_steps(
            model,
            KVState(),
            prompt,
            Sampling(max_tokens=30),
            generator=torch.Generator().manual_seed(0),
            controller=controller,
            drafters=drafters,
        ):
            if isinstance(event, Step):
                ids.extend(event.ids)
                accepted += event.accepted
            if len(ids) >= 30:
                break
        return ids[:30], accepted

    plain, _ = reply([])
    index = HistoryIndex()
    index.add([3, 3, 3, *plain, 4, 4])  # an earlier reply that said the same
    drafted, accepted = reply([HistoryDrafts(index)])
    assert drafted == plain
    assert accepted >= 10, "the earlier reply drafted much of it"
    wrong = HistoryIndex()
    wrong.add([t + 1 for t in plain] * 2)  # an earlier reply that drafts nonsense here
    assert reply([HistoryDrafts(wrong)])[0] == plain
