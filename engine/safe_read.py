"""Reading a file a user or a stranger named, without hanging on it or slurping it whole.

:func:`read_regular` reads at most ``limit`` bytes of a *regular* file and says
whether there was more.  Anything else (a named pipe, a character or block
device such as ``/dev/zero``, a socket, a folder) raises :class:`NotRegularFile`
before it is opened, so a FIFO with no writer cannot block the caller for ever
and a device cannot be read without end.  The check is made twice: ``stat``
(following symlinks, so a link to a FIFO is a FIFO) before opening, then
``fstat`` on the descriptor, opened with ``O_NONBLOCK`` so that opening a FIFO
swapped in between returns at once and is refused too.  The files tool and
every ``@FILE`` argument of the command line read through here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CHUNK = 1 << 16
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


class NotRegularFile(OSError):
    """The path names something that is not a regular file; ``kind`` says what it is."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a regular file; only regular files are read")
        self.path = str(path)
        self.kind = kind


def kind_of(mode: int) -> str | None:
    """What a ``st_mode`` names when it is not a regular file (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def read_regular(path: str | os.PathLike[str], limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``path``, and whether the file holds more.

    Raises :class:`NotRegularFile` for anything that is not a regular file (checked
    before and after opening), and ``OSError`` when it cannot be read.
    """
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    kind = kind_of(os.stat(path).st_mode)
    if kind is not None:
        raise NotRegularFile(path, kind)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        kind = kind_of(os.fstat(fd).st_mode)  # the file may have been swapped since the stat above
        if kind is not None:
            raise NotRegularFile(path, kind)
        parts: list[bytes] = []
        left = limit + 1  # one byte more tells whether there is more
        while left > 0:
            part = os.read(fd, min(CHUNK, left))
            if not part:
                break
            parts.append(part)
            left -= len(part)
    finally:
        os.close(fd)
    data = b"".join(parts)
    return data[:limit], len(data) > limit


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (symlinks followed) is a regular file now; False when it cannot be seen."""
    try:
        return kind_of(Path(path).stat().st_mode) is None
    except OSError:
        return False
