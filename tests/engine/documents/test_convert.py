"""engine.documents.convert: every kind of file in, its text out in order; every bad file a clear DocumentError.

PDFs are written by hand (:func:`make_pdf`: Helvetica text streams, a page of only a grey box for a scan),
so a 2,000-page file takes milliseconds to make; DOCX files by python-docx (a dev dependency).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path

import pytest

from engine.documents import convert as convert_module
from engine.documents.convert import Cancelled, Converted, DocumentError, convert, supported, walk

FRENCH = (
    "Le café était très animé ce matin-là. Nous avons mangé des crêpes à la crème et bu du thé glacé.\n"
    "À côté, un garçon lisait « Les Misérables » près de la fenêtre; son père, déçu, regardait la pluie.\n"
)
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489") + bytes(64)


def make_pdf(pages: Sequence[Sequence[str] | None]) -> bytes:
    """A PDF whose pages hold ``pages``' lines in Helvetica; a None page draws only a grey box (no text layer)."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        if lines is None:
            stream = b"0.5 g 72 72 468 648 re f"
        else:
            escaped = (line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in lines)
            stream = "\n".join(["BT /F1 12 Tf 72 720 Td 14 TL", *(f"({line}) Tj T*" for line in escaped), "ET"]).encode(
                "latin-1"
            )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
            b" /Contents %d 0 R >>" % len(objects)
        )
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", newline="")
    else:
        path.write_bytes(data)
    return path


def refused(path: Path | str, *words: str, **kwargs: object) -> str:
    """The message :func:`convert` refuses ``path`` with, checked to be one sentence naming the file."""
    with pytest.raises(DocumentError) as caught:
        convert(path, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert Path(path).name in message
    assert "\n" not in message and message.endswith(".")
    for word in words:
        assert word in message, (word, message)
    return message


def in_order(text: str, *parts: str) -> None:
    positions = [text.find(part) for part in parts]
    assert all(p >= 0 for p in positions), [part for part, p in zip(parts, positions, strict=True) if p < 0]
    assert positions == sorted(positions), text


# -- text, Markdown, code --------------------------------------------------------------------------------------


def test_utf8_text_keeps_its_words_and_gets_unix_newlines(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.txt", "first line\r\nsecond — line\rthird\n")
    done = convert(path)
    assert isinstance(done, Converted)
    assert (done.kind, done.text, done.encoding) == ("text", "first line\nsecond — line\nthird\n", "utf-8")
    assert done.path == str(path.resolve()) and done.name == "notes.txt"
    assert done.size_bytes == path.stat().st_size and done.mtime == path.stat().st_mtime
    assert done.notes == () and done.pages is None


def test_markdown_and_code_are_kept_as_they_are(tmp_path: Path) -> None:
    source = "def f(x):\n\treturn x  \n\n\n# end\n"
    assert convert(write(tmp_path / "a.py", source)).text == source
    assert convert(write(tmp_path / "a.py", source)).kind == "code"
    markdown = convert(write(tmp_path / "README.md", "# Title\n\n* one\n"))
    assert (markdown.kind, markdown.text) == ("markdown", "# Title\n\n* one\n")
    assert convert(write(tmp_path / "Makefile", "all:\n\techo hi\n")).kind == "code"


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [("cp1252", "cp1252"), ("latin-1", "cp1252"), ("utf-16", "utf-16"), ("utf-8-sig", "utf-8-sig")],
)
def test_non_utf8_text_is_decoded_correctly(tmp_path: Path, encoding: str, expected: str) -> None:
    done = convert(write(tmp_path / "lettre.txt", FRENCH.encode(encoding)))
    assert done.text == FRENCH
    assert done.encoding == expected
    if expected == "cp1252":  # a guess: the user hears which, and what to do if it is wrong
        assert any("cp1252" in note and "UTF-8" in note for note in done.notes)
    else:
        assert done.notes == ()


def test_a_long_cp1252_file_is_read_as_cp1252(tmp_path: Path) -> None:
    """charset-normalizer's own first choice here is a Central European code page ("cafť")."""
    text = "Le café était très animé ce matin-là. Nous avons mangé des crêpes à la crème et bu du thé glacé. " * 400
    done = convert(write(tmp_path / "long.txt", text.encode("cp1252")))
    assert (done.encoding, done.text) == ("cp1252", text)


def test_a_file_without_extension_is_sniffed(tmp_path: Path) -> None:
    text = write(tmp_path / "notes", "plain words\n")
    image = write(tmp_path / "picture", PNG)
    assert supported(text) and not supported(image)
    assert convert(text).kind == "text"
    refused(image, "binary", "PDF")
    assert supported(tmp_path / "x.pdf") and supported(tmp_path / "y.DOCX") and not supported(tmp_path / "z.png")


# -- HTML and DOCX -------------------------------------------------------------------------------------------------


def test_html_becomes_markdown_without_scripts_or_styles(tmp_path: Path) -> None:
    page = (
        "<!doctype html><html><head><title>Tab title</title><style>body{color:red}</style>"
        "<script>var secret = 'SCRIPTTEXT';</script></head><body>"
        "<h1>Main Heading</h1><p>First <b>bold</b> paragraph with snake_case.</p><img src='x.png' alt='a chart'>"
        "<h2>Sub Heading</h2><ul><li>item one</li><li>item two</li></ul>"
        "<table><tr><th>Name</th><th>Value</th></tr><tr><td>foo</td><td>1</td></tr></table>"
        "<p>Last paragraph.</p><script>console.log('MORESCRIPT')</script></body></html>"
    )
    done = convert(write(tmp_path / "page.html", page))
    assert done.kind == "html" and done.encoding == "utf-8"
    for gone in ("SCRIPTTEXT", "MORESCRIPT", "color:red", "Tab title", "x.png"):
        assert gone not in done.text
    in_order(
        done.text,
        "# Main Heading",
        "First **bold** paragraph with snake_case.",
        "[image: a chart]",
        "## Sub Heading",
        "- item one",
        "- item two",
        "| Name | Value |",
        "| foo | 1 |",
        "Last paragraph.",
    )
    assert any("1 image was left out" in note for note in done.notes)


def test_docx_keeps_headings_lists_and_tables_in_order(tmp_path: Path) -> None:
    docx = pytest.importorskip("docx")
    doc = docx.Document()
    doc.add_heading("Quarterly Report", level=1)
    doc.add_paragraph("Intro paragraph before the list.")
    doc.add_heading("Findings", level=2)
    for item in ("first bullet", "second bullet"):
        doc.add_paragraph(item, style="List Bullet")
    for item in ("step one", "step two"):
        doc.add_paragraph(item, style="List Number")
    table = doc.add_table(rows=3, cols=3)
    for r, row in enumerate([("Region", "Sales", "Growth"), ("North", "120", "5%"), ("South", "98", "-2%")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    doc.add_paragraph("Closing paragraph after the table.")
    path = tmp_path / "report.docx"
    doc.save(str(path))
    done = convert(path)
    assert done.kind == "docx" and done.encoding is None
    in_order(
        done.text,
        "# Quarterly Report",
        "Intro paragraph before the list.",
        "## Findings",
        "- first bullet",
        "- second bullet",
        "1. step one",
        "2. step two",
        "| Region | Sales | Growth |",
        "| North | 120 | 5% |",
        "| South | 98 | -2% |",
        "Closing paragraph after the table.",
    )


def test_a_docx_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    refused(write(tmp_path / "fake.docx", b"this is not a zip archive at all"), "not a valid DOCX", ".doc")


def test_a_zip_without_a_document_is_refused_as_damaged(tmp_path: Path) -> None:
    import zipfile

    buffer = BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("hello.txt", "not word")
    message = refused(write(tmp_path / "empty.docx", buffer.getvalue()), "could not be read as a DOCX", "damaged")
    assert "?" not in message  # the reader's own message is cut to its first sentence


# -- PDF -------------------------------------------------------------------------------------------------------


def test_pdf_pages_come_out_in_order_with_progress(tmp_path: Path) -> None:
    pages = [["Chapter one", "Alpha (first) line"], ["Chapter two", "Bravo line"], ["Chapter three", "Charlie"]]
    calls: list[tuple[int, int]] = []
    done = convert(write(tmp_path / "three.pdf", make_pdf(pages)), progress=lambda d, t: calls.append((d, t)))
    assert (done.kind, done.pages, done.notes) == ("pdf", 3, ())
    in_order(done.text, "Chapter one", "Alpha (first) line", "Chapter two", "Bravo line", "Chapter three", "Charlie")
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    for start, lines in zip(done.page_starts, pages, strict=True):
        assert done.text[start:].startswith(lines[0])


def test_a_scanned_pdf_is_refused_and_scanned_pages_are_noted(tmp_path: Path) -> None:
    refused(write(tmp_path / "scan.pdf", make_pdf([None, None])), "no text layer", "OCR")
    done = convert(write(tmp_path / "mixed.pdf", make_pdf([["Cover words"], None, None, ["Back words"], None])))
    in_order(done.text, "Cover words", "Back words")
    assert done.notes == ("Pages 2-3, 5 of mixed.pdf have no text layer (scanned?), so no text was read from them.",)
    assert done.pages == 5
    one = convert(write(tmp_path / "one.pdf", make_pdf([["Words"], None])))
    assert one.notes == ("Page 2 of one.pdf has no text layer (scanned?), so no text was read from it.",)


def test_an_encrypted_pdf_is_refused_unless_it_opens_without_a_password(tmp_path: Path) -> None:
    from pypdf import PdfWriter

    def encrypted(user: str) -> bytes:
        writer = PdfWriter(clone_from=BytesIO(make_pdf([["Secret plans"]])))
        writer.encrypt(user_password=user, owner_password="owner", algorithm="AES-128")
        out = BytesIO()
        writer.write(out)
        return out.getvalue()

    refused(write(tmp_path / "locked.pdf", encrypted("secret")), "password")
    assert "Secret plans" in convert(write(tmp_path / "owner-only.pdf", encrypted(""))).text


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9])
def test_a_truncated_pdf_is_refused_as_damaged(tmp_path: Path, cut: float) -> None:
    data = make_pdf([["one"], ["two"], ["three"]])
    refused(write(tmp_path / "broken.pdf", data[: int(len(data) * cut)]), "could not be read as a PDF", "damaged")


def test_a_2000_page_pdf_reports_progress_and_can_be_cancelled(tmp_path: Path) -> None:
    path = write(tmp_path / "long.pdf", make_pdf([[f"Page {n} marker{n:04d}"] for n in range(1, 2001)]))
    calls: list[tuple[int, int]] = []
    done = convert(path, progress=lambda d, t: calls.append((d, t)))
    assert done.pages == 2000 and calls[0] == (0, 2000) and calls[-1] == (2000, 2000) and len(calls) == 2001
    in_order(done.text, "marker0001", "marker0002", "marker1000", "marker1999", "marker2000")

    seen: list[int] = []
    with pytest.raises(Cancelled) as caught:
        convert(path, progress=lambda d, t: seen.append(d), cancel=lambda: bool(seen) and seen[-1] >= 500)
    assert isinstance(caught.value, DocumentError)
    assert seen[-1] == 500 and "long.pdf" in str(caught.value) and "cancelled" in str(caught.value)


# -- files that cannot be attached ---------------------------------------------------------------------------------


def test_a_missing_file_a_folder_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    refused(tmp_path / "nowhere.txt", "does not exist")
    refused(tmp_path, "is a folder", "attach it as a folder")
    refused(write(tmp_path / "empty.txt", b""), "is empty")
    refused(write(tmp_path / "blank.md", "  \n\n\t"), "is empty")


def test_a_file_that_disappears_before_it_is_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "fleeting.txt", "here now")
    real = convert_module.read_regular

    def vanish(p: str | os.PathLike[str], limit: int) -> tuple[bytes, bool]:
        os.remove(p)
        return real(p, limit)

    monkeypatch.setattr(convert_module, "read_regular", vanish)
    refused(path, "does not exist")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_refused_without_blocking(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    refused(pipe, "named pipe", "regular file")


def test_binary_files_are_refused_whatever_their_name(tmp_path: Path) -> None:
    noise = random.Random(7).randbytes(4096)
    for name, data in (("photo.png", PNG), ("noise.bin", noise), ("noise.txt", noise), ("image.html", PNG)):
        refused(write(tmp_path / name, data), "looks like a binary file", "DOCX")
    refused(write(tmp_path / "old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(100)), "old Word .doc", ".docx")


def test_a_file_over_max_bytes_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "big.txt", "x" * 3000)
    refused(path, "over the", "limit", max_bytes=2048)
    assert convert(path, max_bytes=3000).text == "x" * 3000


def test_cancel_before_reading_raises_cancelled(tmp_path: Path) -> None:
    with pytest.raises(Cancelled, match="notes.txt"):
        convert(write(tmp_path / "notes.txt", "words"), cancel=lambda: True)


# -- walk ----------------------------------------------------------------------------------------------------------


def test_walk_lists_readable_files_in_name_order_and_says_what_it_left_out(tmp_path: Path) -> None:
    root = tmp_path / "project"
    for name in ("b.md", "A.txt", "src/main.py", "src/util/z.rs", "docs/guide.pdf", "Makefile", "notes"):
        write(root / name, "text\n")
    for name in (".hidden.md", ".git/config.txt", "node_modules/x/index.js", "src/__pycache__/m.py", "env/lib/a.py"):
        write(root / name, "skip me\n")
    write(root / "env/pyvenv.cfg", "home = /usr\n")
    write(root / "logo.png", PNG)
    write(root / "blob", PNG)
    write(root / "huge.txt", "y" * 5000)
    write(root / "empty.md", b"")
    os.symlink(root / "src", root / "loop")  # a link to a folder is not followed

    found, messages = walk(root, max_bytes=4096)
    assert [p.relative_to(root).as_posix() for p in found] == [
        "A.txt",
        "b.md",
        "docs/guide.pdf",
        "Makefile",
        "notes",
        "src/main.py",
        "src/util/z.rs",
    ]
    assert all(p.is_absolute() for p in found)
    assert messages == [
        "1 file over 4 KB was left out of project: huge.txt.",
        "1 empty file was left out of project: empty.md.",
        "1 link was left out of project (links are followed only to files inside it): loop.",
        "2 files of kinds Brisk cannot read were left out of project (1 .png, 1 no extension).",
    ]


def test_walk_stops_at_its_limit_and_handles_many_files(tmp_path: Path) -> None:
    for n in range(10_000):
        (tmp_path / f"f{n:05d}.txt").write_bytes(b"x")
    found, messages = walk(tmp_path, limit=9_000)
    assert len(found) == 9_000 and found[0].name == "f00000.txt" and found[-1].name == "f08999.txt"
    assert messages == [f"{tmp_path.name} holds more than 9,000 files Brisk can read; only the first 9,000 were taken."]
    assert len(walk(tmp_path)[0]) == 10_000


def test_walk_refuses_a_missing_folder_and_can_be_cancelled(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="not a folder"):
        walk(tmp_path / "missing")
    write(tmp_path / "sub/a.txt", "a")
    with pytest.raises(Cancelled):
        walk(tmp_path, cancel=lambda: True)
