"""Turning a file the user attached into text: plain text, Markdown, code, HTML, PDF and DOCX.

:func:`convert` reads one regular file (through :func:`engine.safe_read.read_regular`,
so a FIFO or a device is refused, and never more than ``max_bytes``) and returns a
frozen :class:`Converted`: the text with ``\\n`` newlines, and what the user should
know about it in ``notes``.  Whatever cannot be attached raises :class:`DocumentError`,
whose ``str()`` is one sentence that names the file and says what to do;
:class:`Cancelled` is a subclass, so one ``except DocumentError`` handles both.
No file gives more than :data:`MAX_CHARS` characters (the rest is left out, with a note), and with
``inside`` a path that resolves outside that folder (a link inside an attached folder) is refused.
``progress(done, total)`` is called once per PDF page (``(0, n)`` first) and with
``(1, 1)`` when any other file is done; ``cancel()`` is checked before and after
reading and between PDF pages.  :func:`supported` says by name alone (a sniff of the
first 4 KiB for a file with no extension) whether a file is one ``convert`` takes;
:func:`walk` lists those under a folder, in name order, depth first.

* Text, Markdown and code are kept as they are.  Encoding: a BOM (UTF-8, UTF-16,
  UTF-32) wins, then strict UTF-8; a NUL byte means binary; anything else goes to
  charset-normalizer.  Of its guesses within 0.05 "chaos" of the best, cp1252 is
  taken when it is one (the commonest legacy encoding), else the most coherent:
  on cp1252 or latin-1 French its own first choice was iso8859_10 (``ç`` read as
  ``į``) or mac_latin2.  On 40 samples (11 languages, 16 encodings, short and
  long) this rule decoded 36 right, its first choice 27.  No match: binary.
  UTF-16 without a BOM (NUL in nearly every other byte, on one side only) is
  decoded as UTF-16 LE or BE when that gives text without control characters.
* HTML is parsed by BeautifulSoup (the stdlib parser), scripts, styles and the
  head dropped, and written as Markdown by markdownify (headings, lists, tables).
* PDF: pypdf, page by page, so progress and cancel work on a 2,000-page file
  (``engine.documents.pdf``); a page whose decoded drawing instructions pass
  :data:`PAGE_BYTES` is left out before pypdf parses them (a 2 MB file can hold
  40 pages of 50 MB each), and reading stops once :data:`MAX_CHARS` are taken;
  pages without a text layer are named in a note, and a PDF with none is refused
  (it is a scan: OCR is not done here).  ``page_starts`` gives where each page's
  text begins, for citing pages.
* DOCX: mammoth to HTML (its style map knows headings and lists), then the same
  Markdown writer as HTML; images are left out (their alt text kept), with a note.
  Mammoth reads a copy of the zip made by ``engine.documents.docx_zip``: its XML
  parts' sizes checked before inflating and counted while inflating.

Why these libraries: measured on the 2-core machine by ``python -m engine.bench.document_converters
markitdown`` and ``... light`` (each in an environment that has it; the bench makes the files: a
3-page and a 200-page text PDF, a DOCX with headings, lists and a table, an HTML page with a script,
a style, a list and a table).  Times are medians of 3; installed sizes are the wheels' RECORDs.

    ========================  ===============================  ==============================
    measured                  markitdown[pdf,docx] 0.1.9       pypdf + mammoth + markdownify
    ========================  ===============================  ==============================
    import, fresh process     371 ms                           185 ms (pypdf alone 91 ms)
    3-page PDF                210 ms                           7 ms
    200-page PDF              11,746 ms (pdfminer)             356 ms
    DOCX                      failed (see below)               199 ms: headings, lists, table
    HTML                      15 ms                            2 ms, the same Markdown
    installed, with its deps  242 MB; 166 MB new to Brisk:     3.6 MB; 2.7 MB new to Brisk
                              onnxruntime 76, magika 38,
                              pillow 20, lxml 12, pdfium 9,
                              pdfminer 8.5
    ========================  ===============================  ==============================

Both put all 200 page markers of the long PDF in order with the same words (pdfminer adds a blank
line between wrapped lines).  markitdown's DOCX path is mammoth too, after a pre-pass through
BeautifulSoup that, with bs4 4.15, dropped the XML namespaces, so mammoth found no body in python-docx's
file (the same namespace loss in styles.xml is microsoft/markitdown#2467).  Its HTML path is BeautifulSoup and
markdownify, as here.  So markitdown would add a 30x slower PDF reader without per-page progress or
cancel, and a 113 MB file-type model (magika on onnxruntime) that Brisk has no use for.  Also tried:
mammoth's own Markdown writer loses tables (each cell a paragraph) and escapes every "."; the stdlib
HTML-to-text of ``engine.tools.fetch`` keeps no headings and runs table cells together ("NameValue").
The libraries are imported on first use: :func:`walk` and :func:`supported` load none of them.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from engine.documents.reading import MAX_CHARS, PAGE_BYTES, Cancelled, DocumentError  # noqa: F401 (imported from here too)
from engine.documents.reading import check as _check
from engine.documents.reading import damaged as _damaged
from engine.documents.reading import mb as _mb
from engine.documents.reading import newlines as _newlines
from engine.documents.reading import were as _were
from engine.safe_read import NotRegularFile, kind_of, read_regular

MAX_BYTES = 64 << 20
SNIFF_BYTES = 4096

_TEXT = (".txt", ".text", ".log", ".csv", ".tsv")
_MARKDOWN = (".md", ".markdown", ".mdown", ".mkd", ".rst", ".adoc", ".asciidoc", ".org", ".tex")
# fmt: off
_CODE = (
    ".py", ".pyi", ".pyx", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".vue", ".svelte", ".c", ".h",
    ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".m", ".mm", ".cs", ".java", ".kt", ".kts", ".scala", ".groovy", ".gradle",
    ".go", ".rs", ".rb", ".php", ".pl", ".pm", ".lua", ".r", ".jl", ".swift", ".dart", ".hs", ".ml", ".mli", ".ex",
    ".exs", ".erl", ".clj", ".el", ".lisp", ".scm", ".sql", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".cmd",
    ".toml", ".yaml", ".yml", ".json", ".jsonl", ".xml", ".xsd", ".ini", ".cfg", ".conf", ".properties",
    ".css", ".scss", ".sass", ".less", ".graphql", ".proto", ".cmake", ".mk", ".tf", ".nix", ".zig", ".v", ".sv",
    ".vhd", ".asm", ".s", ".diff", ".patch", ".dockerfile",
)
# fmt: on
KINDS: dict[str, str] = {
    **dict.fromkeys(_TEXT, "text"),
    **dict.fromkeys(_MARKDOWN, "markdown"),
    **dict.fromkeys(_CODE, "code"),
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
# Files known by name alone (lowercase).
NAMES: dict[str, str] = {
    **dict.fromkeys(("makefile", "gnumakefile", "dockerfile", "containerfile", "jenkinsfile", "vagrantfile"), "code"),
    **dict.fromkeys(("gemfile", "rakefile", "procfile", "cmakelists.txt", "justfile"), "code"),
    **dict.fromkeys(("readme", "license", "licence", "copying", "authors", "changelog", "notice", "todo"), "text"),
}
# Folders never walked into (hidden ones are skipped too, and any folder holding a pyvenv.cfg or conda-meta).
SKIP_DIRS = frozenset({"node_modules", "__pycache__", "site-packages", "dist-packages", "bower_components", "venv"})
ATTACHABLE = "text, Markdown, code, HTML, PDF or DOCX files"
# What to say instead of "binary" for formats people often try.
HINTS: dict[str, str] = {
    ".doc": "is an old Word .doc file; save it as .docx or PDF in Word and attach that",
    ".rtf": "is an RTF file, which Brisk cannot read yet; save it as .docx or PDF and attach that",
    ".odt": "is an OpenDocument file, which Brisk cannot read yet; save it as .docx or PDF and attach that",
    ".xls": "is a spreadsheet, which Brisk cannot read yet; save it as CSV and attach that",
    ".xlsx": "is a spreadsheet, which Brisk cannot read yet; save it as CSV and attach that",
    ".ppt": "is a presentation, which Brisk cannot read yet; save it as PDF and attach that",
    ".pptx": "is a presentation, which Brisk cannot read yet; save it as PDF and attach that",
}
_DROP_TAGS = ("script", "style", "noscript", "template", "head", "svg", "canvas", "iframe", "object", "embed")
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16: its BOM starts with UTF-16 LE's
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


@dataclass(frozen=True)
class Converted:
    path: str  # absolute, resolved
    name: str  # file name for display
    kind: str  # "text" | "markdown" | "code" | "html" | "pdf" | "docx"
    text: str  # Markdown for HTML and DOCX; "\n" newlines
    size_bytes: int
    mtime: float
    encoding: str | None = None  # how a text, Markdown, code or HTML file was decoded
    pages: int | None = None  # PDF pages
    notes: tuple[str, ...] = ()  # what the user should know (pages without text, images left out, a guessed encoding)
    page_starts: tuple[int, ...] = ()  # PDF: where each page's text begins in ``text``


def kind_for(path: str | os.PathLike[str]) -> str | None:
    """The kind of file ``path`` names by its extension or well-known name, None when neither says."""
    name = os.path.basename(path).lower()
    suffix = os.path.splitext(name)[1]
    return KINDS.get(suffix) or NAMES.get(name)


def supported(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`convert` takes ``path``: by extension; a file without one by a sniff of its start."""
    if kind_for(path) is not None:
        return True
    if os.path.splitext(os.path.basename(path))[1]:
        return False
    try:
        head, _ = read_regular(path, SNIFF_BYTES)
    except OSError:
        return False
    return _sniff(head) is not None


def convert(
    path: str | os.PathLike[str],
    *,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    max_bytes: int = MAX_BYTES,
    inside: str | os.PathLike[str] | None = None,
) -> Converted:
    """The text of the file at ``path`` (see the module docstring); raises :class:`DocumentError`."""
    resolved = Path(os.path.expanduser(path)).resolve()
    name = resolved.name or str(resolved)
    if inside is not None and not within(resolved, inside):
        raise _outside(Path(path).name, Path(inside))
    info = _stat(resolved, name)
    if info.st_size > max_bytes:
        raise _too_big(name, info.st_size, max_bytes)
    _check(cancel, name)
    try:
        data, more = read_regular(resolved, max_bytes)
    except OSError as exc:  # NotRegularFile too: swapped for a FIFO since the stat
        raise _unreadable(resolved, name, exc) from exc
    if more:
        raise _too_big(name, max_bytes + 1, max_bytes)
    if not data or data.isspace():
        raise DocumentError(f"{name} is empty; there is no text in it to attach.")
    _check(cancel, name)
    kind = kind_for(resolved) or _sniff(data[:SNIFF_BYTES]) or "text"
    encoding: str | None = None
    pages: int | None = None
    starts: tuple[int, ...] = ()
    notes: list[str] = []
    try:
        if kind == "pdf":
            from engine.documents.pdf import pdf_text

            text, starts, notes = pdf_text(data, name, progress, cancel)
            pages = len(starts)
        elif kind == "docx":
            text = _docx(data, name, notes)
        else:
            text, encoding = _decode(data, name, resolved.suffix.lower(), notes)
            if kind == "html":
                _check(cancel, name)
                text = _markdown(text, notes)
    except RecursionError as exc:  # 100,000 nested tags: a parser or the Markdown writer recursed too deep
        raise DocumentError(
            f"{name} is nested too deeply to read (its tags or objects); it may be damaged, so save a new copy"
            " and attach that."
        ) from exc
    if not text.strip():
        raise DocumentError(f"{name} has no text in it to attach.")
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS]
        notes.append(f"Only the first {MAX_CHARS:,} characters of {name} were taken; the rest was left out.")
    if progress is not None and kind != "pdf":
        progress(1, 1)
    return Converted(
        path=str(resolved),
        name=name,
        kind=kind,
        text=text,
        size_bytes=info.st_size,
        mtime=info.st_mtime,
        encoding=encoding,
        pages=pages,
        notes=tuple(notes),
        page_starts=starts,
    )


def walk(
    folder: str | os.PathLike[str],
    *,
    limit: int = 20000,
    cancel: Callable[[], bool] | None = None,
    max_bytes: int = MAX_BYTES,
) -> tuple[list[Path], list[str]]:
    """The files under ``folder`` that :func:`convert` takes, and one message per kind of thing left out.

    Depth first, each folder's entries in case-insensitive name order, so the same tree gives the same list.
    Hidden files and folders, :data:`SKIP_DIRS`, virtual environments, links to folders (no loops) or to
    anything outside ``folder``, named pipes, devices and sockets, empty files and files over ``max_bytes`` are
    left out, each kind named in a message; at most ``limit`` files are returned.
    """
    root = Path(os.path.expanduser(folder)).resolve()
    label = root.name or str(root)
    if not root.is_dir():
        raise DocumentError(f"{root} is not a folder that can be read; check the path and try again.")
    found: list[Path] = []
    big: list[str] = []
    empty: list[str] = []
    unreadable: list[str] = []
    links: list[str] = []
    special: list[str] = []
    other: Counter[str] = Counter()
    stack = [iter(_entries(str(root), unreadable))]
    more = False
    while stack and not more:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIP_DIRS:
                _check(cancel, label, "Reading the folder")
                stack.append(iter(_entries(entry.path, unreadable)))
            continue
        try:
            if entry.is_symlink() and not within(Path(entry.path).resolve(), root):
                links.append(entry.name)  # /etc/passwd is not part of the folder because a link names it
                continue
            info = entry.stat()  # a link inside the folder is followed
            if stat.S_ISDIR(info.st_mode):  # a link to a folder: never walked (no loops)
                links.append(entry.name)
                continue
            if kind_of(info.st_mode) is not None:
                special.append(entry.name)
                continue
            if not (kind_for(entry.name) or supported(entry.path)):
                other[os.path.splitext(entry.name)[1].lower() or "no extension"] += 1
                continue
            size = info.st_size
        except OSError:
            unreadable.append(entry.name)
            continue
        if size > max_bytes:
            big.append(entry.name)
        elif size == 0:
            empty.append(entry.name)
        elif len(found) == limit:
            more = True
        else:
            found.append(Path(entry.path))
            if len(found) % 1000 == 0:
                _check(cancel, label, "Reading the folder")
    messages = []
    if more:
        messages.append(f"{label} holds more than {limit:,} files Brisk can read; only the first {limit:,} were taken.")
    if big:
        messages.append(f"{_n(big, 'file')} over {_mb(max_bytes)} {_were(big)} left out of {label}: {_some(big)}.")
    if empty:
        messages.append(f"{_n(empty, 'empty file')} {_were(empty)} left out of {label}: {_some(empty)}.")
    if unreadable:
        messages.append(f"Some files or folders in {label} could not be read and were left out: {_some(unreadable)}.")
    if links:
        messages.append(
            f"{_n(links, 'link')} {_were(links)} left out of {label} (links are followed only to files inside it):"
            f" {_some(links)}."
        )
    if special:
        messages.append(
            f"{_n(special, 'named pipe, device or socket', 'named pipes, devices or sockets')} {_were(special)} left"
            f" out of {label} (only regular files are read): {_some(special)}."
        )
    if other:
        common = sorted(other.items(), key=lambda item: (-item[1], item[0]))[:4]
        kinds = ", ".join(f"{n:,} {ext}" for ext, n in common)
        rest = " and others" if len(other) > 4 else ""
        total = sum(other.values())
        messages.append(f"{total:,} files of kinds Brisk cannot read were left out of {label} ({kinds}{rest}).")
    return found, messages


# -- reading -------------------------------------------------------------------------------------------------


def _stat(path: Path, name: str) -> os.stat_result:
    try:
        info = path.stat()
    except OSError as exc:
        raise _unreadable(path, name, exc) from exc
    if stat.S_ISDIR(info.st_mode):
        raise DocumentError(f"{name} is a folder, not a file; attach it as a folder to add the files inside it.")
    what = kind_of(info.st_mode)
    if what is not None:
        raise DocumentError(f"{name} is {what}, not a regular file; only regular files can be attached.")
    return info


def _unreadable(path: Path, name: str, exc: BaseException) -> DocumentError:
    if isinstance(exc, NotRegularFile):
        return DocumentError(f"{name} is {exc.kind}, not a regular file; only regular files can be attached.")
    if isinstance(exc, FileNotFoundError):
        return DocumentError(f"{path} does not exist (it may have been moved or deleted); check the path.")
    reason = getattr(exc, "strerror", None) or str(exc)
    return DocumentError(f"{name} could not be read ({reason}); check that you may open it and try again.")


def _too_big(name: str, size: int, limit: int) -> DocumentError:
    return DocumentError(f"{name} is {_mb(size)}, over the {_mb(limit)} limit for one file; attach a smaller part.")


def within(path: Path, folder: str | os.PathLike[str]) -> bool:
    """Whether the resolved ``path`` lies inside ``folder`` (resolved too)."""
    return path.is_relative_to(Path(folder).resolve())


def _outside(name: str, folder: Path) -> DocumentError:
    return DocumentError(
        f"{name} is a link to a file outside {folder.name or folder}; only files inside an attached folder are read."
    )


def _entries(path: str, unreadable: list[str]) -> list[os.DirEntry[str]]:
    """A folder's visible entries in name order; none for a virtual environment or a folder that cannot be read."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        unreadable.append(os.path.basename(path))
        return []
    names = {entry.name for entry in entries}
    if "pyvenv.cfg" in names or "conda-meta" in names:
        return []
    visible = [entry for entry in entries if not entry.name.startswith(".")]
    visible.sort(key=lambda entry: (entry.name.casefold(), entry.name))
    return visible


# -- text ----------------------------------------------------------------------------------------------------


def _sniff(head: bytes) -> str | None:
    """The kind ("pdf" or "text") of the first bytes of a file whose name does not say, None when it looks binary."""
    if head.startswith(b"%PDF-"):
        return "pdf"
    if any(head.startswith(bom) for bom, _ in _BOMS):
        return "text"
    if b"\0" in head:
        encoding = _utf16(head)
        if encoding is None:
            return None
        text = codecs.getincrementaldecoder(encoding)(errors="replace").decode(head)
        return "text" if _plain(text) else None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head)  # not final: a character cut at the end is fine
        return "text"
    except UnicodeDecodeError:
        pass
    return "text" if _guess(head) is not None else None


def _guess(data: bytes) -> Any:
    """charset-normalizer's match for non-UTF-8 bytes (see the module docstring for the ranking), or None."""
    from charset_normalizer import from_bytes

    results = from_bytes(data)
    best = results.best()
    if best is None:
        return None
    near = [match for match in results if match.chaos <= best.chaos + 0.05]
    western = [match for match in near if "cp1252" in (match.encoding, *match.could_be_from_charset)]
    return western[0] if western else max(near, key=lambda match: (match.coherence, -match.chaos))


def _decode(data: bytes, name: str, suffix: str, notes: list[str]) -> tuple[str, str]:
    """The text of ``data`` with "\\n" newlines and how it was decoded; binary data raises."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:  # strict: random bytes that happen to start with a BOM fail here (lone surrogates, NULs)
                text = data.decode(encoding)
            except UnicodeDecodeError:
                break
            if "\0" not in text:
                return _newlines(text.lstrip("\ufeff")), encoding
            break
    utf16 = _utf16(data[:SNIFF_BYTES])
    if utf16 is not None:
        try:
            text = data.decode(utf16)
        except UnicodeDecodeError:  # an odd length or a lone surrogate: not UTF-16 after all
            text = ""
        if text and _plain(text):
            return _newlines(text), utf16
    if data.lstrip().startswith(b"{\\rtf"):
        raise DocumentError(f"{name} {HINTS['.rtf']}.")
    if b"\0" not in data:
        try:
            return _newlines(data.decode("utf-8")), "utf-8"
        except UnicodeDecodeError:
            pass
        match = _guess(data)
        if match is not None:
            notes.append(
                f"{name} is not UTF-8; it was read as {match.encoding}. If letters look wrong, save it as UTF-8."
            )
            return _newlines(str(match)), str(match.encoding)
    hint = HINTS.get(suffix)
    if hint:
        raise DocumentError(f"{name} {hint}.")
    raise DocumentError(f"{name} looks like a binary file, not text; only {ATTACHABLE} can be attached.")


def _utf16(head: bytes) -> str | None:
    """The encoding ("utf-16-le" or "-be") when ``head`` looks like UTF-16 without a BOM: a NUL in at least 30% of the
    odd bytes (LE) or even bytes (BE) and in almost none of the others, as text in a Latin script has."""
    pairs = len(head) // 2
    if pairs < 2:
        return None
    even, odd = head[0 : 2 * pairs : 2].count(0), head[1 : 2 * pairs : 2].count(0)
    for zeros, others, encoding in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if zeros >= 0.3 * pairs and others <= 0.02 * pairs:
            return encoding
    return None


def _plain(text: str) -> bool:
    """Whether decoded ``text`` reads as text: no NUL, and control characters (other than tabs, newlines, form
    feeds and escapes) in under 1% of it."""
    if "\0" in text:
        return False
    sample = text[: SNIFF_BYTES * 16]
    controls = sum(1 for ch in sample if ch < " " and ch not in "\t\n\r\f\v\x1b")
    return controls <= len(sample) // 100


def _markdown(html: str, notes: list[str]) -> str:
    """Markdown of an HTML page or fragment: scripts, styles and the head dropped; images as their alt text."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(_DROP_TAGS):
        tag.decompose()
    images = soup.find_all("img")
    for image in images:
        alt = str(image.get("alt") or "").strip()
        image.replace_with(f"[image: {alt}]" if alt else "")
    if images:
        notes.append(f"{_n(images, 'image')} {_were(images)} left out; only the text is attached.")
    converter = MarkdownConverter(  # no escaping: the text is read by a model, and "snake\\_case" only costs tokens
        heading_style="ATX",
        bullets="-",
        table_infer_header=True,
        escape_asterisks=False,
        escape_underscores=False,
        escape_misc=False,
    )
    text = converter.convert_soup(soup)
    text = re.sub(r"[ \t]+\n", "\n", _newlines(text))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


# -- DOCX -------------------------------------------------------------------------------------------------


def _docx(data: bytes, name: str, notes: list[str]) -> str:
    """Markdown of a DOCX file: mammoth writes HTML from Word's styles, then :func:`_markdown`."""
    if not zipfile.is_zipfile(BytesIO(data)):
        raise DocumentError(
            f"{name} is not a valid DOCX file (it is not a zip archive); if it is an old .doc file, save it as .docx"
            " in Word and attach that."
        )
    import mammoth
    import mammoth.images

    from engine.documents.docx_zip import bounded_docx

    bounded = bounded_docx(data, name)
    try:  # the src is left empty: images are not read or embedded, only their alt text is kept
        no_src = mammoth.images.img_element(lambda _: {"src": ""})
        result = mammoth.convert_to_html(BytesIO(bounded), convert_image=no_src)
    except Exception as exc:  # a damaged or unusual file can fail in any part of the reader
        raise _damaged(name, "DOCX", exc) from exc
    return _markdown(result.value, notes)


# -- wording -------------------------------------------------------------------------------------------------


def _n(items: Any, noun: str, plural: str | None = None) -> str:
    return f"{len(items):,} {noun if len(items) == 1 else plural or noun + 's'}"


def _some(names: list[str], shown: int = 3) -> str:
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown:,} more" if len(names) > shown else "")
