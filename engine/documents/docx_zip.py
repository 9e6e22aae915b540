"""A DOCX's zip read within bounds: sizes checked before anything is inflated, then inflated with a count.

:func:`bounded_docx` takes a .docx file's bytes and returns the bytes of a zip that mammoth reads instead:
the same parts, each XML part (what mammoth parses: ``*.xml`` and ``*.rels``) inflated here, and every other
part (images, fonts, embedded files: never read, since only an image's alt text is kept) left empty.

* Before inflating: at most :data:`MAX_PARTS` parts, and the XML parts' announced sizes together at most
  :data:`MAX_XML_BYTES`.  A 2.8 MB file whose ``document.xml`` unzips to 3 GB is refused here, at once.
* While inflating: each part is read in pieces of 1 MB and counted, so a part whose announced size lies
  stops at the same bound; an XML part that declares entities (Word never writes one) is refused, so no
  parser is asked to expand them.

Why 16 MB: mammoth parses about 0.15 MB of ``document.xml`` a second on the 2-core machine (a 2 MB part:
13 s; 20 MB: 143 s and 890 MB), so 16 MB is what the per-file deadline (``engine.documents.worker``) lets
it finish; a 500-page report's ``document.xml`` is a few MB.  Every refusal is a
:class:`~engine.documents.reading.DocumentError` whose ``str()`` is one sentence naming the file.
"""

from __future__ import annotations

import zipfile
from io import BytesIO

from engine.documents.reading import DocumentError
from engine.documents.reading import mb as _mb

MAX_PARTS = 10_000
MAX_XML_BYTES = 16 << 20
PIECE = 1 << 20
_ADVICE = "save it as PDF (or split it) in Word and attach that"


def bounded_docx(data: bytes, name: str) -> bytes:
    """A zip of ``data``'s parts within the bounds above (see the module docstring); raises DocumentError."""
    try:
        archive = zipfile.ZipFile(BytesIO(data))
        members = {m.filename: m for m in archive.infolist() if not m.is_dir()}  # a repeated name: the last, as zipfile
    except Exception as exc:  # a damaged central directory can fail in many ways
        raise DocumentError(
            f"{name} is not a valid DOCX file ({_first(exc)}); open it in Word, save a new copy and attach that."
        ) from exc
    if len(members) > MAX_PARTS:
        raise DocumentError(
            f"{name} holds {len(members):,} parts, more than the {MAX_PARTS:,} a Word file could need; it was"
            f" not read, so {_ADVICE}."
        )
    xml = [m for m in members.values() if _parsed(m.filename)]
    announced = sum(m.file_size for m in xml)
    if announced > MAX_XML_BYTES:
        raise _too_much(name, f"unzips to {_mb(announced)} of XML")
    out = BytesIO()
    left = MAX_XML_BYTES
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as repacked:
        for member in members.values():
            body = _inflate(archive, member, left, name) if _parsed(member.filename) else b""
            left -= len(body)
            repacked.writestr(member.filename, body)
    return out.getvalue()


def _parsed(filename: str) -> bool:
    return filename.lower().endswith((".xml", ".rels"))


def _inflate(archive: zipfile.ZipFile, member: zipfile.ZipInfo, left: int, name: str) -> bytes:
    """``member``'s bytes, read a piece at a time and refused once they pass ``left``."""
    pieces: list[bytes] = []
    total = 0
    try:
        with archive.open(member) as stream:
            while piece := stream.read(PIECE):
                total += len(piece)
                if total > left:
                    raise _too_much(name, f"unzips to more XML than it announced ({member.filename})")
                pieces.append(piece)
    except DocumentError:
        raise
    except Exception as exc:  # a bad CRC, a truncated stream, an unknown compression or a password
        raise DocumentError(
            f"{name} could not be unzipped ({member.filename}: {_first(exc)}); it may be damaged, so open it in"
            " Word, save a new copy and attach that."
        ) from exc
    body = b"".join(pieces)
    if b"<!ENTITY" in body:
        raise DocumentError(
            f"{name} declares XML entities in {member.filename}, which Word never writes; it was not read, so"
            f" {_ADVICE}."
        )
    return body


def _too_much(name: str, what: str) -> DocumentError:
    return DocumentError(
        f"{name} {what}, over the {_mb(MAX_XML_BYTES)} Brisk reads from one Word file; it was not read, so {_ADVICE}."
    )


def _first(exc: BaseException) -> str:
    return str(exc).strip().split("\n")[0].rstrip(".") or type(exc).__name__
