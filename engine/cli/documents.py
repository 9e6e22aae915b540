"""``brisk documents``: the document index from the command line (what the window's Documents view shows).

``brisk documents`` lists every indexed document (``--json``: one object per
line: id, name, path, kind, size, characters, chunks, state, KV bytes on disk,
last use); ``brisk documents add PATH...`` attaches files and folders to the
index without asking anything (each file's line is printed as it is done,
each file that cannot be read is a message naming it; on stderr a progress
line at most every :data:`PROGRESS_S` seconds, ``[12 of 20,000] name``, and a
count at the end; exit 1 when none could be read); ``brisk documents remove ID...``
removes documents (an id may be shortened to its first characters, as long as
one document has them), with their KV files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from engine.cli.common import EXIT_REQUEST, fail

PROGRESS_S = 2.0  # at most one progress line this often (a folder of 20,000 files, a 2,000-page PDF)


def add_documents_parser(sub: Any) -> None:
    docs = sub.add_parser("documents", help="list, add or remove the documents chats can attach")
    docs.add_argument("--json", action="store_true", help="one JSON object per line")
    actions = docs.add_subparsers(dest="action")
    add = actions.add_parser("add", help="index files and folders (text, Markdown, code, HTML, PDF, DOCX)")
    add.add_argument("paths", nargs="+", metavar="PATH")
    add.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object per line")
    remove = actions.add_parser("remove", help="remove documents and their KV files by id (or its start)")
    remove.add_argument("ids", nargs="+", metavar="ID")
    remove.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object per line")
    docs.set_defaults(func=cmd_documents)


def cmd_documents(args: argparse.Namespace) -> int:
    from engine.client import document_library

    as_json = bool(getattr(args, "json", False))
    try:
        library = document_library()
        if args.action == "add":
            return _add(library, args.paths, as_json)
        if args.action == "remove":
            return _remove(library, args.ids, as_json)
        return _list(library, as_json)
    except Exception as exc:  # the index cannot be opened or written: say so, once
        return fail(f"The document index could not be used ({exc})", as_json, EXIT_REQUEST)


def _row(info: Any, kv: dict[str, int]) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.name,
        "path": info.path,
        "kind": info.kind,
        "size_bytes": info.size_bytes,
        "chars": info.chars,
        "chunks": info.chunks,
        "state": info.state,
        "searchable_by_meaning": info.embedded,
        "kv_bytes": kv.get(info.id, 0),
        "last_used": info.last_used,
    }


def _list(library: Any, as_json: bool) -> int:
    kv = library.kv_bytes_all()  # every KV file's header read once
    rows = [_row(info, kv) for info in library.list()]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("No documents yet: attach one with `brisk ask QUESTION --attach FILE` or `brisk documents add FILE`.")
        return 0
    for row in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["last_used"]))
        kv = f"{row['kv_bytes'] / 1e6:.1f} MB of KV" if row["kv_bytes"] else "no KV yet"
        print(f"{row['id'][:12]}  {row['name']}  {row['chars']:,} chars, {row['chunks']} parts, {row['state']}, {kv}")
        print(f"              {row['path']}  (last used {used})")
    return 0


def _add(library: Any, paths: list[str], as_json: bool) -> int:
    start = time.monotonic()
    shown = [0.0, 0]  # when the last progress line was printed; how many files there are

    def progress(done: int, total: int, name: str) -> None:
        shown[1] = total
        now = time.monotonic()
        if name and total > 1 and now - shown[0] >= PROGRESS_S:
            shown[0] = now
            print(f"[{done + 1:,} of {total:,}] {name}", file=sys.stderr, flush=True)

    good = bad = 0
    for r in library.each(paths, progress=progress):
        if as_json:
            print(json.dumps({"path": r.path, "id": r.doc_id, "name": r.name, "problem": r.problem or None}))
        elif r.ok:
            print(f"{r.doc_id[:12]}  {r.name}  {r.chars:,} chars")
        else:
            print(f"skipped: {r.problem}")
        sys.stdout.flush()
        good += r.ok
        bad += not r.ok
    if shown[1] > 1 and not as_json:
        print(
            f"Added {good:,} of {shown[1]:,} files in {time.monotonic() - start:.0f} s"
            f" ({bad:,} {'message' if bad == 1 else 'messages'} above).",
            file=sys.stderr,
        )
    return 0 if good else EXIT_REQUEST


def _remove(library: Any, ids: list[str], as_json: bool) -> int:
    known = [info.id for info in library.list()]
    status = 0
    for wanted in ids:
        matches = [doc_id for doc_id in known if doc_id.startswith(wanted.lower())] if wanted else []
        if len(matches) != 1:
            why = "no document has that id" if not matches else f"{len(matches)} documents start with it; give more"
            status = fail(f"Cannot remove {wanted!r}: {why}", as_json, EXIT_REQUEST)
            continue
        library.remove(matches[0])
        if as_json:
            print(json.dumps({"removed": matches[0]}))
        else:
            print(f"removed {matches[0][:12]}")
    return status
