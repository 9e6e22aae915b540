"""Attached documents on the engine thread: what goes into the prompt, and their KV kept like data.

``Documents.apply`` turns a request's document ids (``Request.documents``,
content hashes in the document index, ``engine.documents.store``) into the
messages the prompt is built from (``engine.documents.render``):

* Documents that fit go in whole, after the system prompt, in a stable order.
  "Fit" is a budget of the prompt (``WHOLE_SHARE`` of what the context leaves
  after the reply's room), filled smallest document first, so which documents
  go whole depends only on the set, never on the question.  Their prefix's KV
  is computed once and kept under a key of its own (``DOCUMENTS`` + a hash of
  the prefix's tokens): in memory in the prefix cache, and on disk in a file of
  its own (``document_kv_dir``), read back when a later request (a new chat, a
  new process) needs that very prefix.  The file is named by that hash, so a
  document whose text changed has other tokens, another hash, and its old KV
  is never used; its metadata lists the documents' ids, so removing a document
  removes every file that holds it (``engine.documents.kvfiles``).
* The rest are searched: the question's best passages (``PASSAGES`` of them at
  most, within ``PASSAGE_TOKENS``) go into the question's turn, numbered in
  document order (BM25 and, when the embedder is ready, vectors; hybrid).

A document id that is no longer in the index is left out with a warning; an
index that cannot be opened fails the reply with a message saying what to do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.documents import render
from engine.documents.kvfiles import DOCUMENTS, document_key, document_kv_file, forget_document, kv_files
from engine.runtime.prompt import prompt_budget

__all__ = ["DOCUMENTS", "Applied", "Documents", "document_key", "document_kv_file", "forget_document", "kv_files"]

WHOLE_SHARE = 0.75  # of the prompt budget, at most this much goes to whole documents
PASSAGES = 6  # retrieved passages per question, at most
PASSAGE_TOKENS = 1600  # and at most this many tokens of them


@dataclass
class Applied:
    """A request's documents as the prompt carries them."""

    messages: list[dict[str, Any]]
    whole: tuple[str, ...] = ()  # ids of the documents that went in whole (their KV is a prefix)
    whole_tokens: int = 0
    passage_tokens: int = 0
    sources: tuple[dict[str, Any], ...] = ()
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.whole_tokens + self.passage_tokens


class Documents:
    """The engine's view of the document index (opened at the first request that attaches documents)."""

    def __init__(self, open_store: Callable[[], Any] | None = None) -> None:
        self._open_store = open_store
        self._store: Any = None
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # document -> tokens of its whole text, in ``_counted_by``'s tokens
        self._counted_by: Any = None  # the tokenizer those counts are of (a new model's starts them again)

    def store(self) -> Any:
        with self._lock:
            if self._store is None:
                if self._open_store is None:
                    from engine.documents.store import DocumentStore

                    self._store = DocumentStore()
                else:
                    self._store = self._open_store()
            return self._store

    def count(self, tokenizer: Any, doc_id: str, text: str) -> int:
        if tokenizer is not self._counted_by:
            self._counts, self._counted_by = {}, tokenizer
        if doc_id not in self._counts:
            self._counts[doc_id] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._counts[doc_id]

    def apply(
        self,
        doc_ids: Sequence[str],
        messages: list[dict[str, Any]],
        tokenizer: Any,
        context: int,
        max_tokens: int,
        embed: Callable[[str], Any] | None = None,
        passages: bool = True,
    ) -> Applied:
        """The messages with ``doc_ids``' documents (see the module's docstring); ``passages`` False leaves
        out the retrieved passages (a draft being typed: only what no keystroke changes)."""
        store = self.store()
        warnings: list[str] = []
        found = []
        for doc_id in dict.fromkeys(doc_ids):
            info = store.get(doc_id)
            if info is None:
                warnings.append(
                    f"A document attached to this chat ({doc_id[:12]}) is no longer in the document index; "
                    "attach the file again to use it."
                )
                continue
            found.append(info)
        budget = int(prompt_budget(context, max_tokens) * WHOLE_SHARE)
        whole: list[render.Whole] = []
        searched: list[str] = []
        used = 0
        for info in sorted(found, key=lambda i: (i.chars, i.id)):  # smallest first: the set decides, not the question
            if used + info.chars // 8 > budget:  # far too long to fit (no token is shorter than 8 characters here)
                searched.append(info.id)
                continue
            text = store.text(info.id)
            tokens = self.count(tokenizer, info.id, text)
            if used + tokens <= budget:
                whole.append(render.Whole(info.id, info.name, text, info.path))
                used += tokens
            else:
                searched.append(info.id)
        chosen: list[render.Passage] = []
        passage_tokens = 0
        question = str(messages[-1].get("content", "")) if messages else ""
        if searched and passages and question.strip():
            vector = embed(question) if embed is not None else None
            hits = store.search(question, searched, k=PASSAGES, query_vector=vector)
            for hit in hits:  # best first, until the passages' budget is spent
                cost = len(tokenizer(hit.text, add_special_tokens=False)["input_ids"])
                if passage_tokens + cost > PASSAGE_TOKENS and chosen:
                    break
                chosen.append(render.Passage(hit.doc_id, hit.name, hit.idx, hit.start, hit.end, hit.text, hit.path))
                passage_tokens += cost
        if found:
            with contextlib.suppress(Exception):  # last use is a nicety, never the reply's end
                store.touch([info.id for info in found])
        return Applied(
            render.with_documents(messages, whole, chosen),
            tuple(doc.doc_id for doc in render.whole_order(whole)),
            used,
            passage_tokens,
            render.sources(whole, chosen),
            warnings,
        )
