"""The answer cache: look a question up before the model runs, store the reply after.

Usage (the engine thread, the CLI, the GUI)::

    cache = AnswerCache(database_path(), CacheConfig(threshold=0.9))
    key = CacheKey.for_request(identity, request)            # see keys.py
    hit = cache.lookup(key, bypass=regenerate_fresh)          # None: ask the model
    ...
    cache.put(key, reply_text, reply_ids, generation_s)       # after a finished reply

:meth:`AnswerCache.lookup` returns a :class:`CacheHit` only when the entry has
the same model identity and context hash and is younger than the TTL, and

* **exact**: the same question after :func:`~engine.answer_cache.keys.normalise`;
* **semantic**: the nearest stored question (cosine similarity of
  all-MiniLM-L6-v2 vectors, numpy over the stored float32 rows) is at least
  ``config.threshold`` similar *and* :func:`~engine.answer_cache.guard.mismatch`
  finds no difference in numbers, names, negation, comparison, units,
  operators or question word.  Before the embedder is ready (it loads in the
  background), lookups are exact-only: nothing here waits for it or loads it.

Sampled replies (temperature > 0) are neither served nor stored unless
``config.allow_sampled``.  Every lookup (not a bypass) counts towards
:meth:`stats`; a hit adds its saved time.  :meth:`nearest_drafts` gives the
token ids of the most similar earlier answers as speculative drafts, with no
threshold or guard (a draft is verified by the model, so a wrong one costs
only speed; it never embeds, it uses the vector a lookup just made).  A
lookup embeds at most its own question, and only when a stored vector could
match it: entries stored before the embedder was ready get their vectors from
:meth:`backfill`, which the caller runs off the request's path (after a
reply's ``Done``).  Errors from the database are :class:`CacheError`; a lookup
that fails because the database is locked or damaged is the caller's to
turn into a miss (``lookup(..., quiet=True)`` does that and keeps the error
in :attr:`last_error`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.answer_cache.embed import DIM, Embedder, shared_embedder
from engine.answer_cache.guard import mismatch
from engine.answer_cache.keys import CacheKey, ModelIdentity, fold, normalise
from engine.answer_cache.store import CacheError, CacheStore, Entry

KINDS = ("exact", "semantic")
STAGES = ("both", "exact", "semantic")
_Index = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # ids, context hashes, created, unit vectors


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    semantic: bool = True  # similar-question hits (needs the embedding model)
    threshold: float = 0.86  # least cosine similarity of a semantic hit
    ttl_s: float | None = 30 * 24 * 3600.0  # entries older than this never hit (None: no limit)
    max_entries: int = 5000  # least recently used entries beyond this are evicted
    allow_sampled: bool = False  # also serve and store replies sampled with temperature > 0
    draft_floor: float = 0.5  # least similarity of an answer offered as a speculative draft

    def problems(self) -> list[str]:
        out = []
        if not 0.0 < self.threshold <= 1.0:
            out.append(f"threshold must be above 0 and at most 1, not {self.threshold!r}")
        if self.ttl_s is not None and self.ttl_s <= 0:
            out.append(f"ttl_s must be above 0 seconds (or None for no limit), not {self.ttl_s!r}")
        if self.max_entries < 1:
            out.append(f"max_entries must be 1 or more, not {self.max_entries!r}")
        return out


@dataclass(frozen=True)
class CacheHit:
    """A cached reply and what the UI shows about it."""

    kind: str  # "exact" | "semantic"
    entry_id: int
    answer: str
    token_ids: tuple[int, ...]
    similarity: float  # 1.0 for an exact hit
    question: str  # the earlier question, as it was asked
    generation_s: float  # how long the model took to write it originally
    lookup_s: float  # how long this lookup took (embedding included)
    saved_s: float  # generation_s - lookup_s, at least 0
    created: float  # wall-clock time.time() it was stored
    hits: int  # times it was served before this one


@dataclass(frozen=True)
class CacheStats:
    entries: int
    lookups: int
    exact_hits: int
    semantic_hits: int
    saved_s: float  # total generation time saved by hits
    embedder_ready: bool
    embedder_error: str | None

    @property
    def hits(self) -> int:
        return self.exact_hits + self.semantic_hits

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None


class AnswerCache:
    def __init__(self, path: str | Path, config: CacheConfig | None = None, embedder: Embedder | None = None) -> None:
        """Open (or create) the cache tables in the SQLite file ``path``; ``embedder`` defaults to the shared one.

        Pass ``embedder=Embedder()`` without starting it to keep a cache exact-only.
        """
        self.config = config or CacheConfig()
        if problems := self.config.problems():
            raise ValueError("; ".join(problems))
        self.store = CacheStore(path)
        self.embedder = embedder if embedder is not None else shared_embedder()
        self.last_error: str | None = None
        # In-memory copy of the stored vectors, per model: deleted rows may linger (hits re-read the row).
        self._indexes: dict[str, _Index] = {}
        self._index_version = (-1, -1)
        self._index_stale = 0

    def configure(self, **changes: Any) -> None:
        """Change settings (``threshold``, ``ttl_s``, ``max_entries``...); raises ValueError for bad values."""
        config = replace(self.config, **changes)
        if problems := config.problems():
            raise ValueError("; ".join(problems))
        self.config = config
        if "max_entries" in changes:
            self._index_stale += self.store.evict(config.max_entries)

    def close(self) -> None:
        self.store.close()

    def _since(self) -> float:
        return time.time() - self.config.ttl_s if self.config.ttl_s is not None else float("-inf")

    def _eligible(self, key: CacheKey) -> bool:
        return self.config.enabled and (key.deterministic or self.config.allow_sampled)

    # -- lookup --------------------------------------------------------------------------------

    def lookup(
        self, key: CacheKey, *, bypass: bool = False, quiet: bool = False, stage: str = "both"
    ) -> CacheHit | None:
        """The cached reply for ``key``, or ``None``; ``bypass`` ("regenerate fresh") always misses, uncounted.

        ``stage`` splits a lookup in two for a caller that sends the request on between them: ``"exact"``
        (a miss is not counted: the semantic stage follows) and ``"semantic"`` (skips the exact match;
        counts the lookup, hit or miss).  ``"both"`` is the two in turn.
        """
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, not {stage!r}")
        if bypass or not self._eligible(key) or not key.question.strip():
            return None
        began = time.perf_counter()
        try:
            return self._lookup(key, began, stage)
        except CacheError as exc:
            if not quiet:
                raise
            self.last_error = str(exc)
            return None

    def _lookup(self, key: CacheKey, began: float, stage: str) -> CacheHit | None:
        since = self._since()
        entry = None
        kind, similarity = "exact", 1.0
        if stage != "semantic":
            entry = self.store.find_exact(key.identity.key, key.context, key.question_key, since)
        if entry is None and self.config.semantic and stage != "exact":
            entry, similarity = self._nearest_guarded(key, since)
            kind = "semantic"
        if entry is None or (entry.sampled and not self.config.allow_sampled):
            if stage != "exact":
                self.store.record_lookup()
            return None
        lookup_s = time.perf_counter() - began
        saved = max(0.0, entry.generation_s - lookup_s)
        self.store.record_lookup(entry.id, kind, saved)
        return CacheHit(
            kind=kind,
            entry_id=entry.id,
            answer=entry.answer,
            token_ids=entry.token_ids,
            similarity=similarity,
            question=entry.question,
            generation_s=entry.generation_s,
            lookup_s=lookup_s,
            saved_s=saved,
            created=entry.created,
            hits=entry.hits,
        )

    def _ranked(
        self, question: str, model_key: str, context: str | None, since: float, compute: bool = True
    ) -> list[tuple[float, int]]:
        """(similarity, id) of the stored questions, most similar first; empty while the embedder loads.

        The question is embedded (about 9 ms on one core) only when there is a stored vector to compare it
        with; ``compute=False`` uses only a vector the embedder remembers (embedded by a lookup just before).
        """
        if not self.embedder.ready:  # never wait for it: exact hits (and word-overlap drafts) only
            return []
        index = self._index_for(model_key)
        if index is None:
            return []
        ids, contexts, created, matrix = index
        mask = created >= since
        if context is not None:
            mask &= contexts == context
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            return []
        text = fold(question)
        vector = self.embedder.embed_one(text) if compute else self.embedder.remembered(text)
        if vector is None:
            return []
        scores = matrix[rows] @ vector
        order = np.argsort(-scores, kind="stable")
        return [(float(scores[j]), int(ids[rows[j]])) for j in order]

    def warm(self, identity: ModelIdentity) -> None:
        """Read now what a process's first lookup for ``identity`` would read: the exact match's pages and
        statement, and the model's stored vectors (:meth:`_index_for`), so that the first question does not
        wait for them.  Raises ``CacheError`` as a lookup would."""
        self.store.find_exact(identity.key, "", "", self._since())
        if self.config.semantic:
            self._index_for(identity.key)

    def could_match(self, key: CacheKey) -> bool:
        """Whether the semantic stage of ``key``'s lookup would embed its question (a stored vector to compare).

        Lets a caller embed the question (:meth:`Embedder.embed_one`, remembered for the lookup) outside
        any lock it holds around the cache.
        """
        if not (self.config.semantic and self.embedder.ready and self._eligible(key) and key.question.strip()):
            return False
        index = self._index_for(key.identity.key)
        if index is None:
            return False
        _ids, contexts, created, _matrix = index
        return bool(np.any((created >= self._since()) & (contexts == key.context)))

    def _index_for(self, model_key: str) -> _Index | None:
        """That model's stored vectors in memory, reloaded after another connection wrote or many deletes."""
        version = (self.store.data_version(), self.store.rebuilt)
        size = sum(len(index[0]) for index in self._indexes.values())
        if version != self._index_version or self._index_stale > 64 + size // 8:
            self._indexes.clear()
            self._index_version, self._index_stale = version, 0
        if model_key not in self._indexes:
            rows = [r for r in self.store.vectors(model_key) if len(r[3]) == DIM * 4]
            if not rows:
                return None
            self._indexes[model_key] = (
                np.array([r[0] for r in rows], dtype=np.int64),
                np.array([r[1] for r in rows], dtype=object),
                np.array([r[2] for r in rows], dtype=np.float64),
                np.frombuffer(b"".join(r[3] for r in rows), dtype=np.float32).reshape(len(rows), DIM),
            )
        return self._indexes[model_key]

    def _index_add(self, model_key: str, entry_id: int, context: str, created: float, vector: np.ndarray) -> None:
        index = self._indexes.get(model_key)
        if index is None:
            return  # loaded from the database on the next lookup
        ids, contexts, times, matrix = index
        keep = ids != entry_id  # a replaced entry keeps its id
        self._indexes[model_key] = (
            np.append(ids[keep], entry_id),
            np.append(contexts[keep], np.array([context], dtype=object)),
            np.append(times[keep], created),
            np.vstack([matrix[keep], vector[None, :]]),
        )

    def _nearest_guarded(self, key: CacheKey, since: float) -> tuple[Entry | None, float]:
        ranked = self._ranked(key.question, key.identity.key, key.context, since)
        candidates = [(s, i) for s, i in ranked if s >= self.config.threshold][:8]
        if not candidates:
            return None, 0.0
        questions = self.store.questions([i for _, i in candidates])
        for score, entry_id in candidates:
            earlier = questions.get(entry_id)
            if earlier is not None and mismatch(key.question, earlier) is None:
                entry = self.store.get(entry_id)
                if entry is not None and entry.created >= since:
                    return entry, min(score, 1.0)
        return None, 0.0

    def backfill(self, identity: ModelIdentity, limit: int = 8) -> int:
        """Embed up to ``limit`` of that model's entries stored before the embedder was ready; how many.

        Not part of a lookup (it would put ``limit`` embeddings in front of a reply): the caller runs it
        where no request waits.  Nothing while not ready.  The engine does not wait even there: it embeds
        :meth:`missing_vectors` on the embedder's thread and hands the result to :meth:`set_vectors`.
        """
        missing = self.missing_vectors(identity, limit)
        if not missing:
            return 0
        vectors = self.embedder.embed([q for _, q in missing])
        if vectors is None:
            return 0
        return self.set_vectors(identity, [(i, v) for (i, _), v in zip(missing, vectors, strict=True)])

    def missing_vectors(self, identity: ModelIdentity, limit: int = 8) -> list[tuple[int, str]]:
        """Up to ``limit`` (entry id, folded question) of that model's entries with no vector yet.

        Empty while the embedder is not ready (their vectors could not be made) or matching is exact-only.
        """
        if not self.config.semantic or not self.embedder.ready:
            return []
        return [(i, fold(q)) for i, q in self.store.without_embedding(identity.key, limit)]

    def set_vectors(self, identity: ModelIdentity, vectors: Sequence[tuple[int, np.ndarray]]) -> int:
        """Keep these entries' question vectors (from :meth:`missing_vectors`); how many."""
        if not vectors:
            return 0
        self.store.set_embeddings([(i, np.asarray(v, dtype=np.float32).tobytes()) for i, v in vectors])
        self._indexes.pop(identity.key, None)
        return len(vectors)

    # -- store ---------------------------------------------------------------------------------

    def put(
        self, key: CacheKey, answer: str, token_ids: Sequence[int], generation_s: float, embed: bool = True
    ) -> int | None:
        """Store a finished reply; returns its id, or ``None`` when the cache is off or the reply is not cacheable.

        Store only complete replies (finish reason "stop" or "length"), never a cancelled or failed one.
        ``embed``: compute the question's vector now if the lookup did not leave one; false (the engine)
        keeps the entry without it at once, for :meth:`missing_vectors` to fill off the reply's path.
        """
        if not self._eligible(key) or not key.question.strip() or not answer:
            return None
        semantic = self.config.semantic and self.embedder.ready
        folded = fold(key.question)
        vector = (self.embedder.embed_one(folded) if embed else self.embedder.remembered(folded)) if semantic else None
        entry_id = self.store.upsert(
            {
                "model_key": key.identity.key,
                "model_name": key.identity.name,
                "weight_hash": key.identity.weight_hash,
                "dtype": key.identity.dtype,
                "quant": key.identity.quant,
                "context_hash": key.context,
                "question_key": key.question_key,
                "question_norm": normalise(key.question),
                "question": key.question,
                "answer": answer,
                "token_ids": list(token_ids),
                "generation_s": float(generation_s),
                "embedding": None if vector is None else vector.tobytes(),
                "sampled": not key.deterministic,
                "tools": key.tools,
            }
        )
        if vector is not None:
            self._index_add(key.identity.key, entry_id, key.context, time.time(), vector)
        if self.config.ttl_s is not None:
            self._index_stale += self.store.delete_older(self._since())
        self._index_stale += self.store.evict(self.config.max_entries)
        return entry_id

    # -- drafts --------------------------------------------------------------------------------

    def nearest_drafts(self, question: str, identity: ModelIdentity, limit: int = 3) -> list[list[int]]:
        """Token ids of the earlier answers (same model, any context) most similar to ``question``.

        Uses the question's vector when the embedder remembers it (the lookup before embedded it;
        similarity at least ``config.draft_floor``), else word overlap of the most recent questions (Jaccard
        at least 0.5): it never embeds, so it never holds up the reply it drafts for.  Never counted as a lookup.
        """
        if not self.config.enabled or not question.strip() or limit < 1:
            return []
        since = self._since()
        ranked = self._ranked(question, identity.key, None, since, compute=False)
        ranked = [(s, i) for s, i in ranked if s >= self.config.draft_floor]
        if not ranked:
            words = set(normalise(question).split())
            scored = []
            for entry_id, earlier in self.store.recent(identity.key, since, 500):
                other = set(normalise(earlier).split())
                overlap = len(words & other) / len(words | other) if words | other else 0.0
                if overlap >= 0.5:
                    scored.append((overlap, entry_id))
            ranked = sorted(scored, reverse=True)
        ids = [i for _, i in ranked[:limit]]
        found = self.store.token_ids(ids) if ids else {}
        return [list(found[i]) for i in ids if found.get(i)]

    # -- staleness -----------------------------------------------------------------------------

    def delete(self, entry_id: int) -> bool:
        self._indexes.clear()
        return self.store.delete(entry_id)

    def clear(self) -> int:
        """Delete every entry and reset the counters; returns how many entries went."""
        self._indexes.clear()
        return self.store.clear()

    def invalidate_model(self, identity: ModelIdentity, *, keep: bool = False) -> int:
        """Delete the answers of ``identity`` (``keep=True``: of every other model instead)."""
        self._indexes.clear()
        return self.store.delete_model(identity.key, keep=keep)

    def invalidate_tool(self, tool: str) -> int:
        """Delete the answers of requests that had ``tool`` enabled (its data changed)."""
        self._indexes.clear()
        return self.store.delete_tool(tool)

    def expire(self) -> int:
        """Delete entries older than the TTL now (lookups ignore them anyway)."""
        return self.store.delete_older(self._since()) if self.config.ttl_s is not None else 0

    def stats(self) -> CacheStats:
        counters = self.store.counters()
        return CacheStats(
            entries=self.store.count(),
            lookups=int(counters["lookups"]),
            exact_hits=int(counters["exact_hits"]),
            semantic_hits=int(counters["semantic_hits"]),
            saved_s=counters["saved_s"],
            embedder_ready=self.embedder.ready,
            embedder_error=self.embedder.error,
        )
