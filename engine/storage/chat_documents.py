"""The documents attached to a chat, as the history file keeps them: a JSON list, read defensively.

A chat's ``documents`` column holds one object per attached document, in the
order they were attached: ``{"id", "name", "path", "chars", "tokens"}``.  The
id is the document index's content hash (``engine.api.Request.documents``);
the rest is what the window shows before the index is opened (the chip's name
and size, the context meter's count).  ``tokens`` is the loaded model's count
when one was known, else null.  :func:`checked` reads the column as a user or
an older file may have left it: text that is not JSON, a value that is not a
list, or an entry without an id reads as nothing attached (never an error),
and the same id twice is kept once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

FIELDS = ("id", "name", "path", "chars", "tokens")


def checked(raw: object) -> list[dict[str, Any]]:
    """The well-formed entries of ``raw`` (the column's JSON text, or a list already read), one per id."""
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    if not isinstance(raw, list):
        return []
    kept: dict[str, dict[str, Any]] = {}
    for entry in raw:
        doc = entry_of(entry)
        if doc is not None and doc["id"] not in kept:
            kept[doc["id"]] = doc
    return list(kept.values())


def entry_of(entry: object) -> dict[str, Any] | None:
    """One entry with its fields of the right types (None when it has no id)."""
    if not isinstance(entry, Mapping):
        return None
    doc_id = entry.get("id")
    if not isinstance(doc_id, str) or not doc_id:
        return None
    name, path = entry.get("name"), entry.get("path")
    return {
        "id": doc_id,
        "name": name if isinstance(name, str) and name else doc_id[:12],
        "path": path if isinstance(path, str) else "",
        "chars": _count(entry.get("chars")) or 0,
        "tokens": _count(entry.get("tokens")),
    }


def to_json(docs: Iterable[Mapping[str, Any]]) -> str:
    """The column's text for ``docs`` (checked first: what could not be read back is not written)."""
    return json.dumps(checked(list(docs)), ensure_ascii=False)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
