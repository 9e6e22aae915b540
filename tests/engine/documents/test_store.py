"""The document index (engine.documents.store) and its chunker, on real SQLite files in tmp_path."""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine.documents.chunking import chunk
from engine.documents.retrieval import fts_query, fuse
from engine.documents.store import BATCH, DocumentStore, IndexCancelled, content_id, ordered
from engine.storage.db import StoreError


@dataclass(frozen=True)
class Converted:
    """The fields of engine.documents.convert.Converted that the store reads."""

    path: str
    name: str
    kind: str
    text: str
    size_bytes: int = 0
    mtime: float = 0.0
    encoding: str = "utf-8"
    pages: int | None = None
    notes: tuple[str, ...] = ()


def doc(path: str | Path, text: str, **kw: object) -> Converted:
    return Converted(str(path), Path(path).name, "markdown", text, len(text.encode()), 1.5, **kw)  # type: ignore[arg-type]


CONCEPTS = ("feline", "canine", "volcano", "finance")  # the fake embedder's axes


def fake_embed(texts: list[str]) -> np.ndarray:
    """Deterministic vectors: one axis per concept named in the text (cat words count as feline, ...)."""
    words = {"feline": ("cat", "kitten", "feline"), "canine": ("dog", "puppy", "canine"),
             "volcano": ("lava", "volcano", "eruption"), "finance": ("money", "budget", "invoice")}  # fmt: skip
    out = np.zeros((len(texts), len(CONCEPTS) + 1), dtype=np.float32)
    for row, text in enumerate(texts):
        found = set(re.findall(r"\w+", text.lower()))
        for axis, concept in enumerate(CONCEPTS):
            out[row, axis] = sum(w in found for w in words[concept])
        out[row, -1] = 0.1  # nothing named: a vector all the same
    return out


def paragraphs(seed: int, count: int, words: int = 160) -> str:
    rng = random.Random(seed)
    vocab = ("river", "stone", "harbor", "lantern", "meadow", "copper", "signal", "orchard", "thunder", "ember")
    return "\n\n".join(" ".join(rng.choice(vocab) for _ in range(words)) + "." for _ in range(count))


@pytest.fixture
def store(tmp_path: Path):
    s = DocumentStore(tmp_path / "documents.db")
    yield s
    s.close()


def count(store: DocumentStore, sql: str) -> int:
    return int(store.file.db.execute(sql).fetchone()[0])


# -- documents -----------------------------------------------------------------------------------


def test_add_get_text_round_trip(store: DocumentStore, tmp_path: Path) -> None:
    text = "# Notes\n\nThe quokka census counted 412 animals.\n\n" + paragraphs(1, 6)
    info = store.add(doc(tmp_path / "notes.md", text, pages=3, notes=("2 images left out",)))
    assert info.id == hashlib.sha256(text.encode()).hexdigest() == content_id(text)
    assert (info.name, info.kind, info.chars, info.pages, info.state) == (
        "notes.md",
        "markdown",
        len(text),
        3,
        "indexed",
    )
    assert info.notes == ("2 images left out",) and info.replaced is None and not info.embedded
    assert info.chunks == len(chunk(text)) > 1 and info.bytes_used > 2 * len(text)
    assert store.text(info.id) == text
    assert store.get(info.id) == info
    assert store.by_path(tmp_path / "notes.md") == info and store.by_path(tmp_path / "other.md") is None
    assert [i.id for i in store.list()] == [info.id]
    rows = store.file.db.execute('SELECT idx, start, "end", text FROM chunks ORDER BY idx').fetchall()
    assert [(s, e) for _, s, e, _ in rows] == chunk(text)
    assert all(text[s:e] == t for _, s, e, t in rows)
    assert store.get("0" * 64) is None
    with pytest.raises(KeyError, match="attach the file again"):
        store.text("0" * 64)


def test_same_content_twice_is_one_record(store: DocumentStore, tmp_path: Path) -> None:
    text = paragraphs(2, 4)
    first = store.add(doc(tmp_path / "a.md", text))
    chunk_ids = store.file.db.execute("SELECT id FROM chunks ORDER BY id").fetchall()
    second = store.add(doc(tmp_path / "copy-of-a.md", text))
    assert second.id == first.id and second.replaced is None
    assert second.path == str(tmp_path / "copy-of-a.md") and second.last_used >= first.last_used
    assert len(store.list()) == 1
    assert store.file.db.execute("SELECT id FROM chunks ORDER BY id").fetchall() == chunk_ids  # not indexed again


def test_changed_file_replaces_the_old_record(store: DocumentStore, tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    old = store.add(doc(path, "The aardvark budget was approved.\n\n" + paragraphs(3, 3)))
    new = store.add(doc(path, "The pangolin budget was approved.\n\n" + paragraphs(3, 3)))
    assert new.id != old.id and new.replaced == old.id
    assert store.get(old.id) is None and [i.id for i in store.list()] == [new.id]
    assert store.search("aardvark", [old.id, new.id]) == []
    assert [h.doc_id for h in store.search("pangolin", [old.id, new.id])] == [new.id]
    assert count(store, f"SELECT count(*) FROM chunks WHERE doc_id = '{old.id}'") == 0
    assert count(store, "SELECT count(*) FROM document_text") == 1


def test_remove_deletes_chunks_and_fts_rows(store: DocumentStore, tmp_path: Path) -> None:
    keep = store.add(doc(tmp_path / "keep.md", paragraphs(4, 3)))
    gone = store.add(doc(tmp_path / "gone.md", "A wombat rides the tram.\n\n" + paragraphs(5, 3)), embed=fake_embed)
    assert [h.doc_id for h in store.search("wombat", [keep.id, gone.id])] == [gone.id]
    assert store.remove(gone.id) and not store.remove(gone.id)
    assert store.search("wombat", [keep.id, gone.id]) == []
    assert count(store, "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'wombat'") == 0
    assert count(store, f"SELECT count(*) FROM chunks WHERE doc_id = '{gone.id}'") == 0
    store.file.db.execute("INSERT INTO chunks_fts (chunks_fts) VALUES ('integrity-check')")  # raises if out of step
    assert [i.id for i in store.list()] == [keep.id]


# -- searching -----------------------------------------------------------------------------------

HOSTILE = [
    '"', 'say "hello', '""', "AND", "OR OR", "NOT", "NEAR(a b, 3)", "a NEAR b", "*", "zebra*", "^start",
    "title:zebra", "col : val", "(", ")", "((a OR b)", "{a b}", "-x", "+y", "'", "a'b", "\x00", "\\", "🦓",
    "über", "-- ; DROP TABLE chunks;", "%", "_", "a" * 5000, " ".join(["AND"] * 200), "", "   ", "?!.",
]  # fmt: skip


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_do_not_raise(store: DocumentStore, tmp_path: Path, query: str) -> None:
    info = store.add(
        doc(tmp_path / "z.md", "The zebra crossed the road at the start. Über alles.\n\n" + paragraphs(6, 2))
    )
    hits = store.search(query, [info.id])
    assert all(h.doc_id == info.id for h in hits)
    assert store.search(query, [info.id], query_vector=np.ones(5, dtype=np.float32)) is not None


def test_a_hostile_query_still_finds_its_words(store: DocumentStore, tmp_path: Path) -> None:
    info = store.add(doc(tmp_path / "z.md", "The zebra crossed the road.\n\n" + paragraphs(6, 2)))
    for query in ('"zebra', "zebra*", "zebra:", "(zebra)", "NEAR(zebra)", "zebra AND OR"):
        assert [h.doc_id for h in store.search(query, [info.id])] == [info.id], query
    assert fts_query('what is "the" zebra?') == '"zebra"'
    assert fts_query("what is the") == '"what" OR "is" OR "the"'  # only common words: keep them


def test_bm25_finds_a_unique_word(store: DocumentStore, tmp_path: Path) -> None:
    infos = [store.add(doc(tmp_path / f"d{i}.md", paragraphs(10 + i, 8))) for i in range(5)]
    target = store.add(
        doc(tmp_path / "t.md", paragraphs(20, 3) + "\n\nThe xylophonist arrived.\n\n" + paragraphs(21, 3))
    )
    ids = [i.id for i in infos] + [target.id]
    hits = store.search("where did the xylophonist go", ids, k=3)
    assert hits[0].doc_id == target.id and hits[0].bm25_rank == 1 and hits[0].vector_rank is None
    assert "xylophonist" in hits[0].text and store.text(target.id)[hits[0].start : hits[0].end] == hits[0].text
    assert store.search("xylophonist", [i.id for i in infos]) == []  # only the documents asked for
    assert store.search("xylophonist", []) == [] and store.search("xylophonist", ids, k=0) == []


def test_hybrid_ranking_with_a_fake_embedder(store: DocumentStore, tmp_path: Path) -> None:
    progress: list[tuple[int, int]] = []
    cats = store.add(
        doc(tmp_path / "cats.md", "A kitten sleeps in the sun all afternoon."), embed=fake_embed,
        progress=lambda done, total: progress.append((done, total)),
    )  # fmt: skip
    dogs = store.add(doc(tmp_path / "dogs.md", "The puppy chased the ball across the garden."), embed=fake_embed)
    both = store.add(doc(tmp_path / "pets.md", "Feline friends and garden birds share the yard."), embed=fake_embed)
    lava = store.add(doc(tmp_path / "lava.md", "Lava poured down the slope after the eruption."), embed=fake_embed)
    ids = [cats.id, dogs.id, both.id, lava.id]
    assert progress[0] == (0, 1) and progress[-1] == (1, 1) and cats.embedded and cats.state == "indexed"

    question = "which cat naps in the garden"
    vector = fake_embed([question])[0]
    words = store.search(question, ids)  # BM25 alone: "garden" is in dogs and pets
    assert {h.doc_id for h in words} == {dogs.id, both.id} and all(h.vector_rank is None for h in words)
    near = store.search("", ids, query_vector=vector)  # vectors alone: the feline texts first
    assert {h.doc_id for h in near[:2]} == {cats.id, both.id} and all(h.bm25_rank is None for h in near)
    hybrid = store.search(question, ids, k=3, query_vector=vector)
    assert hybrid[0].doc_id == both.id  # found by words and by meaning: first
    assert hybrid[0].bm25_rank is not None and hybrid[0].vector_rank is not None
    assert {h.doc_id for h in hybrid} == {both.id, cats.id, dogs.id}
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    assert [h.doc_id for h in store.search("", ids, k=1, query_vector=fake_embed(["volcano"])[0])] == [lava.id]


def test_fusion_keeps_a_strong_word_match_first() -> None:
    """The case reciprocal rank fusion got wrong on the corpus: BM25's clear first (a unique word) that
    the vectors do not rank, against chunks both lists rank in the middle."""
    words = [(("unique", 0), 9.0), (("both", 0), 3.1), (("both", 1), 3.0), (("words", 0), 2.9)]
    near = [(("vec", 0), 0.62), (("both", 1), 0.60), (("both", 0), 0.59), (("vec", 1), 0.58)]
    cos = dict(near) | {("unique", 0): 0.35, ("words", 0): 0.30}
    fused = fuse(words, near, cos.get)
    assert fused[0][0] == ("unique", 0) and fused[0][2:] == (1, None)  # RRF (k=60) put both chunks first
    assert dict((key, ranks) for key, _, *ranks in fused)[("both", 1)] == [3, 2]
    assert [score for _, score, *_ in fused] == sorted((score for _, score, *_ in fused), reverse=True)
    assert [key for key, *_ in fuse(words, [], lambda key: None)] == [key for key, _ in words]  # BM25 alone
    assert [key for key, *_ in fuse([], near, cos.get)] == [key for key, _ in near]  # vectors alone
    assert fuse([], [], cos.get) == []


def test_vectors_later_with_embed_missing(store: DocumentStore, tmp_path: Path) -> None:
    first = store.add(doc(tmp_path / "a.md", "A kitten."), embed=lambda texts: None)  # embedder not ready yet
    second = store.add(doc(tmp_path / "b.md", "A puppy."))
    assert not first.embedded and not second.embedded and first.state == "indexed"
    vector = fake_embed(["cat"])[0]
    assert store.search("", [first.id, second.id], query_vector=vector) == []
    assert store.embed_missing(fake_embed) == 2
    assert store.get(first.id).embedded and store.get(second.id).embedded  # type: ignore[union-attr]
    assert store.search("", [first.id, second.id], query_vector=vector)[0].doc_id == first.id
    assert store.embed_missing(fake_embed) == 0


def test_a_failing_embedder_leaves_words_searchable(store: DocumentStore, tmp_path: Path) -> None:
    def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("out of memory")

    info = store.add(doc(tmp_path / "a.md", "The okapi eats leaves."), embed=broken)
    assert info.state == "failed" and not info.embedded
    assert "out of memory" in info.notes[-1] and "words" in info.notes[-1]
    assert [h.doc_id for h in store.search("okapi", [info.id])] == [info.id]
    store.embed_missing(fake_embed)
    again = store.get(info.id)
    assert again is not None and again.state == "indexed" and again.embedded


def test_real_embedder_finds_a_paraphrased_question(store: DocumentStore, tmp_path: Path) -> None:
    from engine.answer_cache.embed import shared_embedder

    embedder = shared_embedder()
    assert embedder.wait(120), embedder.error
    notes = {
        "bakery.md": "The bakery on Elm Street switched to a rye sourdough and now bakes every loaf overnight.",
        "harbour.md": "Fishing boats unload their catch at the harbour before dawn; the ferry leaves at nine.",
        "garden.md": "Tomatoes and beans grow in the raised beds; the compost heap needs turning weekly.",
        "laptop.md": "My laptop battery drains quickly since the operating system update was installed.",
        "concert.md": "The orchestra rehearsed the symphony twice before the sold-out performance on Friday.",
    }
    ids = {name: store.add(doc(tmp_path / name, text), embed=embedder.embed).id for name, text in notes.items()}
    assert all(store.get(i).embedded for i in ids.values())  # type: ignore[union-attr]
    asked = {
        "Which shop changed how it makes its bread?": "bakery.md",
        "Why does my computer run out of power so fast?": "laptop.md",
        "When do the musicians play their show?": "concert.md",
        "Where do vessels bring in the fish they caught?": "harbour.md",
    }
    for question, expected in asked.items():
        vector = embedder.embed([question])
        assert vector is not None
        alone = store.search("", list(ids.values()), k=1, query_vector=vector[0])
        assert alone[0].name == expected, question
        # hybrid: a word of the question in another note ("out" of "sold-out") may tie with it, never beat it
        hybrid = store.search(question, list(ids.values()), k=2, query_vector=vector[0])
        assert expected in [h.name for h in hybrid] and hybrid[0].score == max(h.score for h in hybrid), question


def test_ordered_gives_a_stable_document_order(store: DocumentStore, tmp_path: Path) -> None:
    b = store.add(doc(tmp_path / "b.md", "\n\n".join(f"Comet section {i}. " + paragraphs(i, 1) for i in range(4))))
    a = store.add(doc(tmp_path / "a.md", "The comet passed.\n\n" + paragraphs(30, 1)))
    hits = store.search("comet", [b.id, a.id], k=6)
    assert len(hits) >= 3
    order = ordered(hits)
    assert [(h.name, h.idx) for h in order] == sorted((h.name, h.idx) for h in hits)
    assert ordered(list(reversed(hits))) == order


# -- chunking ------------------------------------------------------------------------------------


def markdown(seed: int) -> str:
    rng = random.Random(seed)
    parts = []
    for s in range(12):
        parts.append(f"{'#' * rng.randint(1, 3)} Section {s}")
        for _ in range(rng.randint(1, 5)):
            sentences = [" ".join(rng.choice(("word", "lemon", "ship", "anchor")) for _ in range(rng.randint(4, 30)))
                         for _ in range(rng.randint(1, 8))]  # fmt: skip
            parts.append(". ".join(sentences) + ".")
        if rng.random() < 0.3:
            parts.append("```python\n# not a heading\nx = 1\n\n# still code\n```")
    return "\n\n".join(parts) + "\n"


@pytest.mark.parametrize("seed", range(6))
def test_chunk_offsets_are_exact_and_deterministic(seed: int) -> None:
    text = markdown(seed)
    spans = chunk(text, 600, 80)
    assert spans == chunk(text, 600, 80)  # the same text, the same chunks
    assert len(spans) > 3
    covered = bytearray(len(text))
    for i, (start, end) in enumerate(spans):
        piece = text[start:end]
        assert 0 < end - start <= 600 and piece == piece.strip()
        assert start == 0 or text[start - 1].isspace(), "starts mid-word"
        assert end == len(text) or text[end].isspace(), "ends mid-word"
        if i:
            assert start > spans[i - 1][0] and start <= spans[i - 1][1] + len(text[spans[i - 1][1] : start])
        covered[start:end] = b"\x01" * (end - start)
    assert all(covered[i] or text[i].isspace() for i in range(len(text))), "text left out"
    starts = {s for s, _ in spans}
    for match in re.finditer(r"(?m)^#{1,3} Section \d+$", text):  # a heading starts a chunk unless it is near one
        nearest = max(s for s in starts if s <= match.start())
        assert match.start() in starts or match.start() - nearest < 200 or not text[nearest : match.start()].strip()
    assert not any(text[s:].startswith("# not a heading") for s in starts)


def test_chunk_headings_start_chunks_and_long_words_are_cut() -> None:
    text = "# One\n\n" + "alpha beta gamma. " * 30 + "\n\n# Two\n\n" + "delta epsilon. " * 30
    spans = chunk(text, 700, 100)
    assert [text[s : s + 5] for s, _ in spans if text[s] == "#"] == ["# One", "# Two"]
    two = text.index("# Two")
    assert all(not (s < two < e) for s, e in spans)  # no chunk runs across the heading
    blob = "x" * 2500
    assert chunk(blob, 1000, 100) == [(0, 1000), (900, 1900), (1800, 2500)]
    assert chunk("") == [] and chunk(" \n\n ") == [] and chunk("  hi  ") == [(2, 4)]
    with pytest.raises(ValueError, match="overlap_chars"):
        chunk("text", 100, 100)


# -- cancelling, damage, sharing -----------------------------------------------------------------


def test_cancel_leaves_nothing(store: DocumentStore, tmp_path: Path) -> None:
    text = paragraphs(40, 3 * BATCH, words=150)
    assert len(chunk(text)) > BATCH
    calls = []

    def cancel_after_one_batch() -> bool:
        calls.append(1)
        return len(calls) > 2  # before the call: no; before batch 1: no; before batch 2: yes

    with pytest.raises(IndexCancelled, match="nothing of it was kept"):
        store.add(doc(tmp_path / "big.md", text), embed=fake_embed, cancel=cancel_after_one_batch)
    assert store.list() == [] and store.get(content_id(text)) is None
    for table in ("documents", "document_text", "chunks"):
        assert count(store, f"SELECT count(*) FROM {table}") == 0, table
    assert count(store, "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'river'") == 0
    with pytest.raises(IndexCancelled):
        store.add(doc(tmp_path / "big.md", text), cancel=lambda: True)
    assert store.list() == []


def test_cancelling_a_changed_file_keeps_the_old_text(store: DocumentStore, tmp_path: Path) -> None:
    path = tmp_path / "big.md"
    old = store.add(doc(path, "Old text about a narwhal."))
    with pytest.raises(IndexCancelled):
        store.add(doc(path, paragraphs(41, 3 * BATCH, words=150)), embed=fake_embed, cancel=iter([0, 0, 1]).__next__)
    assert [i.id for i in store.list()] == [old.id]
    assert [h.doc_id for h in store.search("narwhal", [old.id])] == [old.id]


def test_a_damaged_file_is_moved_aside_and_a_new_one_works(tmp_path: Path) -> None:
    path = tmp_path / "documents.db"
    garbage = bytes(random.Random(0).getrandbits(8) for _ in range(8192))
    path.write_bytes(garbage)
    store = DocumentStore(path)
    assert store.notice is not None and "damaged" in store.notice and "Attach your documents again" in store.notice
    aside = list(tmp_path.glob("documents.db.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage and aside[0].name in store.notice
    info = store.add(doc(tmp_path / "a.md", "The ibis flew home."))
    assert [h.doc_id for h in store.search("ibis", [info.id])] == [info.id]
    store.close()
    again = DocumentStore(path)  # a healthy file: kept, no notice
    assert again.notice is None and again.get(info.id) is not None
    again.close()


def test_damaged_pages_of_a_real_index_are_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "documents.db"
    store = DocumentStore(path)
    for i in range(20):
        store.add(doc(tmp_path / f"{i}.md", paragraphs(i, 6)))
    store.close()
    sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
    data = bytearray(path.read_bytes())
    data[4096:] = bytes(random.Random(1).getrandbits(8) for _ in range(len(data) - 4096))
    path.write_bytes(bytes(data))
    fresh = DocumentStore(path)
    assert fresh.notice is not None and fresh.list() == []
    fresh.close()


def test_damage_found_while_open_moves_the_file_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "documents.db"
    store = DocumentStore(path)
    info = store.add(doc(tmp_path / "a.md", "The heron waits."))
    damaged = store.file
    real_op = damaged.op

    @contextmanager
    def failing_op(action: str, *, write: bool = False) -> Iterator[object]:
        # what SQLiteFile.op raises when a page it reads is corrupt (the open connection's cache hides real damage)
        try:
            raise sqlite3.DatabaseError("database disk image is malformed")
        except sqlite3.DatabaseError as exc:
            raise StoreError(damaged.damaged_message(str(exc))) from exc
        yield real_op  # pragma: no cover

    monkeypatch.setattr(damaged, "op", failing_op)
    with pytest.raises(StoreError, match="could not|Could not") as caught:
        store.search("heron", [info.id])
    assert "moved to documents.db.damaged-" in str(caught.value) and store.notice is not None
    assert store.file is not damaged and len(list(tmp_path.glob("documents.db.damaged-*"))) == 1
    again = store.add(doc(tmp_path / "a.md", "The heron waits."))
    assert [h.doc_id for h in store.search("heron", [again.id])] == [info.id]
    store.close()


def test_a_database_that_is_not_an_index_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "documents.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE recipes (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not Brisk's document index"):
        DocumentStore(path)
    assert not list(tmp_path.glob("*.damaged-*"))


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "documents.db"
    one, two = DocumentStore(path), DocumentStore(path)
    a = one.add(doc(tmp_path / "a.md", "A kitten named Biscuit."))
    assert two.get(a.id) is not None and two.text(a.id) == "A kitten named Biscuit."
    b = two.add(doc(tmp_path / "b.md", "A puppy named Pretzel."), embed=fake_embed)
    assert [h.doc_id for h in one.search("pretzel", [a.id, b.id])] == [b.id]
    vector = fake_embed(["cat"])[0]
    assert [h.doc_id for h in one.search("", [a.id, b.id], query_vector=vector)] == [b.id]  # a has no vector yet
    assert two.embed_missing(fake_embed) == 1  # the other process embeds a: one sees it at once
    assert one.search("", [a.id, b.id], query_vector=vector)[0].doc_id == a.id
    assert two.remove(a.id)
    assert one.get(a.id) is None and one.search("biscuit", [a.id, b.id]) == []

    errors: list[BaseException] = []

    def add_many(store: DocumentStore, tag: str) -> None:
        try:
            for i in range(8):
                store.add(doc(tmp_path / f"{tag}{i}.md", f"Note {tag} {i}. " + paragraphs(i, 2)), embed=fake_embed)
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=add_many, args=(s, t)) for s, t in ((one, "x"), (two, "y"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(one.list()) == len(two.list()) == 17
    one.close()
    two.close()


def test_memory_and_default_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = DocumentStore(":memory:")
    info = memory.add(doc("/nowhere/m.md", "The moose is in memory."))
    assert [h.doc_id for h in memory.search("moose", [info.id])] == [info.id]
    memory.close()
    monkeypatch.setenv("BRISK_DATA_DIR", str(tmp_path / "data"))
    default = DocumentStore()
    assert default.path == tmp_path / "data" / "documents.db" and default.path.is_file()
    default.close()


def test_a_copy_of_an_indexed_text_keeps_the_first_name_and_path(tmp_path: Path) -> None:
    from engine.documents.convert import convert
    from engine.documents.store import DocumentStore

    first, copy = tmp_path / "notes.md", tmp_path / "copy of notes.md"
    first.write_text("The office opens at nine.\n", encoding="utf-8")
    copy.write_text("The office opens at nine.\n", encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    original = store.add(convert(first))
    again = store.add(convert(copy))
    assert again.id == original.id and (again.name, again.path) == ("notes.md", str(first))
    first.unlink()  # the first file moved away: the copy's place is where the text lives now
    moved = store.add(convert(copy))
    assert (moved.name, moved.path) == ("copy of notes.md", str(copy))
