"""What every reader of a stranger's document shares: its errors, its caps, and the words of its sentences.

``engine.documents.convert`` (text, HTML, DOCX), ``pdf`` and ``docx_zip`` import these from here, so none of the
three imports another's internals (they did, in a cycle).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MAX_CHARS = 16_000_000  # text taken from one file (about 4 M tokens, far past any model's context); the rest is left
PAGE_BYTES = 4 << 20  # a PDF page's drawing instructions, decoded; pypdf parses 5 MB of them in about 2.5 s


class DocumentError(Exception):
    """A file that cannot be attached; ``str()`` is one clear sentence naming the file and what to do."""


class Cancelled(DocumentError):
    """``cancel()`` returned true; a subclass of :class:`DocumentError` so one handler covers both."""


def check(cancel: Callable[[], bool] | None, name: str, what: str = "Attaching") -> None:
    if cancel is not None and cancel():
        raise Cancelled(f"{what} {name} was cancelled.")


def damaged(name: str, what: str, exc: BaseException) -> DocumentError:
    detail = re.split(r"(?<=[.?!])\s", str(exc).strip())[0].rstrip(".?!") or type(exc).__name__  # its first sentence
    viewer = "a PDF viewer" if what == "PDF" else "Word"
    return DocumentError(
        f"{name} could not be read as a {what} file ({detail}); it may be damaged or incomplete, so open it in"
        f" {viewer}, save a new copy and attach that."
    )


def mb(size: int) -> str:
    """A size as people read it: "64 MB", "1.5 MB", "4 KB"."""
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def were(items: Any) -> str:
    return "was" if len(items) == 1 else "were"


def newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")
