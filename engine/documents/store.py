"""The document index: a rebuildable SQLite file of documents, their chunks, BM25 and vectors.

:class:`DocumentStore` keeps, in ``data_dir()/documents.db`` (opened through
``engine.storage.db.connect``, so it gets the same checks, WAL, busy timeout
and translated errors as the chat history, in a file of its own):

* ``documents``: one row per distinct text; the id is the SHA-256 of the text,
  so the same file attached twice, or in two chats, is one document.
* ``document_text``: the whole text, for the engine to put in a prompt.
* ``chunks``: ``(doc_id, idx, start, end, text, vector)``; ``text`` is
  ``document[start:end]`` as :func:`engine.documents.chunking.chunk` cut it;
  ``vector`` is float32, unit length, or NULL until it was embedded.
* ``chunks_fts``: an FTS5 index over the chunks' text (external content; kept
  in step by triggers, so a deleted chunk leaves the index with it).

:meth:`DocumentStore.add` writes a new document's text, chunks and BM25 rows in
one transaction (searchable by words at once), then embeds the chunks in
batches outside any transaction (the write lock is held for milliseconds, not
for the minutes a long file takes), each batch's vectors in a short write.
Cancelling removes everything the call wrote; a crash mid-way leaves a whole
document with some vectors, which :meth:`~DocumentStore.embed_document` (Re-index),
:meth:`~DocumentStore.embed_missing` (every document, for tools) or the next
``add`` of the same text completes.  ``state`` is ``'indexing'`` while
vectors are being made (``owner`` names the process: its id and start time,
so a document left ``'indexing'`` by a process that is gone, killed mid-way,
is set ``'indexed'`` with the vectors it has when the index is next opened),
``'indexed'`` after, ``'failed'`` when the embed function raised (words
still work; ``notes`` says why).  A file whose text changed replaces the
record of its path, once the new one is complete.

:meth:`DocumentStore.search` ranks a question's chunks by BM25 (its words,
each quoted, so no question is an FTS syntax error) and by cosine similarity,
fused as ``engine.documents.retrieval`` says (a convex combination of the two
scores: it measured better than reciprocal rank fusion on the benchmark notes).

Vectors are BLOBs scored with numpy, not sqlite-vec; ``python
-m engine.bench.vector_search`` on the 2-core machine, 20,000 chunks x 384 dims, 50
queries: numpy over a matrix held in memory 1.2 ms a query (median), sqlite-vec's
``vec0`` 15 ms (8.6 ms filtered to 5 documents), both giving the same top 10;
inserting 20,000 vectors 0.16 s as BLOBs, 0.19 s into ``vec0``.  (A ``vec0``
table with a partition key per document made a 1.6 GB file and 360 ms queries.)
Above all, Python's ``sqlite3`` here (and in many builds) has no
``enable_load_extension``, so sqlite-vec would need a second SQLite binding
beside ``engine.storage.db``.  Reading the 20,000 BLOBs back costs 37 ms a
query, so a set of documents' matrix is kept in memory (a few recent sets,
``retrieval.MatrixSets``) and reused while no commit happened, or always when
every document in the set had all its vectors (an id is its text's hash, so
they never change).  On 1,000 notes (``python -m engine.documents.corpus
/tmp/corpus 1000``): a hybrid search over all of them takes 1.9 ms (median),
the first one 14 ms (reading the vectors).

A damaged file is moved aside (``documents.db.damaged-<time>``) and a new one
started; :attr:`DocumentStore.notice` says so in words the window can show.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from sqlite_utils import Database

from engine.documents.chunking import chunk
from engine.documents.retrieval import CANDIDATES, Hit, Key, Matrix, MatrixSets, fts_query, fuse, ordered
from engine.storage.db import NotFoundError, Schema, SQLiteFile, StoreError, connect, is_corrupt

LABEL = "document index"
BATCH = 32  # chunks embedded per call of the embed function (and per progress report)
__all__ = ["DocumentInfo", "DocumentStore", "Hit", "IndexCancelled", "content_id", "ordered"]
Embed = Callable[[list[str]], np.ndarray | None]
T = TypeVar("T")


class IndexCancelled(Exception):
    """``add`` was cancelled: nothing it wrote was kept."""


class Source(Protocol):
    """What :meth:`DocumentStore.add` reads of a converted file (``engine.documents.convert.Converted``)."""

    @property
    def path(self) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def mtime(self) -> float: ...
    @property
    def pages(self) -> int | None: ...
    @property
    def notes(self) -> Any: ...


@dataclass(frozen=True)
class DocumentInfo:
    id: str
    path: str
    name: str
    kind: str
    size_bytes: int
    mtime: float
    chars: int
    pages: int | None
    added_at: float
    last_used: float
    state: str  # 'indexing' | 'indexed' | 'failed' (see the module docstring)
    notes: tuple[str, ...]
    embedded: bool  # every chunk has a vector
    chunks: int = 0
    bytes_used: int = 0  # text, chunk texts and vectors (the FTS index not counted)
    replaced: str | None = None  # add(): the id of the older text of this path, now removed


def content_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _v1(db: Database) -> None:
    for sql in (
        """CREATE TABLE documents (
            id TEXT PRIMARY KEY, path TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL DEFAULT '',
            size_bytes INTEGER NOT NULL DEFAULT 0, mtime REAL NOT NULL DEFAULT 0, chars INTEGER NOT NULL,
            pages INTEGER, added_at REAL NOT NULL, last_used REAL NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('indexing', 'indexed', 'failed')),
            notes TEXT NOT NULL DEFAULT '[]', embedded INTEGER NOT NULL DEFAULT 0)""",
        "CREATE INDEX documents_path ON documents (path)",
        "CREATE TABLE document_text (doc_id TEXT PRIMARY KEY REFERENCES documents (id) ON DELETE CASCADE, "
        "text TEXT NOT NULL)",
        """CREATE TABLE chunks (
            id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
            idx INTEGER NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL, text TEXT NOT NULL,
            vector BLOB, UNIQUE (doc_id, idx))""",
        "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id', "
        "tokenize='porter unicode61 remove_diacritics 2')",
        "CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN "
        "INSERT INTO chunks_fts (rowid, text) VALUES (new.id, new.text); END",
        "CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN "
        "INSERT INTO chunks_fts (chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
        "CREATE TRIGGER chunks_au AFTER UPDATE OF text ON chunks BEGIN "
        "INSERT INTO chunks_fts (chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); "
        "INSERT INTO chunks_fts (rowid, text) VALUES (new.id, new.text); END",
    ):
        db.execute(sql)


def _v2(db: Database) -> None:
    """Where each page of a PDF begins in its text, so a passage can be cited by page."""
    db.execute("ALTER TABLE documents ADD COLUMN page_starts TEXT NOT NULL DEFAULT '[]'")


def _v3(db: Database) -> None:
    """The process making a document's vectors (``pid:start``), so one killed mid-way is recovered."""
    db.execute("ALTER TABLE documents ADD COLUMN owner TEXT NOT NULL DEFAULT ''")


SCHEMA = Schema("documents", (_v1, _v2, _v3))
_INFO = (
    "d.id, d.path, d.name, d.kind, d.size_bytes, d.mtime, d.chars, d.pages, d.added_at, d.last_used, d.state, "
    "d.notes, d.embedded, (SELECT count(*) FROM chunks c WHERE c.doc_id = d.id), "
    "coalesce(length(CAST(t.text AS BLOB)), 0) + (SELECT coalesce(sum(length(CAST(c.text AS BLOB)) "
    "+ coalesce(length(c.vector), 0)), 0) FROM chunks c WHERE c.doc_id = d.id) "
    "FROM documents d LEFT JOIN document_text t ON t.doc_id = d.id"
)
_IDS = "(SELECT value FROM json_each(?))"  # a list of ids as one parameter: no limit on how many


def _info(row: Sequence[Any]) -> DocumentInfo:
    values = list(row)
    values[11] = tuple(json.loads(values[11] or "[]"))
    values[12] = bool(values[12])
    values[14] = int(values[14] or 0)
    return DocumentInfo(*values)


def pages_of(page_starts: Sequence[int], start: int, end: int) -> tuple[int | None, int | None]:
    """The first and last page (from 1) that the text ``[start, end)`` lies on, given where each page
    begins; (None, None) for a document without pages."""
    if not page_starts:
        return None, None
    return max(1, bisect_right(page_starts, start)), max(1, bisect_right(page_starts, max(start, end - 1)))


def _notes(raw: Any) -> list[str]:
    if not raw:
        return []
    return [str(raw)] if isinstance(raw, str) else [str(n) for n in raw]


class DocumentStore:
    """The document index (see the module docstring); every method may be called from any thread."""

    def __init__(self, path: str | Path | None = None, *, busy_timeout_s: float = 10.0) -> None:
        if path is None:
            from engine.paths import data_dir

            path = data_dir() / "documents.db"
        self.path: Path | None = None if str(path) == ":memory:" else Path(path)
        self.busy_timeout_ms = int(busy_timeout_s * 1000)
        self.notice: str | None = None  # set when a damaged file was moved aside: show it to the user once
        self._matrices = MatrixSets()
        self._writes = 0  # this object's own commits: a kept matrix of an incomplete set is stale after one
        self._reopen_lock = threading.Lock()  # one thread moves a damaged file aside
        self.file = self._open()
        if not self.file.read_only:
            self._recover()

    # -- the file ----------------------------------------------------------------------------

    def _open(self) -> SQLiteFile:
        try:
            file = connect(self.path, SCHEMA, busy_timeout_ms=self.busy_timeout_ms, label=LABEL)
        except StoreError:
            if self.path is None or not _damaged(self.path):
                raise
            self._move_aside()
            file = connect(self.path, SCHEMA, busy_timeout_ms=self.busy_timeout_ms, label=LABEL)
        with file.op("set up the document index"):
            file.db.execute("PRAGMA synchronous = NORMAL")  # rebuildable data: WAL's NORMAL is enough
        return file

    def _move_aside(self) -> None:
        assert self.path is not None
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        if aside.exists():
            aside = aside.with_name(f"{aside.name}-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):  # another Brisk moved it a moment ago
            os.replace(self.path, aside)
        for extra in ("-wal", "-shm"):  # a stale log must never be replayed into the new file
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{extra}", f"{aside}{extra}")
        self.notice = (
            f"The document index at {self.path} was damaged, so it was moved to {aside.name} and a new, "
            "empty index was started. Attach your documents again to search them."
        )
        self._matrices.clear()

    def _run(self, action: str, fn: Callable[[Database], T], write: bool = False) -> T:
        """One operation; damage found now moves the file aside and starts a new one (then raises)."""
        damaged = self.file
        try:
            with damaged.op(action, write=write) as db:
                result = fn(db)
            if write:
                self._writes += 1
            return result
        except StoreError as exc:
            if self.path is None or not is_corrupt(exc):
                raise
            with self._reopen_lock:
                if self.file is damaged:  # not yet moved aside by another thread
                    with contextlib.suppress(StoreError):
                        damaged.close()
                    self._move_aside()
                    self.file = self._open()
            raise StoreError(f"Could not {action}. {self.notice}") from exc

    def close(self) -> None:
        self.file.close()

    def _recover(self) -> None:
        """End ``'indexing'`` for documents whose indexing process is gone (a ``kill -9`` or a power cut
        mid-way): they keep the vectors made, are searched by words for the rest, and Re-index completes them."""
        sql = "SELECT id, owner FROM documents WHERE state = 'indexing'"
        for doc_id, owner in self._run("read the document index", lambda db: db.execute(sql).fetchall()):
            if not _alive(str(owner)):
                self._finish(str(doc_id))

    # -- documents ---------------------------------------------------------------------------

    def get(self, doc_id: str) -> DocumentInfo | None:
        sql = f"SELECT {_INFO} WHERE d.id = ?"
        rows = self._run("read the document index", lambda db: db.execute(sql, [doc_id]).fetchall())
        return _info(rows[0]) if rows else None

    def by_path(self, path: str | Path) -> DocumentInfo | None:
        """The document last added from ``path`` (None when no document came from there)."""
        sql = f"SELECT {_INFO} WHERE d.path = ? ORDER BY d.added_at DESC LIMIT 1"
        rows = self._run("read the document index", lambda db: db.execute(sql, [str(path)]).fetchall())
        return _info(rows[0]) if rows else None

    def list(self) -> list[DocumentInfo]:
        sql = f"SELECT {_INFO} ORDER BY d.name COLLATE NOCASE, d.id"
        return [_info(r) for r in self._run("list the indexed documents", lambda db: db.execute(sql).fetchall())]

    def text(self, doc_id: str) -> str:
        sql = "SELECT text FROM document_text WHERE doc_id = ?"
        rows = self._run("read a document's text", lambda db: db.execute(sql, [doc_id]).fetchall())
        if not rows:
            raise NotFoundError(f"No document {doc_id[:12]} in the document index; attach the file again.")
        return str(rows[0][0])

    def touch(self, doc_ids: Sequence[str]) -> None:
        sql = f"UPDATE documents SET last_used = ? WHERE id IN {_IDS}"
        self._run("mark documents used", lambda db: db.execute(sql, [time.time(), json.dumps(list(doc_ids))]), True)

    def remove(self, doc_id: str) -> bool:
        """Delete a document with its text, chunks, BM25 rows and vectors; False when there was none."""
        return self._run("remove a document from the index", lambda db: _delete(db, [doc_id]), True) > 0

    # -- adding ------------------------------------------------------------------------------

    def add(
        self,
        source: Source,
        *,
        embed: Embed | None = None,
        progress: Callable[[int, int], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> DocumentInfo:
        """Index a converted file (see the module docstring); raises :class:`IndexCancelled` when cancelled."""
        text = source.text
        doc_id = content_id(text)
        path, name = str(source.path), source.name or Path(str(source.path)).name
        if cancel is not None and cancel():
            raise IndexCancelled(f"Indexing {name} was cancelled; nothing of it was kept.")
        known = self.get(doc_id)
        spans = chunk(text) if known is None else []
        now = time.time()
        meta = {
            "path": path,
            "name": name,
            "kind": source.kind or "",
            "size_bytes": int(source.size_bytes or 0),
            "mtime": float(source.mtime or 0.0),
            "pages": source.pages,
            "page_starts": json.dumps([int(n) for n in getattr(source, "page_starts", ()) or ()]),  # a PDF's pages
            "last_used": now,
        }

        def begin(db: Database) -> bool:
            """Write the document (True) or refresh a known one's facts (False)."""
            sets = ", ".join(f"{k} = ?" for k in meta)
            row = db.execute("SELECT path FROM documents WHERE id = ?", [doc_id]).fetchone()
            if row:
                if row[0] != path and Path(str(row[0])).is_file():
                    # the same text from another file (a copy): the document keeps its first name and path,
                    # which its chats' prompts (and their KV) and its sources are made of
                    db.execute("UPDATE documents SET last_used = ? WHERE id = ?", [now, doc_id])
                else:
                    db.execute(f"UPDATE documents SET {sets} WHERE id = ?", [*meta.values(), doc_id])
                return False
            if not spans and text.strip():  # added by another process between our look and this write
                raise _Again
            row = {**meta, "id": doc_id, "chars": len(text), "added_at": now, "notes": json.dumps(_notes(source.notes))}
            row["state"] = "indexing" if embed is not None and spans else "indexed"
            row["owner"] = f"{os.getpid()}:{_started(os.getpid())}"
            db.execute(
                f"INSERT INTO documents ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})", [*row.values()]
            )
            db.execute("INSERT INTO document_text (doc_id, text) VALUES (?, ?)", [doc_id, text])
            db.conn.executemany(
                'INSERT INTO chunks (doc_id, idx, start, "end", text) VALUES (?, ?, ?, ?, ?)',
                [(doc_id, i, s, e, text[s:e]) for i, (s, e) in enumerate(spans)],
            )
            return True

        try:
            created = self._run("add the document to the index", begin, True)
        except _Again:
            return self.add(source, embed=embed, progress=progress, cancel=cancel)
        if embed is not None:
            try:
                self._embed([doc_id], embed, progress, cancel)
            except IndexCancelled:
                if created:
                    self.remove(doc_id)
                else:
                    self._finish(doc_id)
                raise IndexCancelled(f"Indexing {name} was cancelled; nothing of it was kept.") from None
        replaced = self._finish(doc_id, path)
        info = self.get(doc_id)
        assert info is not None
        if progress is not None:
            progress(info.chunks, info.chunks)
        return replace(info, replaced=replaced)

    def embed_missing(
        self,
        embed: Embed,
        *,
        progress: Callable[[int, int], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> int:
        """Give vectors to every chunk that has none (documents indexed before the embedder was ready, or
        cut off); returns how many were embedded.  Stops early when ``embed`` returns None."""
        sql = (
            "SELECT d.id, (SELECT count(*) FROM chunks c WHERE c.doc_id = d.id AND c.vector IS NULL) "
            "FROM documents d WHERE d.embedded = 0 ORDER BY d.added_at, d.id"
        )
        todo = self._run("read the document index", lambda db: db.execute(sql).fetchall())
        total, done = sum(n for _, n in todo), 0
        for doc_id, missing in todo:  # one document at a time: only its chunks' texts are held
            got = self._embed([doc_id], embed, progress, cancel, stop_quietly=True, before=done, total=total)
            self._finish(doc_id)
            done += got
            if got < missing:  # cancelled, not ready, or failed: the rest waits for the next call
                break
        return done

    def embed_document(
        self,
        doc_id: str,
        embed: Embed,
        *,
        progress: Callable[[int, int], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> bool:
        """Give vectors to the chunks of ``doc_id`` that have none, from the chunks kept (the file is not read
        again); True when every chunk has one now.  A document still being indexed (an attach embedding it on
        another thread) is left to that attach."""
        info = self.get(doc_id)
        if info is None or info.state == "indexing":
            return False
        self._embed([doc_id], embed, progress, cancel, stop_quietly=True)
        self._finish(doc_id)
        now = self.get(doc_id)
        return now is not None and now.embedded

    def page_starts(self, doc_id: str) -> builtins.list[int]:
        """Where each page of a PDF begins in its text (empty for a text without pages, or a PDF indexed before
        pages were kept)."""
        sql = "SELECT page_starts FROM documents WHERE id = ?"
        rows = self._run("read the document index", lambda db: db.execute(sql, [doc_id]).fetchall())
        return [int(n) for n in json.loads(rows[0][0] or "[]")] if rows else []

    def _embed(
        self,
        doc_ids: Sequence[str],
        embed: Embed,
        progress: Callable[[int, int], None] | None,
        cancel: Callable[[], bool] | None,
        stop_quietly: bool = False,
        before: int = 0,
        total: int | None = None,
    ) -> int:
        """Embed the chunks of ``doc_ids`` that have no vector, BATCH at a time, each batch's vectors in a
        short write; returns how many.  A raising ``embed`` marks those documents failed (their words
        still work).  ``progress(before + done, total)``: ``total`` defaults to this call's chunks."""
        sql = f"SELECT id, doc_id, text FROM chunks WHERE doc_id IN {_IDS} AND vector IS NULL ORDER BY doc_id, idx"
        todo = self._run("read the document index", lambda db: db.execute(sql, [json.dumps(list(doc_ids))]).fetchall())
        done = 0
        for first in range(0, len(todo), BATCH):
            if progress is not None:
                progress(before + done, len(todo) if total is None else total)
            if cancel is not None and cancel():
                if stop_quietly:
                    break
                raise IndexCancelled
            batch = todo[first : first + BATCH]
            try:
                vectors = embed([t for _, _, t in batch])
                if vectors is None:  # the embedder is not ready: Re-index (embed_document) makes them later
                    break
                rows = np.asarray(vectors, dtype=np.float32).reshape(len(batch), -1)  # one row per text, or raise
            except Exception as exc:  # kept in the document's notes and state: never silent
                self._failed({d for _, d, _ in batch}, exc)
                break
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            pairs = [(r.astype("<f4").tobytes(), cid) for r, (cid, _, _) in zip(rows, batch, strict=True)]
            self._run("save chunk vectors", partial(_save_vectors, pairs=pairs), True)
            done += len(batch)
        return done

    def _failed(self, doc_ids: Iterable[str], exc: Exception) -> None:
        note = f"Searched by its words only: making its vectors failed ({exc}); re-index it to try again."

        def mark(db: Database) -> None:
            for doc_id in doc_ids:
                row = db.execute("SELECT notes FROM documents WHERE id = ?", [doc_id]).fetchone()
                if row is None:  # removed meanwhile
                    continue
                notes = [n for n in json.loads(row[0] or "[]") if not n.startswith("Searched by its words")] + [note]
                db.execute("UPDATE documents SET state = 'failed', notes = ? WHERE id = ?", [json.dumps(notes), doc_id])

        self._run("note a failed embedding", mark, True)

    def _finish(self, doc_id: str, path: str | None = None) -> str | None:
        """Record whether every chunk has a vector, end 'indexing', and remove older texts of ``path``;
        returns the id of the older text removed (the engine forgets its KV)."""

        def finish(db: Database) -> str | None:
            missing = db.execute("SELECT 1 FROM chunks WHERE doc_id = ? AND vector IS NULL LIMIT 1", [doc_id])
            embedded = missing.fetchone() is None
            db.execute(
                "UPDATE documents SET embedded = ?, state = CASE state WHEN 'failed' THEN "
                "CASE WHEN ? THEN 'indexed' ELSE 'failed' END ELSE 'indexed' END WHERE id = ?",
                [int(embedded), int(embedded), doc_id],
            )
            if path is None:
                return None
            old = db.execute(
                "SELECT id FROM documents WHERE path = ? AND id != ? ORDER BY added_at DESC", [path, doc_id]
            ).fetchall()
            _delete(db, [r[0] for r in old])
            return str(old[0][0]) if old else None

        return self._run("finish indexing the document", finish, True)

    # -- searching ---------------------------------------------------------------------------

    def search(
        self, query: str, doc_ids: Sequence[str], k: int = 6, *, query_vector: np.ndarray | None = None
    ) -> builtins.list[Hit]:
        """The ``k`` best chunks of ``doc_ids`` for ``query``, best first: BM25 and (with ``query_vector``)
        cosine similarity, fused (``engine.documents.retrieval``); BM25 alone without a vector, vectors
        alone when the query has no words."""
        ids = list(dict.fromkeys(doc_ids))
        if not ids or k <= 0:
            return []
        depth = max(CANDIDATES, k)
        words = self._bm25(fts_query(query), ids, depth)
        near: builtins.list[tuple[Key, float]] = []
        cosine: Callable[[Key], float | None] = lambda key: None  # noqa: E731
        if query_vector is not None:
            matrix = self._matrix(ids)
            scores = matrix.similarities(query_vector)
            if scores is not None:
                near = matrix.top(scores, depth)
                cosine = lambda key: None if (row := matrix.row_of.get(key)) is None else float(scores[row])  # noqa: E731
        best = fuse(words, near, cosine)[:k]
        sql = (
            'SELECT c.doc_id, d.name, d.path, c.idx, c.start, c."end", c.text, d.page_starts FROM chunks c '
            "JOIN documents d ON d.id = c.doc_id WHERE c.doc_id = ? AND c.idx = ?"
        )

        def fetch(db: Database) -> builtins.list[Hit]:
            hits = []
            pages: dict[str, builtins.list[int]] = {}  # each document's page starts, read once a search
            for key, score, bm25_rank, vector_rank in best:
                row = db.execute(sql, list(key)).fetchone()
                if row is not None:  # removed by another process since it was ranked
                    doc, name, path, idx, start, end, text, starts = row
                    if doc not in pages:
                        pages[doc] = json.loads(starts or "[]")
                    first, last = pages_of(pages[doc], start, end)
                    hits.append(Hit(doc, name, path, idx, start, end, text, score, bm25_rank, vector_rank, first, last))
            return hits

        return self._run("read the found passages", fetch) if best else []

    def _bm25(self, match: str, ids: Sequence[str], depth: int) -> builtins.list[tuple[Key, float]]:
        """The best BM25 candidates with their scores (FTS5's rank negated: higher is better)."""
        if not match:
            return []
        sql = (
            "SELECT c.doc_id, c.idx, chunks_fts.rank FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid "
            f"WHERE chunks_fts MATCH ? AND c.doc_id IN {_IDS} ORDER BY chunks_fts.rank, c.doc_id, c.idx LIMIT ?"
        )
        params = [match, json.dumps(list(ids)), depth]
        rows = self._run("search the documents", lambda db: db.execute(sql, params).fetchall())
        return [((str(d), int(i)), -float(r)) for d, i, r in rows]

    def _matrix(self, ids: Sequence[str]) -> Matrix:
        """The vectors of ``ids``' chunks, kept between questions (reading the BLOBs back is most of a
        query's time otherwise); a set with a document still missing vectors is read again after any
        commit, by this object or another connection."""
        version = self._run("read the document index", lambda db: db.execute("PRAGMA data_version").fetchone()[0])
        rows_sql = f"SELECT doc_id, idx, vector FROM chunks WHERE doc_id IN {_IDS} AND vector IS NOT NULL"
        complete_sql = f"SELECT count(*) FROM documents WHERE id IN {_IDS} AND embedded = 1"

        def read(key: tuple[str, ...]) -> tuple[builtins.list[tuple[str, int, bytes]], bool]:
            def run(db: Database) -> tuple[builtins.list[tuple[str, int, bytes]], bool]:
                rows = db.execute(rows_sql, [json.dumps(key)]).fetchall()
                return rows, db.execute(complete_sql, [json.dumps(key)]).fetchone()[0] == len(key)

            return self._run("read chunk vectors", run)

        return self._matrices.get(ids, (self._writes, version), read)


class _Again(Exception):
    """The document appeared between ``add``'s first look and its write: look again."""


def _save_vectors(db: Database, pairs: list[tuple[bytes, int]]) -> None:
    db.conn.executemany("UPDATE chunks SET vector = ? WHERE id = ?", pairs)


def _delete(db: Database, doc_ids: Sequence[str]) -> int:
    """Delete documents and everything of theirs (the chunks' trigger removes their BM25 rows)."""
    ids = json.dumps(list(doc_ids))
    db.execute(f"DELETE FROM chunks WHERE doc_id IN {_IDS}", [ids])
    db.execute(f"DELETE FROM document_text WHERE doc_id IN {_IDS}", [ids])
    return int(db.execute(f"DELETE FROM documents WHERE id IN {_IDS}", [ids]).rowcount)


def _damaged(path: Path) -> bool:
    """True when SQLite itself finds the file damaged or not a database (not locked, not unreadable)."""
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            return bool(conn.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok")
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (11, 26)


def _started(pid: int) -> str:
    """When process ``pid`` started (Linux: field 22 of ``/proc/PID/stat``, in clock ticks), "" where unknown:
    with the pid it names one process, never a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def _alive(owner: str) -> bool:
    """Whether the process an ``owner`` value names (``pid:start``) is still running; false for an empty or
    unreadable value, a pid now given to another user's process or to one started later."""
    pid_text, _, started = owner.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill would end the process there: keep waiting for it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not the Brisk that wrote this row
        return False
    return not started or _started(pid) in ("", started)


_shared: dict[str, DocumentStore] = {}
_shared_lock = threading.Lock()


def shared_store(path: str | Path | None = None) -> DocumentStore:
    """The process's one store for the index at ``path`` (default: the data folder's): the window's library
    and the engine read and write through the same object, so a damaged file moved aside by one is never
    still used by the other, and their writes share one connection's lock."""
    from engine.paths import data_dir

    where = str(Path(path) if path is not None else data_dir() / "documents.db")
    with _shared_lock:
        store = _shared.get(where)
        if store is None:
            store = _shared[where] = DocumentStore(where)
        return store
