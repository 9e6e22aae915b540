"""The words the window uses for attached documents and a reply's sources (no Qt).

A chat's attached documents are the history file's entries
(``engine.storage.chat_documents``: ``{id, name, path, chars, tokens}``).  Here:

* the chips above the composer: :func:`chip_text` ("report.pdf · 3,012 tokens",
  or "≈ 3,000 tokens" from the characters until the loaded model counted them),
  :func:`chip_tip`, and :func:`merged` (new entries after the old ones, one per id);
* which of them go into the prompt whole and which are searched for passages
  (:func:`searched_ids`, the engine's rule as the window can know it: see
  ``WHOLE_SHARE``), and the context meter's share of them, :func:`documents_tokens`;
* indexing: :func:`progress_text` and :func:`problems_text` (one line per problem,
  in the library's words: a file, or for a folder the files of one kind left out);
* a reply's sources (``Metrics.sources``, saved with the reply): :func:`sources_of`
  reads them back from stored metrics (``engine.documents.render.source_label``
  names one under the reply, as ``brisk ask`` does: "handbook.md", "[1] notes.md,
  part 3") and :func:`position_text` says where its passage lies in the document;
* the latency panel's line: :func:`reuse_text` ("3,012 tokens reused").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.documents.render import is_passage, place_of

SEP = " \u00b7 "
APPROX = "\u2248 "
CHARS_PER_TOKEN = 4  # the estimate a chip shows until a model counts the text
MAX_PROBLEMS = 6  # files named one by one in the banner; the rest are counted
GONE = "removed from the index"
SEARCHED = "searched"
# The engine (engine.runtime.prompt_documents) puts documents whole into the prompt, smallest first, while they fit this
# share of the prompt's budget (the context less the reply's room, at most half of it); the rest are searched for
# the passages each question needs.  The window mirrors that rule to say so on the chips and in the meter.
WHOLE_SHARE = 0.75


def entry(doc_id: str, name: str, path: str, chars: int, tokens: int | None = None) -> dict[str, Any]:
    """A chat's record of one attached document (``engine.storage.chat_documents``)."""
    return {"id": doc_id, "name": name, "path": path, "chars": chars, "tokens": tokens}


def estimated_tokens(chars: int) -> int:
    return -(-max(0, chars) // CHARS_PER_TOKEN)


def token_text(doc: Mapping[str, Any]) -> str:
    """``3,012 tokens`` (the model's count) or ``≈ 3,000 tokens`` (from the characters)."""
    tokens = doc.get("tokens")
    if isinstance(tokens, int):
        return f"{tokens:,} token" + ("" if tokens == 1 else "s")
    return f"{APPROX}{estimated_tokens(int(doc.get('chars') or 0)):,} tokens"


def chip_text(doc: Mapping[str, Any], gone: bool = False, searched: bool = False) -> str:
    if gone:
        return f"{doc.get('name', '')}{SEP}{GONE}"
    return f"{doc.get('name', '')}{SEP}{token_text(doc)}" + (f"{SEP}{SEARCHED}" if searched else "")


def chip_tip(doc: Mapping[str, Any], gone: bool = False, searched: bool = False) -> str:
    where = doc.get("path") or "(no path kept)"
    chars = int(doc.get("chars") or 0)
    lines = [str(where), f"{chars:,} characters of text{SEP}{token_text(doc)}"]
    if not isinstance(doc.get("tokens"), int):
        lines.append("The count is an estimate until a local model is loaded.")
    if searched:
        lines.append("Too long to go whole into the prompt: each question gets the passages that match it.")
    if gone:
        lines.append("It was removed from the document index: attach the file again to use it.")
    return "\n".join(lines)


def merged(docs: Sequence[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``docs`` then the entries of ``new`` whose id is not there yet; second item: how many were added."""
    out = [dict(d) for d in docs]
    seen = {d.get("id") for d in out}
    added = 0
    for doc in new:
        if doc.get("id") not in seen:
            out.append(dict(doc))
            seen.add(doc.get("id"))
            added += 1
    return out, added


def tokens_of(doc: Mapping[str, Any]) -> int:
    tokens = doc.get("tokens")
    return tokens if isinstance(tokens, int) else estimated_tokens(int(doc.get("chars") or 0))


def searched_ids(docs: Sequence[Mapping[str, Any]], context_length: int, max_tokens: int) -> set[str]:
    """The documents too long to go whole into a prompt of ``context_length`` tokens with ``max_tokens`` of
    room for the reply (none when the context length is not known)."""
    if context_length <= 0:
        return set()
    budget = int((context_length - min(max_tokens, context_length // 2)) * WHOLE_SHARE)
    used, searched = 0, set()
    for doc in sorted(docs, key=lambda d: (int(d.get("chars") or 0), str(d.get("id")))):
        tokens = tokens_of(doc)
        if used + tokens <= budget:
            used += tokens
        else:
            searched.add(str(doc.get("id")))
    return searched


def documents_tokens(docs: Iterable[Mapping[str, Any]], skip: Iterable[str] = ()) -> tuple[int, bool]:
    """(tokens of the documents a request sends whole, whether any count is an estimate); ``skip``: ids not
    sent whole (gone from the index, or searched for passages)."""
    gone = set(skip)
    total, estimated = 0, False
    for doc in docs:
        if doc.get("id") in gone:
            continue
        tokens = doc.get("tokens")
        if isinstance(tokens, int):
            total += tokens
        else:
            total += estimated_tokens(int(doc.get("chars") or 0))
            estimated = True
    return total, estimated


def progress_text(done: int, total: int, name: str) -> str:
    """``Reading report.pdf (12 of 40 pages)…``; with several files, which one of how many.  ``name`` is
    the library's: a file name, with ``(n of m)`` while a long file is read (a PDF's pages)."""
    if not name:
        return "Indexing\u2026" if total else "Looking for files\u2026"
    part = re.fullmatch(r"(.+) \((\d+) of (\d+)\)", name)
    if part is not None:
        file, of = part.group(1), int(part.group(3))
        unit = " pages" if file.lower().endswith(".pdf") else ""
        name = f"{file} ({int(part.group(2)):,} of {of:,}{unit})" if of > 1 else file
    if total > 1:
        return f"Reading {name}\u2026 (file {min(done + 1, total):,} of {total:,})"
    return f"Reading {name}\u2026"


def problems_text(problems: Sequence[str], attached: int) -> str:
    """The banner for files that could not be attached: each problem in the library's words, then what was
    attached.  The headline counts no files: one problem can be one file or, for a folder, thousands of them
    ("3 files of kinds Brisk cannot read were left out of src")."""
    shown = [p.strip() for p in problems[:MAX_PROBLEMS]]
    more = len(problems) - len(shown)
    lines = ["Some files could not be attached:", *(f"\u2022 {p}" for p in shown)]
    if more:
        lines.append(f"\u2022 and {more:,} more.")
    if attached:
        lines.append(f"The other {attached:,} {'was' if attached == 1 else 'were'} attached.")
    return "\n".join(lines)


# -- a reply's sources ------------------------------------------------------------------------------------


def sources_of(metrics: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The sources a reply's (stored or live) metrics name, each with a document id; others are skipped."""
    raw = (metrics or {}).get("sources")
    if not isinstance(raw, list | tuple):
        return []
    return [dict(s) for s in raw if isinstance(s, Mapping) and isinstance(s.get("doc_id"), str)]


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def position_text(source: Mapping[str, Any], total_chars: int | None = None) -> str:
    """Where the passage lies: ``characters 1,200–2,400 of 12,000`` (the whole text for a whole document)."""
    start, end = _int(source.get("start")), _int(source.get("end"))
    if not is_passage(source) or end <= start:
        return f"the whole text ({total_chars:,} characters)" if total_chars else "the whole text"
    of = f" of {total_chars:,}" if total_chars else ""
    page = f"{place_of(source)}, " if _int(source.get("page")) > 0 else ""  # a PDF's: "page 12, characters ..."
    return f"{page}characters {start:,}\u2013{end:,}{of}"


def passage_of(text: str, source: Mapping[str, Any]) -> str:
    """The cited part of a document's ``text`` (all of it for a whole document or a span it does not hold)."""
    start, end = _int(source.get("start")), _int(source.get("end"))
    if not is_passage(source) or not 0 <= start < end <= len(text):
        return text
    return text[start:end]


def reuse_text(tokens: float | None, reused: float | None) -> str:
    """The latency panel's documents line: ``3,012 tokens reused`` / ``computed`` / both; "" with none."""
    if not tokens:
        return ""
    tokens, reused = int(tokens), max(0, min(int(reused or 0), int(tokens)))
    if reused == tokens:
        return f"{tokens:,} tokens reused"
    if reused == 0:
        return f"{tokens:,} tokens computed"
    return f"{reused:,} reused{SEP}{tokens - reused:,} computed of {tokens:,} tokens"
