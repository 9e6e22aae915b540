"""Attaching files and folders: convert, index, and keep them like data (what the window and the CLI call).

:class:`DocumentLibrary` is the one door to documents for a client: ``attach``
converts each file (``engine.documents.convert``, in a child process with a
deadline per file: ``engine.documents.worker``), indexes it
(``engine.documents.store``: text, chunks, BM25, vectors when the embedder is
ready) and returns one :class:`Attached` per file, a clear message for each
that could not be taken; a folder is walked (hidden folders, caches and
virtual environments left out; a link is followed only to a file inside the
folder, checked again when the file is read); ``each`` yields the same results
one at a time, as each file is done (the CLI prints them as they come).  ``progress(done, total, name)`` is called
between files (``name``: the file's name), while a long file is read
(``report.pdf (12 of 40)``, its pages) and while it is indexed
(``report.pdf (96 of 800 passages)``, see :func:`indexing_name`);
``cancel()`` stops between pieces, even while a folder is listed, and leaves
nothing half-indexed (the result of the piece it stopped says ``cancelled``);
a Cancel while indexing waits for the embedding model to load keeps that file,
searched by its words until Re-index makes its vectors.
A file whose text changed since it was last attached replaces the older text's
document (``Attached.replaced`` names it, so a client can move every chat
holding it to the new one).  ``remove`` deletes a document's index rows
and every KV file that holds it; ``refresh`` re-reads a document whose file
changed on disk (size or time) and returns the ids to use now: the old id's KV
can no longer match, since its name is a hash of the old text's tokens.

The document id is the SHA-256 of the converted text, so the same file attached
twice, or in two chats, is one document, and a request names documents by id
(``engine.api.Request.documents``).
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from engine.documents.convert import Cancelled, DocumentError, walk
from engine.documents.kvfiles import file_documents, forget_document, kv_files
from engine.documents.store import IndexCancelled
from engine.documents.worker import Reader

Progress = Callable[[int, int, str], None]
EMBEDDER_WAIT_S = 60.0  # how long indexing waits for the embedding model to load before going by words alone


@dataclass(frozen=True)
class Attached:
    """One file the user attached: its document's id and facts, or why it could not be attached."""

    path: str
    doc_id: str = ""
    name: str = ""
    chars: int = 0
    problem: str = ""  # "" when attached
    notes: tuple[str, ...] = ()
    cancelled: bool = False  # the user cancelled before this file was indexed (nothing of it was kept)
    replaced: str = ""  # the id of this path's older text, removed from the index now (its file changed)

    @property
    def ok(self) -> bool:
        return not self.problem


class DocumentLibrary:
    """The document index as a client uses it (one per process is enough; every method is thread-safe)."""

    def __init__(self, store: Any = None, embed: Callable[[list[str]], Any] | None = None) -> None:
        if store is None:
            from engine.documents.store import shared_store

            store = shared_store()  # the one the engine reads too
        self.store = store
        self._embed = embed if embed is not None else _shared_embed

    def attach(
        self, paths: Iterable[str | Path], progress: Progress | None = None, cancel: Callable[[], bool] | None = None
    ) -> list[Attached]:
        """Convert and index every file of ``paths`` (folders walked); one result per file, in order."""
        return builtins.list(self.each(paths, progress, cancel))

    def each(
        self, paths: Iterable[str | Path], progress: Progress | None = None, cancel: Callable[[], bool] | None = None
    ) -> Iterator[Attached]:
        """:meth:`attach`'s results one at a time: first what listing the folders left out, then each file's as
        soon as it is indexed."""
        files: builtins.list[tuple[Path, Path | None]] = []  # a file and the folder it was found in
        for raw in paths:
            path = Path(os.path.expanduser(str(raw)))
            if path.is_dir():
                try:
                    found, skipped = walk(path, cancel=cancel)
                except Cancelled as exc:  # cancelled while listing: no file is read (as after any Cancel)
                    yield Attached(str(path), problem=str(exc), cancelled=True)
                    break
                except DocumentError as exc:  # gone or unreadable meanwhile: said, the others still read
                    yield Attached(str(path), problem=str(exc))
                    continue
                files.extend((file, path) for file in found)
                yield from (Attached(str(path), problem=message) for message in skipped)
                if not found:
                    yield Attached(str(path), problem=f"{path.name or path}: no file Brisk can read in it.")
            else:
                files.append((path, None))
        total = len(files)
        with Reader() as reader:
            for number, (path, folder) in enumerate(files):
                if cancel is not None and cancel():
                    break
                if progress is not None:
                    progress(number, total, path.name)
                yield self._attach_one(path, number, total, progress, cancel, reader, folder)
        if progress is not None:
            progress(total, total, "")

    def _attach_one(
        self,
        path: Path,
        number: int,
        total: int,
        progress: Progress | None,
        cancel: Callable[[], bool] | None,
        reader: Reader,
        folder: Path | None = None,
    ) -> Attached:
        def pages(done: int, of: int) -> None:
            if progress is not None and of:
                progress(number, total, f"{path.name} ({done} of {of})")

        def passages(done: int, of: int) -> None:
            if progress is not None and of:
                progress(number, total, indexing_name(path.name, done, of))

        embed = self._embed_for(cancel)
        try:
            converted = reader.convert(path, progress=pages, cancel=cancel, inside=folder)
            info = self.store.add(converted, embed=embed, progress=passages, cancel=cancel)
        except (Cancelled, IndexCancelled) as exc:
            return Attached(str(path), problem=str(exc), cancelled=True)
        except DocumentError as exc:
            return Attached(str(path), problem=str(exc))
        except Exception as exc:  # the index's own errors say what to do; anything else names the file
            return Attached(str(path), problem=f"{path.name} could not be indexed ({exc}).")
        replaced = getattr(info, "replaced", None) or ""
        if replaced:
            forget_document(replaced)  # the file changed: the old text's KV can never be used again
        return Attached(str(path), info.id, info.name, info.chars, notes=tuple(converted.notes), replaced=replaced)

    def _embed_for(self, cancel: Callable[[], bool] | None) -> Callable[[list[str]], Any]:
        if self._embed is _shared_embed and cancel is not None:  # waiting for the model to load must not outlast Cancel
            return partial(_shared_embed, cancel=cancel)
        return self._embed

    def _vectors_again(self, info: Any, cancel: Callable[[], bool] | None) -> builtins.list[str]:
        """Re-index of a document whose passages lack vectors (the embedder was not ready, or failed): make them
        from the chunks kept; what to tell the user (nothing when it had them all)."""
        if info.chunks == 0 or info.embedded:
            return []
        if self.store.embed_document(info.id, self._embed_for(cancel), cancel=cancel):
            return [f"{info.name}: its passages can now be searched by meaning too."]
        return [f"{info.name}: its passages are still searched by their words only (no vectors yet)."]

    def list(self) -> builtins.list[Any]:
        """Every document in the index (``DocumentInfo``); :meth:`kv_bytes_all` gives their KV on disk."""
        return list(self.store.list())

    def kv_bytes_all(self) -> dict[str, int]:
        """Bytes of KV files on disk per document id that any of them holds (a document whose prefix was never
        computed is absent): each file's header read once, however many documents are listed."""
        total: dict[str, int] = {}
        for path in kv_files():
            try:
                size = path.stat().st_size
            except OSError:  # a file removed meanwhile holds nothing
                continue
            for doc_id in set(file_documents(path)):
                total[doc_id] = total.get(doc_id, 0) + size
        return total

    def remove(self, doc_id: str) -> None:
        """Forget a document: its index rows, vectors and every KV file that holds it."""
        self.store.remove(doc_id)
        forget_document(doc_id)

    def refresh(
        self, doc_ids: Sequence[str], cancel: Callable[[], bool] | None = None, retry_vectors: bool = False
    ) -> tuple[builtins.list[str], builtins.list[str]]:
        """The ids to send now for ``doc_ids``: a document whose file changed on disk is read again (a new id),
        one whose file is gone keeps its indexed text; second item: what the user should hear about that.
        ``retry_vectors`` (Re-index): a document whose passages lack vectors (the embedder was not ready, or
        failed) gets them from the chunks kept, and an unchanged PDF indexed before pages were kept is read
        again, so its passages cite their pages."""
        with Reader() as reader:  # started only when a file is read again
            return self._refresh(doc_ids, cancel, retry_vectors, reader)

    def _refresh(
        self, doc_ids: Sequence[str], cancel: Callable[[], bool] | None, retry_vectors: bool, reader: Reader
    ) -> tuple[builtins.list[str], builtins.list[str]]:
        ids: builtins.list[str] = []
        notes: builtins.list[str] = []
        for doc_id in doc_ids:
            info = self.store.get(doc_id)
            if info is None:
                notes.append(f"A document of this chat ({doc_id[:12]}) was removed from the index; attach it again.")
                continue
            path = Path(info.path) if info.path else None
            try:
                stat = path.stat() if path is not None else None
            except OSError:
                stat = None
            if stat is None:
                notes.append(f"{info.name} is no longer at {info.path}; its indexed text is used.")
                ids.append(doc_id)
                if retry_vectors:
                    notes += self._vectors_again(info, cancel)
                continue
            unchanged = stat.st_size == info.size_bytes and abs(stat.st_mtime - info.mtime) < 1e-3
            # Re-index of a PDF indexed before its pages were kept reads it again, so its passages cite pages
            no_pages = retry_vectors and info.kind == "pdf" and not self.store.page_starts(doc_id)
            if unchanged and not no_pages:
                ids.append(doc_id)
                if retry_vectors:
                    notes += self._vectors_again(info, cancel)
                continue
            assert path is not None
            result = self._attach_one(path, 0, 1, None, cancel, reader)
            if result.ok:
                ids.append(result.doc_id)
                if result.doc_id != doc_id:
                    notes.append(f"{info.name} changed on disk; it was read again.")
                elif no_pages:
                    notes.append(f"{info.name} was read again; its passages now cite their pages.")
            else:
                notes.append(f"{result.problem} The text indexed before is used.")
                ids.append(doc_id)
        return ids, notes


def indexing_name(name: str, done: int, of: int) -> str:
    """The ``name`` that ``progress`` gets while a file's passages are indexed: ``report.pdf (96 of 800
    passages)`` (the window's progress line reads it back)."""
    return f"{name} ({done} of {of} passages)"


def _shared_embed(texts: list[str], cancel: Callable[[], bool] | None = None) -> Any:
    """Vectors of ``texts`` from the process's embedder, waiting for it to load (indexing runs in the
    background); None when it cannot load, or when ``cancel()`` came true while it loads: the document is
    then searched by its words alone until Re-index makes its vectors (``refresh(retry_vectors=True)``)."""
    from engine.answer_cache.embed import shared_embedder

    embedder = shared_embedder()
    if not _wait_for(embedder, cancel):
        return None
    return embedder.embed(texts)


def _wait_for(embedder: Any, cancel: Callable[[], bool] | None) -> bool:
    """Wait up to :data:`EMBEDDER_WAIT_S` for ``embedder`` to load, a tenth of a second at a time when
    ``cancel`` is given (so a Cancel is heard at once); true when it is ready."""
    if cancel is None:
        return bool(embedder.wait(EMBEDDER_WAIT_S))
    deadline = time.monotonic() + EMBEDDER_WAIT_S
    while not cancel() and (now := time.monotonic()) < deadline:
        if embedder.wait(min(0.1, deadline - now)):
            return True
        if getattr(embedder, "loaded", False):  # the load ended without a model
            return False
    return False
