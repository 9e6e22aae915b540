"""A PDF's passages are cited by page: the index keeps where each page begins (schema 2), a search names the
pages a chunk lies on, and the prompt, the reply's sources and the command line say them."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.documents import render
from engine.documents.convert import Converted, convert
from engine.documents.render import source_label
from engine.documents.store import DocumentStore, pages_of
from engine.storage.db import Schema, connect
from tests.engine.documents.test_convert import make_pdf

WORDS = ("river", "stone", "cloud", "lamp", "field", "orchard", "meadow", "harbour", "candle", "window", "ladder")


def pdf_pages(count: int, lines: int = 24) -> list[list[str]]:
    """``count`` pages of filler lines; page n (from 1) names its own word, ``markerN``, once, mid-page."""
    rng = random.Random(7)
    pages = []
    for n in range(1, count + 1):
        body = [" ".join(rng.choice(WORDS) for _ in range(9)) for _ in range(lines)]
        body[lines // 2] = f"The inspection found marker{n} beside the north gate."
        pages.append(body)
    return pages


def test_pages_of_names_the_first_and_last_page() -> None:
    starts = [0, 100, 250]
    assert pages_of(starts, 0, 50) == (1, 1)
    assert pages_of(starts, 90, 120) == (1, 2)
    assert pages_of(starts, 100, 250) == (2, 2)  # the end is exclusive
    assert pages_of(starts, 260, 400) == (3, 3)
    assert pages_of([], 0, 50) == (None, None)


def test_a_pdf_passage_is_cited_by_its_page(tmp_path: Path) -> None:
    path = tmp_path / "inspection.pdf"
    path.write_bytes(make_pdf(pdf_pages(30)))
    converted = convert(path)
    assert converted.pages == 30 and len(converted.page_starts) == 30
    store = DocumentStore(tmp_path / "documents.db")
    try:
        info = store.add(converted)
        assert info.chunks > 5  # several chunks, so a page is not simply the first
        for page in (1, 17, 30):
            hits = store.search(f"marker{page}", [info.id], k=1)
            assert hits, page
            hit = hits[0]
            assert hit.page is not None and hit.last_page is not None
            assert hit.page <= page <= hit.last_page, (page, hit.page, hit.last_page)
            # the page named is where the chunk's text lies in the converted text
            starts = converted.page_starts
            assert starts[hit.page - 1] <= hit.start and (hit.page == 30 or hit.start < starts[hit.page])
            passage = render.Passage(hit.doc_id, hit.name, hit.idx, hit.start, hit.end, hit.text, hit.path,
                                     hit.page, hit.last_page)  # fmt: skip
            block = render.passages_block([passage])
            place = render.where(hit.idx, hit.page, hit.last_page)
            assert f"[1] inspection.pdf, {place}:" in block and place.startswith("page")
            source = render.sources([], [passage])[0]
            assert (source["page"], source["last_page"]) == (hit.page, hit.last_page)
            assert source_label(source) == f"[1] inspection.pdf, {place}"
    finally:
        store.close()


def test_text_without_pages_keeps_parts(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("\n\n".join(f"Paragraph {i} about the orchard and marker{i}." * 8 for i in range(40)), "utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    try:
        info = store.add(convert(path))
        hit = store.search("marker33", [info.id], k=1)[0]
        assert (hit.page, hit.last_page) == (None, None)
        passage = render.Passage(hit.doc_id, hit.name, hit.idx, hit.start, hit.end, hit.text, hit.path)
        assert f"notes.md, part {hit.idx + 1}:" in render.passages_block([passage])
        assert "page" not in render.sources([], [passage])[0]
    finally:
        store.close()


def test_an_index_of_the_first_schema_is_brought_up_to_date(tmp_path: Path) -> None:
    """A documents.db written before pages were kept opens, keeps its documents and searches them (no pages)."""
    from engine.documents import store as store_module

    db_path = tmp_path / "documents.db"
    first = Schema("documents", store_module.SCHEMA.migrations[:1])
    old = connect(db_path, first, label="document index")
    old.close()
    doc_id = "a" * 64
    row: dict[str, object] = {"id": doc_id, "path": "/x/old.md", "name": "old.md", "chars": 40, "added_at": 1.0,
                              "last_used": 1.0, "state": "indexed"}  # fmt: skip
    with sqlite3.connect(db_path) as conn:
        assert "page_starts" not in {r[1] for r in conn.execute("PRAGMA table_info(documents)")}
        columns, marks = ", ".join(row), ", ".join("?" * len(row))
        conn.execute(f"INSERT INTO documents ({columns}) VALUES ({marks})", list(row.values()))
        conn.execute("INSERT INTO document_text VALUES (?, ?)", [doc_id, "The old harbour lamp was repaired."])
        conn.execute('INSERT INTO chunks (doc_id, idx, start, "end", text) VALUES (?, 0, 0, 34, ?)',
                     [doc_id, "The old harbour lamp was repaired."])  # fmt: skip
    store = DocumentStore(db_path)
    try:
        hits = store.search("harbour lamp", [doc_id], k=1)
        assert [(h.name, h.page) for h in hits] == [("old.md", None)]
    finally:
        store.close()
    with sqlite3.connect(db_path) as conn:
        assert "page_starts" in {r[1] for r in conn.execute("PRAGMA table_info(documents)")}


def inspection_pdf(tmp_path: Path) -> tuple[Path, Converted, DocumentStore]:
    """A 12-page PDF, converted, and an empty index beside it."""
    path = tmp_path / "inspection.pdf"
    path.write_bytes(make_pdf(pdf_pages(12)))
    return path, convert(path), DocumentStore(tmp_path / "documents.db")


def test_a_pdf_indexed_before_pages_were_kept_gets_them_when_attached_again(tmp_path: Path) -> None:
    _, converted, store = inspection_pdf(tmp_path)
    try:
        info = store.add(replace(converted, page_starts=()))  # as an index of the first schema held it
        assert store.search("marker9", [info.id], k=1)[0].page is None
        again = store.add(converted)  # the same text: the same document, its pages now known
        assert again.id == info.id
        hit = store.search("marker9", [info.id], k=1)[0]
        assert hit.page is not None and hit.last_page is not None and hit.page <= 9 <= hit.last_page
    finally:
        store.close()


def test_re_index_reads_a_pdf_indexed_before_pages_were_kept_again(tmp_path: Path) -> None:
    from engine.documents.library import DocumentLibrary

    path, converted, store = inspection_pdf(tmp_path)
    try:
        stat = path.stat()
        info = store.add(replace(converted, page_starts=(), size_bytes=stat.st_size, mtime=stat.st_mtime))
        library = DocumentLibrary(store, embed=lambda texts: np.ones((len(texts), 8), dtype=np.float32))
        assert library.refresh([info.id]) == ([info.id], [])  # opening its chat reads nothing again
        assert store.page_starts(info.id) == []
        ids, notes = library.refresh([info.id], retry_vectors=True)  # Re-index
        assert ids == [info.id] and notes == ["inspection.pdf was read again; its passages now cite their pages."]
        assert store.page_starts(info.id) == list(converted.page_starts)
        assert library.refresh([info.id], retry_vectors=True) == ([info.id], [])  # nothing left to do
    finally:
        store.close()
