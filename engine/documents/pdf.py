"""A PDF's text, page by page, within bounds (``engine.documents.convert`` calls :func:`pdf_text`).

pypdf reads the file; ``progress(done, total)`` is called once per page (``(0, n)`` first) and
``cancel()`` is checked between pages, so both work on a 2,000-page file.  Bounds, since a 2 MB file can
hold 40 pages that each draw a 50 MB string (pypdf parses about 2 MB of drawing instructions a second):

* a page whose decoded drawing instructions (its content streams and the forms it names) pass
  :data:`~engine.documents.reading.PAGE_BYTES` is left out before pypdf parses them, with a note; a Flate
  stream is inflated only that far to learn it, and nothing decoded is kept on the reader;
* reading stops once :data:`~engine.documents.reading.MAX_CHARS` characters are taken, with a note.

Pages without a text layer, or that fail, are named in a note; a PDF with no text at all is refused (a
scan: OCR is not done here), as is one whose every page is too heavy, each in one sentence.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from io import BytesIO
from typing import Any

from engine.documents.reading import MAX_CHARS, PAGE_BYTES, DocumentError, check, damaged, mb, newlines, were


def pdf_text(
    data: bytes, name: str, progress: Callable[[int, int], None] | None, cancel: Callable[[], bool] | None
) -> tuple[str, tuple[int, ...], list[str]]:
    """The PDF's text page by page, where each page begins, and notes on pages without text."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(
                f"{name} is protected by a password; save a copy without the password (or print it to a new PDF)"
                " and attach that."
            )
        pages = reader.pages
        total = len(pages)
    except DocumentError:
        raise
    except Exception as exc:  # a damaged file can fail in any part of the parser
        raise damaged(name, "PDF", exc) from exc
    if total == 0:
        raise DocumentError(f"{name} has no pages; it may be damaged, so open it in a PDF viewer and save a new copy.")
    texts: list[str] = []
    blank: list[int] = []
    failed: list[int] = []
    heavy: list[int] = []  # drawing instructions over PAGE_BYTES: left out before pypdf parses them
    first: Exception | None = None
    taken = 0
    if progress is not None:
        progress(0, total)
    for number in range(1, total + 1):
        check(cancel, name)
        try:
            page = pages[number - 1]
            if _page_bytes(page) > PAGE_BYTES:
                heavy.append(number)
                text = ""
            else:
                text = newlines(page.extract_text() or "").strip()
                if not text:
                    blank.append(number)
        except Exception as exc:  # one broken page leaves the others readable; it is named in a note
            first = first or exc
            failed.append(number)
            text = ""
        texts.append(text)
        taken += len(text) + 2
        if progress is not None:
            progress(number, total)
        if taken > MAX_CHARS:
            break
    read = len(texts)
    if len(failed) == read and first is not None:
        raise damaged(name, "PDF", first) from first
    if heavy and len(blank) + len(failed) + len(heavy) == read:
        raise DocumentError(
            f"Every page of {name} holds more than {mb(PAGE_BYTES)} of drawing instructions, so no text was read;"
            " save it again from a PDF viewer (or print it to a new PDF) and attach that."
        )
    if len(blank) + len(failed) == read:
        raise DocumentError(
            f"{name} has no text layer (it looks like a scanned PDF); Brisk cannot read text from images, so run it"
            " through OCR first and attach the result."
        )
    notes = []
    if blank:
        has, them = ("has", "it") if len(blank) == 1 else ("have", "them")
        notes.append(f"{_pages(blank)} of {name} {has} no text layer (scanned?), so no text was read from {them}.")
    if failed:
        notes.append(f"{_pages(failed)} of {name} could not be read and {were(failed)} left out.")
    if heavy:
        hold = "holds" if len(heavy) == 1 else "hold"
        notes.append(
            f"{_pages(heavy)} of {name} {hold} more than {mb(PAGE_BYTES)} of drawing instructions and"
            f" {were(heavy)} left out."
        )
    starts, at = [], 0
    for text in texts:
        starts.append(at)
        at += len(text) + 2
    if taken > MAX_CHARS:
        notes.append(
            f"Only the first {MAX_CHARS:,} characters of {name} were taken (pages 1-{read} of {total});"
            " the rest was left out."
        )
        return "\n\n".join(texts)[:MAX_CHARS], tuple(starts), notes
    return "\n\n".join(texts) + "\n", tuple(starts), notes


def _page_bytes(page: Any) -> int:
    """The decoded size of a PDF page's drawing instructions: its content streams and the forms its resources
    name (each once), counted without keeping the decoded bytes, and only until past :data:`PAGE_BYTES`."""
    from pypdf.generic import ArrayObject, DictionaryObject, StreamObject

    total, seen = 0, set()
    todo: list[tuple[Any, bool]] = [(page.get("/Resources"), False), (page.get("/Contents"), True)]
    while todo and total <= PAGE_BYTES:
        item, drawn = todo.pop()
        obj = item.get_object() if item is not None else None
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, ArrayObject):  # contents in several streams
            todo.extend((part, drawn) for part in obj)
        elif drawn and isinstance(obj, StreamObject):  # a content stream or a form, and the form's resources
            total += _decoded_size(obj)
            todo.append((obj.get("/Resources"), False))
        elif isinstance(obj, DictionaryObject):  # resources: the forms they name
            xobjects = obj.get("/XObject")
            xobjects = xobjects.get_object() if xobjects is not None else None
            if isinstance(xobjects, DictionaryObject):
                for ref in xobjects.values():
                    form = ref.get_object()
                    if isinstance(form, StreamObject) and form.get("/Subtype") == "/Form":
                        todo.append((form, True))
    return total


def _decoded_size(stream: Any) -> int:
    """A PDF stream's decoded length, or any length past :data:`PAGE_BYTES` once it is known to pass them: a
    Flate stream is inflated only that far; another kind is decoded whole by pypdf (within its own limits) and
    not cached on the reader, as ``get_data()`` would (40 pages of 50 MB each would stay in memory)."""
    from pypdf.filters import decode_stream_data
    from pypdf.generic import EncodedStreamObject

    if not isinstance(stream, EncodedStreamObject) or getattr(stream, "decoded_self", None) is not None:
        return len(stream.get_data())
    raw = getattr(stream, "_data", None)
    if stream.get("/Filter") == "/FlateDecode" and stream.get("/DecodeParms") is None and isinstance(raw, bytes):
        inflate = zlib.decompressobj()
        with contextlib.suppress(zlib.error):  # damaged: pypdf's decoder below knows how to recover some
            size = len(inflate.decompress(raw, PAGE_BYTES + 1))
            if size > PAGE_BYTES or inflate.eof:
                return size
    return len(decode_stream_data(stream))


def _pages(numbers: list[int]) -> str:
    """'Page 3' or 'Pages 2-4, 7': runs of page numbers, as a person would write them."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"Page {text}" if len(numbers) == 1 else f"Pages {text}"
