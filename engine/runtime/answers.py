"""Earlier answers, remembered so similar questions can use them as drafts.

``AnswerMemory.similar(question)`` returns token ids of earlier answers whose
question shares most of its words with this one (Jaccard similarity of word
sets at or above ``threshold``), best first.  The engine adds every finished
reply; the GUI seeds it from the saved history at start-up.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in WORD.findall(text))


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


@dataclass(frozen=True)
class Answer:
    question: frozenset[str]
    ids: tuple[int, ...]


class AnswerMemory:
    def __init__(self, capacity: int = 500, threshold: float = 0.5) -> None:
        self.items: deque[Answer] = deque(maxlen=capacity)
        self.threshold = threshold

    def add(self, question: str, ids: list[int]) -> None:
        if ids and question.strip():
            self.items.append(Answer(words(question), tuple(ids)))

    def similar(self, question: str, limit: int = 3) -> list[list[int]]:
        q = words(question)
        scored = [(similarity(q, a.question), i, a) for i, a in enumerate(self.items)]
        scored = [s for s in scored if s[0] >= self.threshold]
        scored.sort(key=lambda s: (s[0], s[1]), reverse=True)  # most similar, then most recent
        return [list(a.ids) for _, _, a in scored[:limit]]
