"""markitdown against pypdf + mammoth + markdownify for attached documents: import, convert, output, size.

Each candidate runs in the environment that has it: ``pip install 'markitdown[pdf,docx]' fpdf2 python-docx``
in a scratch venv for ``markitdown``; Brisk's own venv plus ``pip install fpdf2`` for ``light`` (what
``engine.documents.convert`` uses).  Then, from the repository root, ``python -m
engine.bench.document_converters markitdown`` (or ``light``; ``encodings`` checks convert's non-UTF-8 rule
against charset-normalizer's first choice).  A one-off whose result the docs quote.
It writes the same files each time (a 3-page and a 200-page text PDF by fpdf2, a DOCX with headings,
lists and a table by python-docx, an HTML page with a script, a style, a list and a table), prints the
import time in a fresh process, each conversion's time (median of 3; 1 for markitdown's 200-page PDF),
whether the PDF's 200 page markers came out in order, the DOCX and HTML output, and the installed size
of what the candidate pulls in.  The result and the choice are in engine/documents/convert.py's docstring.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from engine.bench.common import markdown_table, median, run_python

NATO = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"
WORDS = NATO.split()
HTML = """<!doctype html><html><head><title>Page Title</title><style>body{color:red}</style>
<script>var secret = "SCRIPTTEXT";</script></head><body><nav><a href="/">Home</a></nav>
<h1>Main Heading</h1><p>First <b>bold</b> paragraph with a <a href="https://example.com">link</a>.</p>
<h2>Sub Heading</h2><ul><li>item one</li><li>item two</li></ul>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>foo</td><td>1</td></tr><tr><td>bar</td><td>2</td></tr></table>
<p>Last paragraph.</p><script>console.log("MORESCRIPT")</script></body></html>"""
SAMPLES = [  # (text, encodings it is written in) for ``encodings``
    (
        "Le café était très animé ce matin-là. Nous avons mangé des crêpes à la crème et bu du thé glacé.\n"
        "À côté, un garçon lisait « Les Misérables » près de la fenêtre; son père, déçu, regardait la pluie.\n",
        ["cp1252", "latin-1"],
    ),
    ("Café résumé naïve — “quoted” façade.\n", ["cp1252"]),
    (
        "Le café était très animé ce matin-là. Nous avons mangé des crêpes à la crème et bu du thé glacé. " * 10 + "\n",
        ["cp1252"],
    ),
    (
        "Grüße aus München! Die Bäume blühen, und wir essen Äpfel. Der Straßenverkehr ist heute ruhig.\n",
        ["cp1252", "latin-1"],
    ),
    (
        "El niño comió piña y jalapeños en la montaña. ¿Dónde está la estación? ¡Qué mañana tan bonita!\n",
        ["cp1252", "latin-1"],
    ),
    (
        "Zażółć gęślą jaźń. Wczoraj poszliśmy do sklepu, żeby kupić świeży chleb i mleko. Łódź jest piękna.\n",
        ["cp1250", "iso8859_2"],
    ),
    (
        "Zażółć gęślą jaźń. Wczoraj poszliśmy do sklepu, żeby kupić świeży chleb i mleko. Łódź jest piękna.\n" * 5,
        ["cp1250"],
    ),
    ("Příliš žluťoučký kůň úpěl ďábelské ódy. Dnes je krásný den a slunce svítí nad městem.\n", ["cp1250"]),
    (
        "Привет, как дела? Сегодня хорошая погода, и мы идём гулять в парк. Москва - столица России.\n",
        ["cp1251", "koi8_r"],
    ),
    ("Καλημέρα σας. Σήμερα ο καιρός είναι πολύ ωραίος και θα πάμε μια βόλτα στην παραλία.\n", ["cp1253", "iso8859_7"]),
    ("Bugün hava çok güzel. Şehirde yürüyüş yaptık ve ağaçların altında dinlendik. Işık çok parlaktı.\n", ["cp1254"]),
    ("今日はとても良い天気です。公園で散歩をしました。桜がきれいに咲いていました。\n", ["shift_jis", "euc_jp"]),
    ("今天天气很好。我们去公园散步，看到了很多美丽的花。\n", ["gb2312"]),
]
CANDIDATES = {
    "markitdown": ("from markitdown import MarkItDown; MarkItDown()", ["markitdown[pdf,docx]"]),
    "light": (
        "import pypdf, mammoth, bs4, markdownify, charset_normalizer",
        ["pypdf[crypto]", "mammoth", "beautifulsoup4", "markdownify", "charset-normalizer"],
    ),
}


def make_files(folder: Path) -> dict[str, Path]:
    import docx
    from fpdf import FPDF

    def pdf(pages: int, name: str) -> Path:
        out = FPDF()
        for page in range(1, pages + 1):
            out.add_page()
            out.set_font("Helvetica", "B", 16)
            out.cell(0, 10, f"Chapter {page}: Marker{page:04d}", new_x="LMARGIN", new_y="NEXT")
            out.set_font("Helvetica", size=11)
            for n in range(6):
                words = " ".join(WORDS[(page + n + k) % len(WORDS)] for k in range(40))
                out.multi_cell(0, 6, f"Paragraph {n} of page {page}. {words}", new_x="LMARGIN", new_y="NEXT")
        path = folder / name
        out.output(str(path))
        return path

    doc = docx.Document()
    doc.add_heading("Quarterly Report", level=1)
    doc.add_paragraph("Intro paragraph before the list.")
    doc.add_heading("Findings", level=2)
    for item in ("first bullet", "second bullet", "third bullet"):
        doc.add_paragraph(item, style="List Bullet")
    for item in ("step one", "step two"):
        doc.add_paragraph(item, style="List Number")
    doc.add_heading("Numbers", level=2)
    table = doc.add_table(rows=3, cols=3)
    for r, row in enumerate([("Region", "Sales", "Growth"), ("North", "120", "5%"), ("South", "98", "-2%")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    doc.add_paragraph("Closing paragraph after the table.")
    doc.save(str(folder / "report.docx"))
    (folder / "page.html").write_text(HTML, encoding="utf-8")
    return {
        "3-page PDF": pdf(3, "three.pdf"),
        "200-page PDF": pdf(200, "long.pdf"),
        "DOCX": folder / "report.docx",
        "HTML": folder / "page.html",
    }


def converters(which: str) -> Callable[[Path], str]:
    if which == "markitdown":
        from markitdown import MarkItDown

        engine = MarkItDown(enable_plugins=False)
        return lambda path: engine.convert(str(path)).text_content
    from engine.documents.convert import convert

    return lambda path: convert(path).text


def import_ms(statement: str) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    return median(float(run_python(code)) for _ in range(3)) * 1000


def installed_mb(requirements: list[str]) -> tuple[float, list[str]]:
    """Bytes on disk of the distributions ``requirements`` pull in (their whole closure), and their names."""
    from packaging.requirements import Requirement

    seen: dict[str, int] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = sum(f.size or 0 for f in dist.files or [])
        for child in (Requirement(r) for r in dist.requires or []):
            if child.marker is None or any(child.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(child)
    names = [f"{n} {size / 1e6:.1f}" for n, size in sorted(seen.items(), key=lambda item: -item[1])]
    return sum(seen.values()) / 1e6, names


def encodings() -> None:
    """charset-normalizer's first choice against ``engine.documents.convert``'s rule, on short and long samples."""
    from charset_normalizer import from_bytes

    from engine.documents.convert import _guess

    right = {"first choice": 0, "Brisk": 0}
    total = 0
    body: list[list[str]] = []
    for text, names in SAMPLES:
        for name in names:
            for repeat in (1, 50):
                data = (text * repeat).encode(name)
                first, ours = from_bytes(data).best(), _guess(data)
                total += 1
                right["first choice"] += first is not None and str(first) == text * repeat
                right["Brisk"] += ours is not None and str(ours) == text * repeat
                body.append([name, f"x{repeat}", str(first and first.encoding), str(ours and ours.encoding)])
    print(markdown_table(["encoding", "repeat", "first choice", "Brisk"], body))
    print(f"decoded right of {total}: {right}")


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "light"
    if which == "encodings":
        encodings()
        return
    statement, requirements = CANDIDATES[which]
    files = make_files(Path(tempfile.mkdtemp()))
    convert = converters(which)
    print(f"{which}: import in a fresh process {import_ms(statement):.0f} ms")
    body: list[list[str]] = []
    shown: list[str] = []
    for label, path in files.items():
        times, text = [], ""
        for _ in range(1 if which == "markitdown" and "200" in label else 3):
            start = time.perf_counter()
            try:
                text = convert(path)
            except Exception as exc:  # a failed conversion is a result of the comparison
                text = f"FAILED: {type(exc).__name__}: {exc}"
            times.append(time.perf_counter() - start)
        note = ""
        if "200" in label:
            where = [text.find(f"Marker{n:04d}") for n in range(1, 201)]
            note = f"all 200 page markers, in order: {min(where) >= 0 and where == sorted(where)}"
        elif label in ("DOCX", "HTML"):
            shown += [f"\n{label}:", *(f"| {line}" for line in text.strip().splitlines())]
        body.append([label, f"{median(times) * 1000:.0f}", f"{len(text):,}", note])
    print(markdown_table(["file", "ms (median)", "chars", ""], body))
    print("\n".join(shown))
    total, names = installed_mb(requirements)
    print(f"installed: {total:.1f} MB ({', '.join(names)})")


if __name__ == "__main__":
    main()
