"""Where Brisk keeps its files.

Everything lives under one data folder: ``$BRISK_DATA_DIR`` when set (tests and
scripts use it), otherwise the platform's user data folder.  Converted models
and KV snapshots go in ``cache/`` inside it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    override = os.environ.get("BRISK_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir("brisk", "brisk"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    path = data_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_path() -> Path:
    return data_dir() / "brisk.db"


def settings_path() -> Path:
    return data_dir() / "settings.json"


def private_name(path: Path) -> Path:
    """A sibling of ``path`` that no other process (or call) uses: ``NAME.tmp-<pid>-<token>``."""
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def atomic_write(path: Path, data: bytes | str, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half of it.

    Writes a private temporary file beside ``path`` (:func:`private_name`, so two processes
    writing at once never share one) and renames it over; on any failure (disk full,
    read-only folder) the temporary file is removed and the error raised.
    """
    tmp = private_name(path)
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding=encoding)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def weights_fingerprint(location: str) -> str:
    """Identifies the exact weights of a model: for a folder, its resolved path and the names,
    sizes and modification times of its ``.safetensors``, ``.bin`` and ``.json`` files (so a
    changed file changes it); anything else (a hub id) is its own fingerprint.

    The one weight fingerprint: the loader's model identity and the quantized copies'
    staleness check (``engine.quant.cache``) both use it.
    """
    folder = Path(location)
    if folder.parent == cache_dir() / "models" and _is_sha256(folder.name):
        # a GGUF converted by Brisk (engine.model.source.converted_dir): named by the GGUF's SHA-256, written
        # only from it, so that digest is its identity, known before the copy is on disk (it is written on a
        # thread while the first load goes on)
        return f"{folder.resolve()}|gguf-sha256:{folder.name}"
    if not folder.is_dir():
        return location
    files = sorted(p for p in folder.iterdir() if p.suffix in {".safetensors", ".bin", ".json"})
    return str(folder.resolve()) + "".join(f"|{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


def _is_sha256(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)
