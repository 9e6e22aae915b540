"""Attached documents on the engine thread: what goes into the prompt, and their KV kept like data.

``Documents.apply`` turns a request's document ids (``Request.documents``,
content hashes in the document index, ``engine.documents.store``) into the
messages the prompt is built from (``engine.documents.render``):

* Documents that fit go in whole, after the system prompt, in a stable order.
  "Fit" is the smallest of three: what the prompt leaves once the messages
  themselves are in (the reply's room, system prompt, history and question
  come first, so documents never push the question out), ``PROMPT_SHARE`` of
  the prompt (room for the chat to grow), and ``WHOLE_SHARE`` of the prefix
  cache's bytes (a prefix the cache could not keep would be computed again for
  every question).  It is filled smallest document first, so which documents
  go whole depends on the set and the chat's length, never on the question
  (a chat template with no system role gets them at the start of the first
  user turn, reused within the chat only).  Their prefix's KV
  is computed once and kept under a key of its own (``DOCUMENTS`` + a hash of
  the prefix's tokens): in memory in the prefix cache, and on disk in a file of
  its own (``document_kv_dir``), read back when a later request (a new chat, a
  new process) needs that very prefix.  The file is named by that hash, so a
  document whose text changed has other tokens, another hash, and its old KV
  is never used; its metadata lists the documents' ids, so removing a document
  removes every file that holds it (``engine.documents.kvfiles``).
* The rest are searched: the question's best passages (``PASSAGES`` of them at
  most, within ``PASSAGE_TOKENS`` and what the prompt has left) go into the
  question's turn, numbered in document order (BM25 and, when the embedder is
  ready, vectors; hybrid).

A reply's ``document_tokens`` (``Applied.tokens``) count the whole documents'
texts as their chips do (``Documents.count``: the text alone, in the loaded
model's tokenizer), so the chip and the context meter say the same number; the
introduction and each document's tag count with the system prompt.
``Applied.sources_for(reply)`` marks which of the documents and passages the
reply's text can be tied to (``engine.documents.grounding``).

A document id that is no longer in the index is left out with a warning; an
index that cannot be opened fails the reply with a message saying what to do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.documents import grounding, render
from engine.documents.kvfiles import DOCUMENTS, document_key, document_kv_file, forget_document, kv_files

__all__ = ["DOCUMENTS", "Applied", "Documents", "document_key", "document_kv_file", "forget_document", "kv_files"]

WHOLE_SHARE = 0.5  # of the prefix cache's bytes, at most this much KV is whole documents
PROMPT_SHARE = 0.75  # of the prompt budget, at most this much is whole documents
MARGIN = 16  # prompt tokens kept for a system message the documents add, and re-tokenisation at the seams
PASSAGES = 6  # retrieved passages per question, at most
PASSAGE_TOKENS = 1600  # and at most this many tokens of them


@dataclass
class Applied:
    """A request's documents as the prompt carries them."""

    messages: list[dict[str, Any]]
    whole: tuple[str, ...] = ()  # ids of the documents that went in whole (their KV is a prefix)
    whole_tokens: int = 0  # the prompt tokens they take: the introduction, their tags and their texts
    passage_tokens: int = 0
    sources: tuple[dict[str, Any], ...] = ()
    warnings: list[str] = field(default_factory=list)
    base_ids: list[int] = field(default_factory=list)  # the prompt without the documents (where they begin)
    text_tokens: int = 0  # of ``whole_tokens``, their texts' alone: what their chips count
    texts: tuple[str, ...] = ()  # the text of each of ``sources``, in order
    found_ids: tuple[str, ...] = ()  # the documents found in the index: a reply marks them used (Documents.touch)
    searched: bool = False  # some are too long to go whole: their passages depend on the question

    @property
    def tokens(self) -> int:
        """The documents' tokens a reply reports (``document_tokens``): whole texts as their chips count them,
        and the passages with their headers."""
        return self.text_tokens + self.passage_tokens

    def reused(self, block: int) -> int:
        """Of the whole documents' ``block`` first prompt tokens found in the cache (intro, tags and texts, from
        where they begin), how many count as their texts' (the intro and the first tag come first)."""
        return max(0, min(block, self.whole_tokens) - (self.whole_tokens - self.text_tokens))

    def sources_for(self, reply: str) -> tuple[dict[str, Any], ...]:
        """The sources, each marked ``"tied"``: whether ``reply``'s text can be tied to it."""
        return grounding.mark(self.sources, self.texts, reply) if self.texts else self.sources


class Documents:
    """The engine's view of the document index (opened at the first request that attaches documents)."""

    def __init__(self, open_store: Callable[[], Any] | None = None) -> None:
        self._open_store = open_store
        self._store: Any = None
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # document -> tokens of its whole text, in ``_counted_by``'s tokens
        self._counted_by: Any = None  # the tokenizer those counts are of (a new model's starts them again)
        self._costs: dict[str, int] = {}  # the headers' and intros' tokens, in ``_counted_by``'s tokens

    def store(self) -> Any:
        with self._lock:
            if self._store is None:
                if self._open_store is None:
                    from engine.documents.store import shared_store

                    self._store = shared_store()  # the same object the window's library writes through
                else:
                    self._store = self._open_store()
            return self._store

    def count(self, tokenizer: Any, doc_id: str, text: str) -> int:
        self._same_tokenizer(tokenizer)
        if doc_id not in self._counts:
            self._counts[doc_id] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._counts[doc_id]

    def cost(self, tokenizer: Any, text: str) -> int:
        """The tokens of a short rendering part (an intro, a document's tag, a passage's header), counted once:
        every Send and every hint of a chat with documents asks for the same few."""
        self._same_tokenizer(tokenizer)
        found = self._costs.get(text)
        if found is None:
            found = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(text) <= 256 and len(self._costs) < 4096:  # headers and intros, not passages' texts
                self._costs[text] = found
        return found

    def _same_tokenizer(self, tokenizer: Any) -> None:
        if tokenizer is not self._counted_by:
            self._counts, self._costs, self._counted_by = {}, {}, tokenizer

    def apply(
        self,
        doc_ids: Sequence[str],
        messages: list[dict[str, Any]],
        tokenizer: Any,
        room: int,
        whole_limit: int,
        embed: Callable[[str], Any] | None = None,
        passages: bool = True,
        into_user: bool = False,
    ) -> Applied:
        """The messages with ``doc_ids``' documents (see the module's docstring).

        ``room``: the prompt tokens left for documents once the messages themselves are counted (the reply's
        room, the system prompt, the history and the question come first: documents never push the question
        out); ``whole_limit``: the most tokens that go in whole (what the prefix cache can keep); ``passages``
        False leaves out the retrieved passages (a draft being typed); ``into_user``: the
        chat template has no system role, so whole documents open the first user message instead."""
        store = self.store()
        warnings: list[str] = []
        found: list[tuple[Any, str | None]] = []
        for doc_id in dict.fromkeys(doc_ids):
            info = store.get(doc_id)
            if info is None:
                warnings.append(
                    f"A document attached to this chat ({doc_id[:12]}) is no longer in the document index; "
                    "attach the file again to use it."
                )
                continue
            found.append((info, None))

        def cost(text: str) -> int:
            return self.cost(tokenizer, text)

        intro = cost(render.WHOLE_INTRO)
        budget = max(0, min(whole_limit, room - intro))
        whole: list[render.Whole] = []
        searched: list[str] = []
        used = 0  # the prompt tokens the whole documents take: intro, tags and texts
        texts = 0  # of them, the texts' alone (what the chips say)
        for info, _ in sorted(found, key=lambda f: (f[0].chars, f[0].id)):  # smallest first: the set decides
            if used + info.chars // 8 > budget:  # far too long to fit (no token is longer than 8 characters here)
                searched.append(info.id)
                continue
            try:
                text = store.text(info.id)
            except KeyError:  # removed from the index a moment ago
                warnings.append(f"{info.name} was removed from the document index; attach it again to use it.")
                continue
            tag = render.whole_block([render.Whole(info.id, info.name, "")]).removeprefix(render.WHOLE_INTRO)
            own = self.count(tokenizer, info.id, text)
            tokens = own + cost(tag)
            if used + tokens <= budget:
                whole.append(render.Whole(info.id, info.name, text, info.path))
                used += tokens
                texts += own
            else:
                searched.append(info.id)
        chosen: list[render.Passage] = []
        passage_tokens = 0
        limit = min(PASSAGE_TOKENS, room - used - cost(render.PASSAGES_INTRO + "\n\nQuestion: "))
        question = str(messages[-1].get("content", "")) if messages else ""
        if searched and passages and question.strip() and limit > 0:
            vector = embed(question) if embed is not None else None
            hits = store.search(question, searched, k=PASSAGES, query_vector=vector)
            for hit in hits:  # best first, while they fit (each with its numbered header)
                passage = render.Passage(hit.doc_id, hit.name, hit.idx, hit.start, hit.end, hit.text, hit.path,
                                         hit.page, hit.last_page)  # fmt: skip
                spent = cost(render.passages_block([passage]).removeprefix(render.PASSAGES_INTRO) + "\n\n")
                if passage_tokens + spent > limit:
                    break
                chosen.append(passage)
                passage_tokens += spent
        elif searched and passages and question.strip():
            warnings.append(
                "The conversation leaves no room in the model's context for passages of the attached documents; "
                "start a new chat to ask about them."
            )
        if whole:
            used += intro  # the documents' part of the prompt: the introduction, the tags and the texts
        # no system role (into_user): the documents open the first user turn, kept within the chat only, so no
        # prefix of whole documents is shared
        return Applied(
            render.with_documents(messages, whole, chosen, into_user=into_user),
            () if into_user else tuple(doc.doc_id for doc in render.whole_order(whole)),
            used,
            passage_tokens,
            render.sources(whole, chosen),
            warnings,
            found_ids=tuple(info.id for info, _ in found),
            searched=bool(searched),
            text_tokens=texts,
            texts=render.source_texts(whole, chosen),
        )

    def touch(self, doc_ids: Sequence[str]) -> None:
        """Mark ``doc_ids`` used now (the Documents view's "last use"); after a reply, off its first token's
        path (an index write)."""
        if doc_ids:
            with contextlib.suppress(Exception):  # last use is a nicety, never the reply's end
                self.store().touch(list(doc_ids))
