"""Speculative decoding: drafts from cheap sources, verified by the target in one forward.

* :mod:`.verify` — the acceptance rule, one pure function;
* :mod:`.drafters` — the draft sources (prompt lookup, earlier answers, a draft model);
* :mod:`.history` — drafts from every earlier reply's n-grams (the whole local history);
* :mod:`.controller` — the adaptive draft length per source.

The decode loop that drives them is ``engine.runtime.steps``.
"""

from __future__ import annotations

from engine.runtime.speculative.controller import Controller, RowRates, SourceStats
from engine.runtime.speculative.drafters import AnswerDrafts, Drafter, DraftModel, PromptLookup, ngram_continuation
from engine.runtime.speculative.history import HistoryDrafts, HistoryIndex
from engine.runtime.speculative.verify import verify

__all__ = [
    "AnswerDrafts",
    "Controller",
    "DraftModel",
    "Drafter",
    "HistoryDrafts",
    "HistoryIndex",
    "PromptLookup",
    "RowRates",
    "SourceStats",
    "ngram_continuation",
    "verify",
]
