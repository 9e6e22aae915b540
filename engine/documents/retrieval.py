"""Ranking chunks for a question: a safe BM25 query, cosine similarity over kept matrices, and their fusion.

The document index (``engine.documents.store``) finds candidates two ways,
the best ``CANDIDATES`` of each: FTS5's BM25 over the question's words
(:func:`fts_query`), and the cosine similarity of the question's vector to
every chunk vector of the documents asked for (:class:`Matrix`, numpy).
:func:`fuse` joins them with a convex combination of the two scores, each
min-max normalised over the candidates: ``ALPHA * bm25 + (1 - ALPHA) * cosine``
(every candidate gets its exact cosine, not only the vector list's own).

Why not reciprocal rank fusion: on the notes of ``engine.documents.corpus``
(1,000 notes, 48 paraphrased questions, 1,200-character chunks; ``python -m
engine.documents.corpus /tmp/corpus 1000``), RRF with the usual k=60 put the
right note among the top 6 for 0.69 of the questions, where BM25 alone did
0.81: a note whose unique word (a project name, a reading) made it BM25's first,
and that the vectors did not rank, was outvoted by notes that both lists ranked
in the middle, since RRF rewards agreement and flattens ranks (both fusions
were measured on the same candidate lists, dumped once).  The convex
combination keeps such a strong match first and lets vectors lift a paraphrase:
0.81 first and 0.81 top 6 there; on a second corpus (seed 1) 0.77 and 0.85
against RRF's 0.58 and 0.69 (BM25 alone: 0.81 and 0.83; vectors alone: 0.29
and 0.48).  ``ALPHA`` 0.6 measured a little better first-place rates on these
keyword-heavy questions; 0.5 is kept, not tuned to them.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

CANDIDATES = 50  # chunks taken from each ranking before fusion
ALPHA = 0.5  # weight of BM25 in the fused score (the rest is cosine similarity)
MAX_TERMS = 64  # question words searched, at most
SETS = 4  # document sets whose vector matrices are kept in memory
STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an and are as at be by can could did do does for from had has have how i in is it its me my of on or "
        "our should so that the their them there these they this to was we were what when where which who whom "
        "why will with would you your about into than then out",
    )
)
Key = tuple[str, int]  # (document id, chunk index)


@dataclass(frozen=True)
class Hit:
    doc_id: str
    name: str
    path: str
    idx: int
    start: int
    end: int
    text: str
    score: float  # fused, 0..1: higher is better
    bm25_rank: int | None  # 1-based rank among the BM25 candidates, None when not among them
    vector_rank: int | None  # the same among the vector candidates
    page: int | None = None  # a PDF's page (from 1) where the chunk begins; None for a text without pages
    last_page: int | None = None  # and where it ends


def ordered(hits: Iterable[Hit]) -> list[Hit]:
    """Hits in a stable document order (name, id, then place in the document) for the prompt, so two
    questions that retrieve the same chunks give the same prompt text."""
    return sorted(hits, key=lambda h: (h.name.casefold(), h.name, h.doc_id, h.idx))


def fts_query(question: str) -> str:
    """The question as an FTS5 query that cannot be a syntax error: its words, each quoted, joined by OR.

    Common words are dropped (when anything else is left) so they do not pull in every chunk."""
    words = list(dict.fromkeys(w.casefold() for w in re.findall(r"\w+", question)))
    kept = [w for w in words if w not in STOPWORDS] or words
    return " OR ".join(f'"{w}"' for w in kept[:MAX_TERMS])


class Matrix:
    """The vectors of a set of documents' chunks, one row each, and which chunk each row is."""

    def __init__(self, rows: Sequence[tuple[str, int, bytes]]) -> None:
        widths = [len(r[2]) for r in rows]
        if len(set(widths)) > 1:  # vectors of two embedders: keep the most common width
            common = max(set(widths), key=widths.count)
            rows = [r for r in rows if len(r[2]) == common]
        self.keys: list[Key] = [(str(d), int(i)) for d, i, _ in rows]
        self.row_of = {key: n for n, key in enumerate(self.keys)}
        width = len(rows[0][2]) // 4 if rows else 0
        self.vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), width)

    def similarities(self, vector: np.ndarray) -> np.ndarray | None:
        """Cosine similarity of ``vector`` to every row (None when there is no row of its width)."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if not self.keys or self.vectors.shape[1] != query.shape[0]:
            return None
        return np.asarray(self.vectors @ (query / max(float(np.linalg.norm(query)), 1e-12)))

    def top(self, scores: np.ndarray, depth: int) -> list[tuple[Key, float]]:
        best = np.argpartition(-scores, depth - 1)[:depth] if len(scores) > depth else np.arange(len(scores))
        return sorted(((self.keys[i], float(scores[i])) for i in best), key=lambda p: (-p[1], p[0]))


class MatrixSets:
    """A few recent document sets' matrices, reused while valid: a set whose documents all had every
    vector when it was read never changes (an id is its text's hash); any other until ``stamp`` changes."""

    def __init__(self, size: int = SETS) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, ...], tuple[Matrix, bool, object]] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self,
        ids: Iterable[str],
        stamp: object,
        read: Callable[[tuple[str, ...]], tuple[list[tuple[str, int, bytes]], bool]],
    ) -> Matrix:
        """The matrix of ``ids``; ``read(ids)`` gives (rows, whether every document was complete)."""
        key = tuple(sorted(set(ids)))
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and (kept[1] or kept[2] == stamp):
                self._kept.move_to_end(key)
                return kept[0]
            rows, complete = read(key)
            matrix = Matrix(rows)
            self._kept[key] = (matrix, complete, stamp)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
            return matrix

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def _normalised(values: dict[Key, float]) -> dict[Key, float]:
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    return {key: (v - low) / (high - low) if high > low else 1.0 for key, v in values.items()}


def fuse(
    words: Sequence[tuple[Key, float]],
    near: Sequence[tuple[Key, float]],
    cosine: Callable[[Key], float | None],
    alpha: float = ALPHA,
) -> list[tuple[Key, float, int | None, int | None]]:
    """(key, fused score, BM25 rank, vector rank) of every candidate, best first (see the module docstring).

    ``words``: BM25 candidates with their scores (higher is better); ``near``: vector candidates with their
    cosine; ``cosine(key)``: any chunk's cosine (None: no vector).  With no vector candidates the order is
    BM25's, with no BM25 candidates the vectors'."""
    bm25 = _normalised(dict(words))
    if not near:
        alpha = 1.0
    elif not words:
        alpha = 0.0
    keys = list(dict.fromkeys([k for k, _ in words] + [k for k, _ in near]))
    raw = {key: cosine(key) for key in keys} if near else {}
    cos = _normalised({key: v for key, v in raw.items() if v is not None})
    bm25_rank = {key: n for n, (key, _) in enumerate(words, 1)}
    vector_rank = {key: n for n, (key, _) in enumerate(near, 1)}
    scored = [(key, alpha * bm25.get(key, 0.0) + (1 - alpha) * cos.get(key, 0.0)) for key in keys]
    scored.sort(key=lambda p: (-p[1], p[0]))
    return [(key, score, bm25_rank.get(key), vector_rank.get(key)) for key, score in scored]
