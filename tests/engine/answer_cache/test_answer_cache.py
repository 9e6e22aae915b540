"""Answer cache without the embedding model: exact keys, staleness, bypass, damage and concurrent writers.

Real SQLite files in tmp_path; the embedder is never started, so every cache here is exact-only.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from engine.answer_cache import AnswerCache, CacheConfig, CacheKey, Embedder, ModelIdentity, context_hash, normalise
from engine.answer_cache.keys import question_hash
from engine.answer_cache.store import ENTRIES, HUGE_CHARS
from engine.api import Request, Sampling

MODEL = ModelIdentity("SmolLM2-135M", "abc123", "float32", "none")
SYSTEM = [{"role": "system", "content": "Be brief."}]


def ask(question: str, history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    return [*(SYSTEM if history is None else history), {"role": "user", "content": question}]


def key(question: str, identity: ModelIdentity = MODEL, sampling: Sampling | None = None, **kw: object) -> CacheKey:
    return CacheKey.for_messages(identity, ask(question), sampling or Sampling(), **kw)  # type: ignore[arg-type]


def open_cache(path: Path, **config: object) -> AnswerCache:
    return AnswerCache(path, CacheConfig(**config), embedder=Embedder())  # type: ignore[arg-type]


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[AnswerCache]:
    c = open_cache(tmp_path / "brisk.db")
    yield c
    c.close()


def test_exact_hit_after_normalising_case_and_whitespace(cache: AnswerCache) -> None:
    cache.put(key("What is the capital of France?"), "Paris.", [1, 2, 3], generation_s=2.0)
    hit = cache.lookup(key("  what IS the capital\n of   france? "))
    assert hit is not None
    assert (hit.kind, hit.answer, hit.token_ids, hit.similarity) == ("exact", "Paris.", (1, 2, 3), 1.0)
    assert hit.question == "What is the capital of France?"
    assert hit.generation_s == 2.0 and 0 <= hit.lookup_s < 2.0
    assert hit.saved_s == pytest.approx(2.0 - hit.lookup_s)
    stats = cache.stats()
    assert (stats.entries, stats.lookups, stats.exact_hits, stats.hit_rate) == (1, 1, 1, 1.0)
    assert stats.saved_s == pytest.approx(hit.saved_s)


@pytest.mark.parametrize(
    "asked",
    [
        "what is the capital of france",
        "WHAT IS THE CAPITAL OF FRANCE?!",
        "What is the capital of France.",
        "What is the capital of France...",
        "What is the capital of France\u2026",  # an ellipsis
        "What is the capital of France\uff1f",  # a full-width question mark
        "What is the capital of France\uff01\u3002",  # full-width exclamation mark, ideographic full stop
        "  what is the capital\tof France ? !\n",
    ],
)
def test_case_trailing_punctuation_and_whitespace_variants_hit_exactly(cache: AnswerCache, asked: str) -> None:
    cache.put(key("What is the capital of France?"), "Paris.", [1, 2], generation_s=2.0)
    hit = cache.lookup(key(asked))
    assert hit is not None and (hit.kind, hit.answer) == ("exact", "Paris.")


def test_only_trailing_marks_are_dropped() -> None:
    assert normalise("What is the capital of France?") == "what is the capital of france"
    assert normalise("Is 3.5 > 3? Why?") == "is 3.5 > 3? why"  # marks inside the question stay
    assert normalise("?") == "?" and normalise("!") == "!" and normalise("?") != normalise("!")
    assert normalise("What is 2+2?") != normalise("What is 2+3?")
    assert question_hash("Hi there!") == question_hash("hi   there") != question_hash("hi there, you")


def test_request_key_matches_message_key() -> None:
    request = Request(id="r", messages=tuple(ask("Hi")), sampling=Sampling(max_tokens=9), tools=("clock",))
    assert CacheKey.for_request(MODEL, request) == CacheKey.for_messages(
        MODEL, ask("Hi"), Sampling(max_tokens=9), tools=("clock",)
    )


@pytest.mark.parametrize(
    "changed",
    [
        {"messages": ask("Q", [{"role": "system", "content": "Be verbose."}])},
        {"messages": ask("Q", [*SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])},
        {"tools": ("web_search",)},
        {"tool_versions": {"clock": "2"}},
        {"sampling": Sampling(max_tokens=7)},
        {"sampling": Sampling(repetition_penalty=1.2)},
        {"sampling": Sampling(stop=("\n",))},
        {"identity": ModelIdentity("SmolLM2-360M", "abc123", "float32", "none")},
        {"identity": ModelIdentity("SmolLM2-135M", "def456", "float32", "none")},
        {"identity": ModelIdentity("SmolLM2-135M", "abc123", "bfloat16", "none")},
        {"identity": ModelIdentity("SmolLM2-135M", "abc123", "float32", "int8-cpu")},
    ],
    ids=lambda c: next(iter(c)) + ":" + str(next(iter(c.values())))[:30],
)
def test_no_hit_when_any_part_of_the_key_differs(cache: AnswerCache, changed: dict[str, object]) -> None:
    base = {
        "identity": MODEL,
        "messages": ask("Q"),
        "sampling": Sampling(),
        "tools": ("clock",),
        "tool_versions": {"clock": "1"},
    }

    def make(parts: dict[str, object]) -> CacheKey:
        return CacheKey.for_messages(
            parts["identity"],  # type: ignore[arg-type]
            parts["messages"],  # type: ignore[arg-type]
            parts["sampling"],  # type: ignore[arg-type]
            tools=parts["tools"],  # type: ignore[arg-type]
            tool_versions=parts["tool_versions"],  # type: ignore[arg-type]
        )

    cache.put(make(base), "A", [1], 1.0)
    assert cache.lookup(make(base)) is not None
    assert cache.lookup(make({**base, **changed})) is None


def test_greedy_ignores_seed_and_top_p_but_sampling_never_hits_unless_opted_in(tmp_path: Path) -> None:
    cache = open_cache(tmp_path / "a.db")
    assert context_hash(SYSTEM, sampling=Sampling(seed=1, top_p=0.5)) == context_hash(SYSTEM, sampling=Sampling())
    sampled = Sampling(temperature=0.7, seed=1)
    assert cache.put(key("Q", sampling=sampled), "A", [1], 1.0) is None
    cache.put(key("Q"), "A", [1], 1.0)
    assert cache.lookup(key("Q", sampling=sampled)) is None
    assert cache.stats().lookups == 0  # not eligible: not even counted

    opted = open_cache(tmp_path / "b.db", allow_sampled=True)
    assert opted.put(key("Q", sampling=sampled), "B", [2], 1.0) is not None
    hit = opted.lookup(key("Q", sampling=sampled))
    assert hit is not None and hit.answer == "B"
    assert opted.lookup(key("Q", sampling=Sampling(temperature=0.7, seed=2))) is None  # the seed counts when sampled


def test_regenerate_fresh_bypasses_and_is_not_counted(cache: AnswerCache) -> None:
    cache.put(key("Q"), "A", [1], 1.0)
    assert cache.lookup(key("Q"), bypass=True) is None
    assert cache.stats().lookups == 0
    cache.put(key("Q"), "A fresh", [4, 5], 1.5)  # the fresh reply replaces the old one
    hit = cache.lookup(key("Q"))
    assert hit is not None and (hit.answer, hit.token_ids, hit.generation_s) == ("A fresh", (4, 5), 1.5)
    assert cache.stats().entries == 1


def test_switched_off_cache_neither_serves_nor_stores(cache: AnswerCache) -> None:
    cache.put(key("Q"), "A", [1], 1.0)
    cache.configure(enabled=False)
    assert cache.lookup(key("Q")) is None
    assert cache.put(key("R"), "B", [1], 1.0) is None
    with pytest.raises(ValueError, match="threshold"):
        cache.configure(threshold=1.5)


def test_ttl_expiry(cache: AnswerCache) -> None:
    cache.configure(ttl_s=60.0)
    fresh = cache.put(key("fresh"), "A", [1], 1.0)
    old = cache.put(key("old"), "B", [2], 1.0)
    cache.store.db.execute(f"UPDATE {ENTRIES} SET created = ? WHERE id = ?", [time.time() - 61, old])
    assert cache.lookup(key("old")) is None
    assert cache.lookup(key("fresh")) is not None
    assert cache.expire() == 1
    assert cache.store.get(old) is None and cache.store.get(fresh) is not None  # type: ignore[arg-type]
    cache.configure(ttl_s=None)
    assert cache.expire() == 0


def test_lru_eviction_keeps_recently_used(cache: AnswerCache) -> None:
    cache.configure(max_entries=3)
    ids = [cache.put(key(f"q{i}"), f"a{i}", [i], 1.0) for i in range(3)]
    for i, entry_id in enumerate(ids):  # distinct last-used times without sleeping
        cache.store.db.execute(f"UPDATE {ENTRIES} SET last_used = ? WHERE id = ?", [1000.0 + i, entry_id])
    assert cache.lookup(key("q0")) is not None  # q0 is now the most recently used
    cache.put(key("q3"), "a3", [3], 1.0)
    assert cache.stats().entries == 3
    assert cache.lookup(key("q1")) is None  # the least recently used went
    assert all(cache.lookup(key(q)) is not None for q in ("q0", "q2", "q3"))
    cache.configure(max_entries=1)
    assert cache.stats().entries == 1


def test_invalidation_delete_and_clear(cache: AnswerCache) -> None:
    other = ModelIdentity("other", "x")
    a = cache.put(key("Q"), "A", [1], 1.0)
    cache.put(key("Q", other), "B", [1], 1.0)
    cache.put(key("T", tools=("weather",)), "C", [1], 1.0)
    assert cache.invalidate_tool("weather") == 1
    assert cache.lookup(key("T", tools=("weather",))) is None
    assert cache.invalidate_model(other) == 1
    assert cache.lookup(key("Q", other)) is None and cache.lookup(key("Q")) is not None
    cache.put(key("Q", other), "B", [1], 1.0)
    assert cache.invalidate_model(MODEL, keep=True) == 1  # a new model: drop every other model's answers
    assert cache.delete(a) is True and cache.delete(a) is False  # type: ignore[arg-type]
    cache.put(key("Q"), "A", [1], 1.0)
    assert cache.clear() == 1
    assert (cache.stats().entries, cache.stats().lookups) == (0, 0)


def test_huge_question_is_hashed_not_stored_twice(cache: AnswerCache) -> None:
    question = "word " * 20_000
    entry_id = cache.put(key(question), "A", [1], 1.0)
    entry = cache.store.get(entry_id)  # type: ignore[arg-type]
    assert entry is not None and entry.question_norm is None and entry.question == question
    assert len(normalised := question.strip()) > HUGE_CHARS
    assert cache.lookup(key(normalised.upper())) is not None


def test_drafts_fall_back_to_word_overlap_before_the_embedder(cache: AnswerCache) -> None:
    cache.put(key("how do I bake bread at home"), "Mix flour.", [7, 8, 9], 1.0)
    cache.put(key("unrelated thing"), "No.", [1], 1.0)
    assert cache.nearest_drafts("how do I bake bread", MODEL, limit=3) == [[7, 8, 9]]
    assert cache.nearest_drafts("how do I bake bread", ModelIdentity("other"), limit=3) == []


class CountingEmbedder(Embedder):
    """The real embedder, never started (as in the first moments of a load), counting what it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray | None:
        self.calls.append(list(texts))
        return super().embed(texts)


def test_lookups_and_drafts_before_the_embedder_is_ready_embed_nothing(tmp_path: Path) -> None:
    embedder = CountingEmbedder()
    cache = AnswerCache(tmp_path / "brisk.db", CacheConfig(semantic=True), embedder=embedder)
    entry_id = cache.put(key("How do I bake bread at home?"), "Mix flour.", [7, 8, 9], 1.0)
    assert entry_id is not None
    assert cache.lookup(key("how do I bake bread at home")) is not None  # exact hits still run
    assert cache.lookup(key("What is a good way to bake bread at home?")) is None  # the semantic part is skipped
    assert cache.nearest_drafts("how do I bake bread", MODEL, limit=3) == [[7, 8, 9]]  # by word overlap
    assert cache.backfill(MODEL) == 0
    assert embedder.calls == [], "nothing may be embedded (or wait for the embedder) before it is ready"
    entry = cache.store.get(entry_id)
    assert entry is not None and entry.embedding is None  # backfilled once the embedder is ready
    cache.close()


def _conversation_rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT id, title, system_prompt FROM conversations ORDER BY id").fetchall()


def _chat_file(path: Path) -> list[tuple[object, ...]]:
    from engine.storage import Store

    store = Store(path)
    for i in range(30):
        cid = store.create_conversation(f"chat {i}", "sys")
        store.add_message(cid, "user", f"hello {i} " * 40)
    store.close()
    return _conversation_rows(path)


def test_damaged_cache_table_is_rebuilt_without_touching_conversations(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    before = _chat_file(path)
    cache = open_cache(path)
    for i in range(200):
        cache.put(key(f"question {i} " + "pad " * 50), "answer " * 30, list(range(50)), 1.0)
    cache.close()
    with sqlite3.connect(path) as conn:  # overwrite the cache table's root page with garbage
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [ENTRIES]).fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page)
        handle.write(b"\xff" * page)

    cache = open_cache(path)
    assert cache.store.rebuilt == 1
    assert cache.stats().entries == 0
    cache.put(key("Q"), "A", [1], 1.0)
    assert cache.lookup(key("Q")) is not None
    cache.close()
    assert _conversation_rows(path) == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 30


def test_cache_table_with_wrong_columns_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    before = _chat_file(path)
    open_cache(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"DROP TABLE {ENTRIES}")
        conn.execute(f"CREATE TABLE {ENTRIES} (id INTEGER PRIMARY KEY, junk TEXT)")
    cache = open_cache(path)
    assert cache.store.rebuilt == 1
    cache.put(key("Q"), "A", [1], 1.0)
    assert cache.lookup(key("Q")) is not None
    assert _conversation_rows(path) == before


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    caches = [open_cache(path), open_cache(path)]  # two connections, as the engine and the GUI hold
    per_writer, errors = 60, []
    start = threading.Barrier(4)

    def write(cache: AnswerCache, name: str) -> None:
        try:
            start.wait()
            for i in range(per_writer):
                cache.put(key(f"{name} question {i}"), f"{name} answer {i}", [i], 0.5)
                cache.put(key("shared question"), f"{name} {i}", [i], 0.5)
                cache.lookup(key(f"{name} question {i}"))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(caches[i % 2], f"w{i}")) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = caches[0].stats()
    assert stats.entries == 4 * per_writer + 1
    assert (stats.lookups, stats.exact_hits) == (4 * per_writer, 4 * per_writer)
    for i in range(4):
        assert all(caches[1].lookup(key(f"w{i} question {j}")) is not None for j in range(per_writer))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
