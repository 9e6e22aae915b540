"""Where the KV of attached documents is kept on disk, one file per prefix, and how a document's files go.

The engine (``engine.runtime.prompt_documents``) computes the KV of a prompt prefix
that holds whole documents once and saves it to a file of its own, named by a
hash of the prefix's tokens, with the documents' ids in the file's metadata.
This module only names those files and reads that metadata (the safetensors
header is a length and a JSON text: no torch needed), so that removing a
document from the library removes every KV file that holds it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

from engine.paths import cache_dir

DOCUMENTS = "docs:"  # prefix cache key of a prefix of whole documents (saved in a file of its own)
HEADER_LIMIT = 100 << 20  # a safetensors header longer than this is not one of ours


def document_key(prefix: list[int]) -> str:
    """The prefix cache key (and file name stem) of a prefix of whole documents."""
    return _document_key(tuple(prefix))


@functools.lru_cache(maxsize=64)
def _document_key(prefix: tuple[int, ...]) -> str:  # every Send and hint of a chat asks for its prefix's key
    return DOCUMENTS + hashlib.sha256(json.dumps(list(prefix)).encode()).hexdigest()[:24]


def document_kv_dir(identity: str) -> Path:
    """Where the KV of document prefixes of the model ``identity`` is kept, one file each."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir() / "kv" / f"documents-{digest}"


def document_kv_file(identity: str, key: str) -> Path:
    return document_kv_dir(identity) / f"{key.removeprefix(DOCUMENTS)}.safetensors"


def kv_files(doc_id: str | None = None) -> list[Path]:
    """Document KV files of every model (``doc_id``: only those holding that document)."""
    root = cache_dir() / "kv"
    found = sorted(root.glob("documents-*/*.safetensors")) if root.is_dir() else []
    return [path for path in found if doc_id is None or doc_id in file_documents(path)]


def file_documents(path: Path) -> tuple[str, ...]:
    """The document ids a KV file holds, read from its header (none when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > HEADER_LIMIT:
                return ()
            header = json.loads(fh.read(length))
        ids = json.loads(header.get("__metadata__", {}).get("documents", "[]"))
    except (OSError, ValueError, struct.error, AttributeError):
        return ()
    return tuple(str(i) for i in ids) if isinstance(ids, list) else ()


def forget_document(doc_id: str) -> int:
    """Delete every document KV file that holds ``doc_id``; return how many went."""
    gone = 0
    for path in kv_files(doc_id):
        try:
            path.unlink()
            gone += 1
        except FileNotFoundError:
            pass
    return gone
