"""How attached documents enter a prompt: one rendering, so the same files always give the same tokens.

A document small enough to fit goes whole into the system message, after the
user's own system prompt, so that everything that stays the same across a
chat's questions (and across chats that attach the same files) comes first and
its KV is a prefix the engine keeps (``engine.runtime.prompt_documents``).  The order
is the documents' names, then their content hashes, never the order they were
attached in, so two chats that attach the same files in another order share the
prefix; the text is the converted text as it is (no dates, no paths: a path
that differs between two machines or two copies must not change the tokens).

Passages retrieved from larger documents change with each question, so they go
into the question's own turn, numbered in document order (name, then place in
the document), ahead of the question: two questions that retrieve the same
passages share the longest prefix, and the numbers are the ones a reply's
sources list.

Under a reply, what it was given is named by :func:`sources_line`: "Sources:"
for the documents and passages its text can be tied to (``"tied"``, set after
the reply by ``engine.documents.grounding``), "Given:" when it can be tied to
none of them (a wrong answer, or a story about something else, was given the
handbook but does not draw on it); in a list with both, each untied one reads
"(given)".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SOURCES_PREFIX = "Sources:"
GIVEN_PREFIX = "Given:"
GIVEN_MARK = " (given)"
SEP = " \u00b7 "
WHOLE_INTRO = "The user attached these documents. Answer questions about them from their text."
PASSAGES_INTRO = "Passages from the attached documents, numbered; cite them by number, like [1]:"


@dataclass(frozen=True)
class Whole:
    """A document that goes into the prompt whole."""

    doc_id: str
    name: str
    text: str
    path: str = ""


@dataclass(frozen=True)
class Passage:
    """A retrieved piece of a larger document: ``text`` is ``document[start:end]``, the ``chunk``-th piece."""

    doc_id: str
    name: str
    chunk: int
    start: int
    end: int
    text: str
    path: str = ""
    page: int | None = None  # a PDF's page (from 1) where the passage begins, None for a text without pages
    last_page: int | None = None


def where(chunk: int, page: int | None, last_page: int | None) -> str:
    """How a passage is named after its document: ``page 12``, ``pages 12-13``, or ``part 3`` without pages."""
    if page is None:
        return f"part {chunk + 1}"
    return f"pages {page}-{last_page}" if last_page is not None and last_page > page else f"page {page}"


def place_of(source: Any) -> str:
    """:func:`where` for a reply's source as :func:`sources` lists it (a mapping, as saved with the reply)."""
    chunk, page, last = source.get("chunk"), source.get("page"), source.get("last_page")
    chunk = chunk if isinstance(chunk, int) else 0
    page = page if isinstance(page, int) and page > 0 else None
    return where(chunk, page, last if isinstance(last, int) else None)


def is_passage(source: Any) -> bool:
    """Whether a reply's source (a mapping, as saved with the reply) is a passage, not a whole document."""
    chunk = source.get("chunk")
    return isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 0


def source_label(source: Any) -> str:
    """How a reply's source is named to a user, in the window and by ``brisk ask``: ``handbook.md`` for a
    whole document, ``[1] notes.md, part 3`` or ``[2] report.pdf, page 12`` (``pages 12-13``) for a passage
    (its number, left out when it has none, then its document and :func:`place_of`); ``document`` when the
    name is missing."""
    name = str(source.get("name") or "document")
    if not is_passage(source):
        return name
    label = str(source.get("label") or "")
    number = f"{label} " if label and label != name else ""
    return f"{number}{name}, {place_of(source)}"


def is_tied(source: Any) -> bool:
    """Whether a reply's text was tied to this source; a source stored without the mark counts as one."""
    return source.get("tied", True) is not False


def sources_prefix(sources: Sequence[Any]) -> str:
    """``Sources:`` when the reply can be tied to any of ``sources``, else ``Given:``."""
    return SOURCES_PREFIX if any(is_tied(s) for s in sources) else GIVEN_PREFIX


def source_labels(sources: Sequence[Any]) -> list[str]:
    """Each source's :func:`source_label`; under a ``Sources:`` prefix an untied one adds `` (given)``."""
    mixed = sources_prefix(sources) == SOURCES_PREFIX
    return [source_label(s) + (GIVEN_MARK if mixed and not is_tied(s) else "") for s in sources]


def sources_line(sources: Sequence[Any]) -> str:
    """``Sources: handbook.md · [1] notes.md, part 3`` or ``Given: handbook.pdf``; empty for no sources."""
    return f"{sources_prefix(sources)} {SEP.join(source_labels(sources))}" if sources else ""


def source_word(source: Any) -> str:
    """``Source`` or ``Given``: how one source is introduced on its own (a menu entry)."""
    return "Source" if is_tied(source) else "Given"


def whole_order(docs: Sequence[Whole]) -> list[Whole]:
    """The stable order of whole documents: name (case folded), then content hash; one copy of each."""
    unique = {doc.doc_id: doc for doc in docs}
    return sorted(unique.values(), key=lambda d: (d.name.casefold(), d.name, d.doc_id))


def passage_order(passages: Sequence[Passage]) -> list[Passage]:
    """The stable order of passages: their document's name and hash, then their place in it."""
    unique = {(p.doc_id, p.chunk): p for p in passages}
    return sorted(unique.values(), key=lambda p: (p.name.casefold(), p.name, p.doc_id, p.start, p.chunk))


def whole_block(docs: Sequence[Whole]) -> str:
    """The documents as the system message carries them (empty when there are none)."""
    ordered = whole_order(docs)
    if not ordered:
        return ""
    parts = [WHOLE_INTRO]
    for doc in ordered:
        parts.append(f'<document name="{_attr(doc.name)}">\n{doc.text.strip()}\n</document>')
    return "\n\n".join(parts)


def passages_block(passages: Sequence[Passage]) -> str:
    """The passages as the question's turn carries them, numbered from 1 in :func:`passage_order`."""
    ordered = passage_order(passages)
    if not ordered:
        return ""
    parts = [PASSAGES_INTRO]
    for number, passage in enumerate(ordered, 1):
        place = where(passage.chunk, passage.page, passage.last_page)
        parts.append(f"[{number}] {passage.name}, {place}:\n{passage.text.strip()}")
    return "\n\n".join(parts)


def with_documents(
    messages: Sequence[dict[str, Any]], whole: Sequence[Whole], passages: Sequence[Passage], into_user: bool = False
) -> list[dict[str, Any]]:
    """``messages`` with the whole documents after the system prompt (a system message is added when there
    is none; ``into_user``: at the start of the first user message instead, for a chat template with no
    system role) and the passages ahead of the last user message's text; the messages given are not changed."""
    out = [dict(m) for m in messages]
    block = whole_block(whole)
    first_user = next((m for m in out if m.get("role") == "user"), None)
    if block and into_user and first_user is not None:
        first_user["content"] = f"{block}\n\n{first_user.get('content', '')}"
    elif block:
        if out and out[0].get("role") == "system":
            own = str(out[0].get("content", "")).strip()
            out[0]["content"] = f"{own}\n\n{block}" if own else block
        else:
            out.insert(0, {"role": "system", "content": block})
    quoted = passages_block(passages)
    if quoted and out and out[-1].get("role") == "user":
        out[-1]["content"] = f"{quoted}\n\nQuestion: {out[-1].get('content', '')}"
    return out


def sources(whole: Sequence[Whole], passages: Sequence[Passage]) -> tuple[dict[str, Any], ...]:
    """What a reply drew on, as ``Metrics.sources`` lists it: the whole documents, then the numbered
    passages (``label`` is the number the prompt gave them)."""
    found: list[dict[str, Any]] = []
    for doc in whole_order(whole):
        found.append(_source(doc.doc_id, doc.name, doc.path, -1, 0, len(doc.text), doc.name))
    for number, p in enumerate(passage_order(passages), 1):
        source = _source(p.doc_id, p.name, p.path, p.chunk, p.start, p.end, f"[{number}]")
        if p.page is not None:
            source |= {"page": p.page, "last_page": p.last_page if p.last_page is not None else p.page}
        found.append(source)
    return tuple(found)


def source_texts(whole: Sequence[Whole], passages: Sequence[Passage]) -> tuple[str, ...]:
    """The text of each of :func:`sources`, in its order (what a reply is tied to, ``engine.documents.grounding``)."""
    return tuple(doc.text for doc in whole_order(whole)) + tuple(p.text for p in passage_order(passages))


def _source(doc_id: str, name: str, path: str, chunk: int, start: int, end: int, label: str) -> dict[str, Any]:
    return {"doc_id": doc_id, "name": name, "path": path, "chunk": chunk, "start": start, "end": end, "label": label}


def _attr(text: str) -> str:
    """A name as an attribute value: quotes and line breaks would break the tag."""
    return " ".join(text.replace('"', "'").split())
