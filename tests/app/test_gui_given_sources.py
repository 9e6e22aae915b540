"""Under a reply the window says "Given:" for documents its text cannot be tied to, "Sources:" otherwise (issue 50).

A real window on a real store; the scripted engine's reply carries the sources as the engine marks them
(``engine.documents.grounding``: ``"tied"``), and the line, its layout, its menu and a restart read them."""

from __future__ import annotations

from engine.api import Metrics
from tests.support.fake_engine import METRICS
from tests.support.gui_harness import chat, fake, last_bubble

HANDBOOK = {"doc_id": "h1", "name": "handbook.pdf", "path": "/docs/handbook.pdf", "chunk": -1, "start": 0,
            "end": 400, "label": "handbook.pdf"}  # fmt: skip
NOTES = {"doc_id": "n1", "name": "notes.txt", "path": "/docs/notes.txt", "chunk": 2, "start": 80, "end": 120,
         "label": "[1]"}  # fmt: skip


def reply_with(harness, qtbot, sources: tuple[dict, ...]):  # noqa: ANN001, ANN201
    window = harness.open(size=(1100, 740))
    fake(window).metrics = Metrics(**{**METRICS.to_dict(), "document_tokens": 129, "sources": sources})
    cid = chat(qtbot, window, "Tell me a story about a fox.")
    return window, cid, last_bubble(window)


def test_a_reply_tied_to_none_of_its_documents_says_given(harness, qtbot) -> None:  # noqa: ANN001
    window, cid, bubble = reply_with(harness, qtbot, ({**HANDBOOK, "tied": False},))
    assert bubble.sources.text() == "Given: handbook.pdf"
    menu = window.chat_view.context_menu(bubble.message_id)
    assert [a.text() for a in menu.actions() if a.text().startswith(("Source:", "Given:"))] == ["Given: handbook.pdf"]
    harness.close(window)  # as saved with the reply
    again = harness.open(size=(1100, 740))
    again.open_conversation(cid)
    assert last_bubble(again).sources.text() == "Given: handbook.pdf"


def test_a_reply_tied_to_one_passage_names_it_a_source_and_the_other_given(harness, qtbot) -> None:  # noqa: ANN001
    window, _, bubble = reply_with(harness, qtbot, ({**HANDBOOK, "tied": False}, {**NOTES, "tied": True}))
    assert bubble.sources.text() == "Sources: handbook.pdf (given) \u00b7 [1] notes.txt, part 3"
    rect = window.chat_view.source_rect(bubble.message_id, 1)  # each label still a target after the longer prefix
    assert not rect.isEmpty() and window.chat_view.viewport().rect().contains(rect.center())
    menu = window.chat_view.context_menu(bubble.message_id)
    assert [a.text() for a in menu.actions() if a.text().startswith(("Source:", "Given:"))] == [
        "Given: handbook.pdf",
        "Source: [1] notes.txt, part 3",
    ]
