"""Rough edges of attaching (engine.documents.library and ``brisk ask --attach``): a Cancel while a folder is
listed, progress while a file is indexed, a changed file read again, a note naming its file once.  The real
index on a SQLite file in tmp_path; a fake embed function where vectors matter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.documents import library as library_module
from engine.documents.chunking import chunk
from engine.documents.convert import DocumentError
from engine.documents.library import DocumentLibrary, indexing_name
from engine.documents.store import BATCH, DocumentStore

NOTE = "The crane must be booked three days ahead. Visitor badges are orange.\n"
LONG = "\n\n".join(f"Paragraph {n}: " + " ".join(f"word{n}x{m}" for m in range(120)) for n in range(60))


@pytest.fixture
def store(tmp_path: Path, brisk_data_dir: Path) -> Iterator[DocumentStore]:
    db = DocumentStore(tmp_path / "documents.db")
    yield db
    db.close()


def words_only(store: DocumentStore) -> DocumentLibrary:
    return DocumentLibrary(store, embed=lambda texts: None)


def nested_folder(tmp_path: Path) -> Path:
    """A folder with a file and a subfolder (the listing asks ``cancel()`` before each subfolder)."""
    folder = tmp_path / "project"
    (folder / "docs").mkdir(parents=True)
    (folder / "readme.md").write_text(NOTE, encoding="utf-8")
    (folder / "docs" / "guide.md").write_text(NOTE + "More.\n", encoding="utf-8")
    return folder


def test_a_cancel_while_a_folder_is_listed_ends_quietly_with_nothing_half_read(
    tmp_path: Path, store: DocumentStore
) -> None:
    single = tmp_path / "single.md"
    single.write_text("A file before the folder.\n", encoding="utf-8")
    seen: list[tuple[int, int, str]] = []
    results = words_only(store).attach(
        [single, nested_folder(tmp_path)], progress=lambda *a: seen.append(a), cancel=lambda: True
    )  # raised Cancelled before: the window said "No file was attached: Reading the folder ... was cancelled."
    assert [(Path(r.path).name, r.ok, r.cancelled) for r in results] == [("project", False, True)]
    assert "cancelled" in results[0].problem
    assert store.list() == [], "nothing was indexed"
    assert seen[-1] == (1, 1, ""), "the progress still ends"


def test_a_folder_that_cannot_be_listed_is_named_and_the_other_files_still_attached(
    tmp_path: Path, store: DocumentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    single = tmp_path / "single.md"
    single.write_text(NOTE, encoding="utf-8")
    folder = nested_folder(tmp_path)

    def gone(path: Path, cancel: object = None) -> tuple[list[Path], list[str]]:
        raise DocumentError(f"{path} is not a folder that can be read; check the path and try again.")

    monkeypatch.setattr(library_module, "walk", gone)  # removed between the look and the listing
    results = words_only(store).attach([folder, single])
    assert [(Path(r.path).name, r.ok) for r in results] == [("project", False), ("single.md", True)]
    assert "not a folder that can be read" in results[0].problem and not results[0].cancelled


def vectors(texts: list[str]) -> np.ndarray:
    return np.ones((len(texts), 8), dtype=np.float32)


def test_indexing_a_file_reports_its_passages(tmp_path: Path, store: DocumentStore) -> None:
    big = tmp_path / "big.md"
    big.write_text(LONG, encoding="utf-8")
    passages = len(chunk(LONG.rstrip("\n") + "\n"))
    assert passages > 2 * BATCH, "several batches of vectors"
    seen: list[tuple[int, int, str]] = []
    (result,) = DocumentLibrary(store, embed=vectors).attach([big], progress=lambda *a: seen.append(a))
    assert result.ok
    indexing = [name for _, _, name in seen if name.endswith("passages)")]
    # was: nothing between "big.md" and the end while every batch was embedded
    assert indexing == [indexing_name("big.md", n, passages) for n in [*range(0, passages, BATCH), passages]], seen
    assert all(done == 0 and total == 1 for done, total, name in seen if name), "file 1 of 1 throughout"
    info = store.get(result.doc_id)
    assert info is not None and info.embedded and info.chunks == passages


def test_cancel_while_a_file_is_indexed_keeps_nothing_of_it(tmp_path: Path, store: DocumentStore) -> None:
    big, after = tmp_path / "big.md", tmp_path / "after.md"
    big.write_text(LONG, encoding="utf-8")
    after.write_text(NOTE, encoding="utf-8")
    stop = threading.Event()
    seen: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        stop.set()  # Cancel pressed while the first batch is embedded
        return vectors(texts)

    results = DocumentLibrary(store, embed=embed).attach(
        [big, after], progress=lambda d, t, name: seen.append(name), cancel=stop.is_set
    )
    assert [(Path(r.path).name, r.ok, r.cancelled) for r in results] == [("big.md", False, True)]
    assert "nothing of it was kept" in results[0].problem
    assert store.list() == []
    assert indexing_name("big.md", 0, len(chunk(LONG.rstrip("\n") + "\n"))) in seen


class SlowEmbedder:
    """An embedding model that never finishes loading."""

    def wait(self, timeout: float | None = None) -> bool:
        threading.Event().wait(timeout)
        return False


def test_cancel_is_heard_while_indexing_waits_for_the_embedding_model(
    tmp_path: Path, store: DocumentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.answer_cache.embed as embed_module

    monkeypatch.setattr(embed_module, "shared_embedder", lambda: SlowEmbedder())
    monkeypatch.setattr(library_module, "EMBEDDER_WAIT_S", 10.0)
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    first.write_text(NOTE, encoding="utf-8")
    second.write_text(NOTE + "Another.\n", encoding="utf-8")
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        results = DocumentLibrary(store).attach([first, second], cancel=stop.is_set)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5, "the wait for the model did not outlast Cancel"
    # the file being indexed is whole (searched by its words until its vectors are made); no other is read
    assert [(Path(r.path).name, r.ok) for r in results] == [("first.md", True)]
    info = store.get(results[0].doc_id)
    assert info is not None and not info.embedded


def test_a_changed_file_read_again_names_the_text_it_replaced(tmp_path: Path, store: DocumentStore) -> None:
    note = tmp_path / "note.md"
    note.write_text(NOTE, encoding="utf-8")
    library = words_only(store)
    (old,) = library.attach([note])
    assert old.ok and old.replaced == ""
    (same,) = library.attach([note])
    assert same.doc_id == old.doc_id and same.replaced == "", "the same text replaces nothing"
    note.write_text(NOTE + "Backups stay ninety days.\n", encoding="utf-8")
    (new,) = library.attach([note])
    assert new.ok and new.doc_id != old.doc_id and new.replaced == old.doc_id
    assert [d.id for d in store.list()] == [new.doc_id]


def test_the_cli_names_a_file_once_in_its_notes(
    tmp_path: Path, store: DocumentStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import engine.client
    from engine.cli.chat import attach_documents

    latin = tmp_path / "latin1.txt"
    latin.write_bytes("Café crème brûlée, à la française.\n".encode("cp1252"))
    monkeypatch.setattr(engine.client, "document_library", lambda: words_only(store))
    ids, problems = attach_documents([str(latin)], as_json=False)
    assert len(ids) == 1 and problems == []
    err = capsys.readouterr().err
    assert "warning: latin1.txt is not UTF-8" in err, err
    assert err.count("latin1.txt") == 1, err  # was: "latin1.txt: latin1.txt is not UTF-8; ..."
    from engine.cli.chat import _named

    assert _named("a.md", "data.md is not UTF-8.") == "a.md: data.md is not UTF-8."  # a name inside another's
    assert _named("notes.md", "Read notes.md.") == "Read notes.md."


def _kv_file(directory: Path, name: str, doc_ids: list[str], payload: int) -> Path:
    """A file laid out as the engine saves a document prefix's KV: a safetensors header naming its documents."""
    import json
    import struct

    header = json.dumps({"__metadata__": {"documents": json.dumps(doc_ids)}}).encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(payload))
    return path


def test_kv_bytes_for_every_document_read_each_file_once(
    store: DocumentStore, brisk_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.documents import kvfiles
    from engine.paths import cache_dir

    root = cache_dir() / "kv"
    one = _kv_file(root / "documents-aaaa", "one", ["a", "b"], 1000)
    two = _kv_file(root / "documents-aaaa", "two", ["b"], 500)
    three = _kv_file(root / "documents-bbbb", "three", ["a", "a"], 300)  # another model's copy; a listed twice
    (root / "documents-bbbb" / "not-kv.txt").write_text("ignored")
    reads: list[Path] = []
    real = kvfiles.file_documents

    def counted(path: Path) -> tuple[str, ...]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(library_module, "file_documents", counted)
    library = words_only(store)
    sizes = library.kv_bytes_all()
    size = {p: p.stat().st_size for p in (one, two, three)}
    assert sizes == {"a": size[one] + size[three], "b": size[one] + size[two]}
    assert sorted(reads) == sorted([one, two, three])  # each header once, whatever the number of documents
    assert "never-computed" not in sizes


def test_re_index_makes_the_vectors_an_unchanged_file_never_got(tmp_path: Path, store: DocumentStore) -> None:
    path = tmp_path / "long.md"
    path.write_text(LONG, encoding="utf-8")
    (attached,) = words_only(store).attach([path])  # the embedder was not ready: words only
    info = store.get(attached.doc_id)
    assert info is not None and info.chunks > 1 and not info.embedded

    def embed(texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 8), dtype=np.float32)

    library = DocumentLibrary(store, embed=embed)
    assert library.refresh([attached.doc_id]) == ([attached.doc_id], [])  # opening a chat does not embed
    assert not store.get(attached.doc_id).embedded  # type: ignore[union-attr]
    ids, notes = library.refresh([attached.doc_id], retry_vectors=True)  # Re-index
    assert ids == [attached.doc_id]
    assert notes == ["long.md: its passages can now be searched by meaning too."]
    assert store.get(attached.doc_id).embedded  # type: ignore[union-attr]
    assert library.refresh([attached.doc_id], retry_vectors=True) == ([attached.doc_id], [])  # nothing left to do


def test_re_index_makes_vectors_from_the_kept_chunks_even_when_the_file_moved(
    tmp_path: Path, store: DocumentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "long.md"
    path.write_text(LONG, encoding="utf-8")
    (attached,) = words_only(store).attach([path])
    path.unlink()  # moved away: only the index holds its text

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file was read again")

    monkeypatch.setattr(library_module.Reader, "convert", no_reading)
    library = DocumentLibrary(store, embed=lambda texts: np.ones((len(texts), 8), dtype=np.float32))
    ids, notes = library.refresh([attached.doc_id], retry_vectors=True)
    assert ids == [attached.doc_id]
    assert notes == [f"long.md is no longer at {path}; its indexed text is used.",
                     "long.md: its passages can now be searched by meaning too."]  # fmt: skip
    assert store.get(attached.doc_id).embedded  # type: ignore[union-attr]
