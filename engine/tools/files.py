"""The ``files`` tool: list, read and search text files, only inside the folders the user granted.

Every path, relative or absolute, is resolved to its real path (``..`` and
symlinks followed) and must lie inside the real path of a granted folder;
anything else is refused, whatever the path says.  A search walks without
following symlinked folders and checks each file's real path again.  Reads
are of text files (UTF-8, no NUL bytes) up to ``max_read_bytes``, through
:func:`engine.safe_read.read_regular`: a named pipe, a device or a socket in
a granted folder is refused before it is opened (never a thread blocked on
it), skipped by a search and listed with what it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.safe_read import NotRegularFile, kind_of, read_regular
from engine.tools.registry import Tool, ToolError

MAX_READ_BYTES = 200_000
MAX_SEARCH_FILE_BYTES = 2_000_000
MAX_MATCHES = 50
MAX_FILES_SCANNED = 5_000
MAX_LISTED = 200


class Folders:
    """The granted folders, each kept as its real path."""

    def __init__(self, granted: Iterable[str | os.PathLike[str]]) -> None:
        self.roots: list[Path] = []
        for folder in granted:
            real = Path(os.path.realpath(os.path.expanduser(folder)))
            if real.is_dir() and real not in self.roots:
                self.roots.append(real)

    def inside(self, real: Path) -> Path | None:
        """The granted folder that holds ``real`` (a real path), or ``None``."""
        for root in self.roots:
            if real == root or real.is_relative_to(root):
                return root
        return None

    def resolve(self, path: str) -> Path:
        """The real path ``path`` names inside a granted folder; raises :class:`ToolError` otherwise."""
        if not self.roots:
            raise ToolError("no folder is granted to the files tool; grant one in the tools panel (or --grant DIR)")
        if not isinstance(path, str) or "\x00" in path:
            raise ToolError("path must be text")
        raw = os.path.expanduser(path.strip()) if path.strip() else "."
        candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in self.roots]
        for candidate in candidates:
            real = Path(os.path.realpath(candidate))
            if self.inside(real) is not None and real.exists():
                return real
        for candidate in candidates:
            if self.inside(Path(os.path.realpath(candidate))) is None:
                raise ToolError(f"{path!r} is outside the granted folders; only {self.describe()} may be read")
        raise ToolError(f"{path!r} does not exist in the granted folders ({self.describe()})")

    def show(self, real: Path) -> str:
        """``real`` as the user sees it: the granted folder's name, then the path inside it."""
        root = self.inside(real)
        if root is None:
            return str(real)
        rel = real.relative_to(root)
        return root.name if rel == Path(".") else f"{root.name}/{rel.as_posix()}"

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.roots) or "none"


def read_text(folders: Folders, real: Path, max_bytes: int = MAX_READ_BYTES) -> str:
    try:
        data, more = read_regular(real, max_bytes)
    except NotRegularFile as exc:
        raise ToolError(
            f"{folders.show(real)} is {exc.kind}, not a regular file; only regular text files can be read"
        ) from None
    except OSError as exc:
        raise ToolError(f"{folders.show(real)} could not be read: {exc.strerror or exc}") from None
    if b"\x00" in data[:8192]:
        raise ToolError(f"{folders.show(real)} is not a text file")
    text = data.decode("utf-8", errors="replace")
    if more:
        text += f"\n[truncated: the file is larger than {max_bytes} bytes]"
    return text


def _walk(folders: Folders, top: Path) -> Iterator[Path]:
    scanned = 0
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            real = Path(os.path.realpath(os.path.join(dirpath, name)))
            if folders.inside(real) is None or not real.is_file():
                continue  # a symlink out of the granted folders, or a pipe, device or socket
            scanned += 1
            if scanned > MAX_FILES_SCANNED:
                return
            yield real


def search(folders: Folders, top: Path, text: str) -> str:
    if not text.strip():
        raise ToolError("search needs some text to look for")
    needle = text.lower()
    hits: list[str] = []
    for real in _walk(folders, top) if top.is_dir() else [top]:
        shown = folders.show(real)
        if needle in real.name.lower():
            hits.append(f"{shown}: (name matches)")
        try:
            if real.stat().st_size > MAX_SEARCH_FILE_BYTES:
                continue
            data, more = read_regular(real, MAX_SEARCH_FILE_BYTES)
        except OSError:  # a special file (a pipe, a device) or one that cannot be read: nothing to search
            continue
        if more:  # it grew since the stat
            continue
        if b"\x00" in data[:8192]:
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if needle in line.lower():
                hits.append(f"{shown}:{number}: {line.strip()[:200]}")
                if len(hits) >= MAX_MATCHES:
                    return "\n".join(hits) + f"\n[stopped at {MAX_MATCHES} matches]"
    return "\n".join(hits) if hits else f"no match for {text!r} in {folders.show(top)}"


def listing(folders: Folders, real: Path) -> str:
    lines = []
    for entry in sorted(real.iterdir(), key=lambda p: p.name)[:MAX_LISTED]:
        target = Path(os.path.realpath(entry))
        if folders.inside(target) is None:
            continue
        try:
            info = target.stat()
        except OSError:  # a broken link
            continue
        kind = kind_of(info.st_mode)
        if kind is None:
            lines.append(f"{entry.name} ({info.st_size} bytes)")
        else:
            lines.append(f"{entry.name}/" if kind == "a folder" else f"{entry.name} ({kind}, not readable)")
    return f"{folders.show(real)}:\n" + ("\n".join(lines) if lines else "(empty)")


def run_files(folders: Folders, arguments: dict[str, Any], max_read_bytes: int = MAX_READ_BYTES) -> str:
    """List a folder, read a file or (with ``search``) find text under a path."""
    if not arguments.get("path") and not arguments.get("search") and len(folders.roots) > 1:
        return "granted folders:\n" + "\n".join(f"{r.name}/ ({r})" for r in folders.roots)
    if arguments.get("search") and not arguments.get("path") and len(folders.roots) > 1:
        return "\n".join(search(folders, root, str(arguments["search"])) for root in folders.roots)
    real = folders.resolve(arguments.get("path") or "")
    if arguments.get("search"):
        return search(folders, real, str(arguments["search"]))
    if real.is_dir():
        return listing(folders, real)
    return read_text(folders, real, max_read_bytes)


def files_tool(granted: Iterable[str | os.PathLike[str]], timeout_s: float = 10.0) -> Tool:
    folders = Folders(granted)
    return Tool(
        name="files",
        description=(
            "Read, list and search text files in the folders the user granted. Give a path (relative to a "
            "granted folder) to read a file or list a folder; add 'search' to find text in the files under it."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "a file or folder inside a granted folder (default: all)"},
                "search": {"type": "string", "description": "text to find (case-insensitive)"},
            },
            "required": [],
        },
        fn=lambda arguments: run_files(folders, arguments),
        timeout_s=timeout_s,
    )
