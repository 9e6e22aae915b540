"""The one name a reply's source is shown by (``engine.documents.render.source_label``): what a user reads under
a reply in the window and on ``brisk ask``'s Sources line, for a whole file, a part of a text and a PDF's page."""

from __future__ import annotations

import pytest

from engine.api import Done, Metrics
from engine.cli.common import print_event
from engine.documents import render


def _sources() -> tuple[dict, ...]:
    whole = [render.Whole("h1", "handbook.md", "All of the handbook.")]
    passages = [
        render.Passage("n1", "notes.md", 2, 100, 200, "part three"),
        render.Passage("r1", "report.pdf", 11, 5000, 5400, "page twelve", page=12, last_page=12),
        render.Passage("r1", "report.pdf", 12, 5400, 5900, "pages twelve to thirteen", page=12, last_page=13),
    ]
    return render.sources(whole, passages)


def test_a_file_a_part_and_a_page_are_named_as_a_user_reads_them() -> None:
    labels = [render.source_label(s) for s in _sources()]
    assert labels == [
        "handbook.md",
        "[1] notes.md, part 3",
        "[2] report.pdf, page 12",
        "[3] report.pdf, pages 12-13",
    ]


@pytest.mark.parametrize(
    ("source", "label"),
    [
        ({"name": "", "chunk": -1}, "document"),  # a name lost from stored metrics
        ({"name": "a.txt", "chunk": 0}, "a.txt, part 1"),  # a passage without its number
        ({"name": "a.txt", "chunk": True, "label": "[1]"}, "a.txt"),  # a bool is not a chunk number
        ({"name": "a.txt", "chunk": "3", "label": "[1]"}, "a.txt"),  # nor is a string
    ],
)
def test_damaged_or_partial_sources_still_get_a_name(source: dict, label: str) -> None:
    assert render.source_label(source) == label


def test_brisk_ask_prints_the_same_labels(capsys: pytest.CaptureFixture[str]) -> None:
    sources = _sources()
    print_event(Done("r", 0.0, text="ok", metrics=Metrics(sources=sources)), as_json=False)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Sources: "))
    assert line == "Sources: " + " · ".join(render.source_label(s) for s in sources)
    assert "[2] report.pdf, page 12" in line
