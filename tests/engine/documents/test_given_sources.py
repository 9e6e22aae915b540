"""A reply names what it was given, and says "Sources" only for what its text can be tied to (issue 50).

The tie is a shared run of five words (``engine.documents.grounding``).  On the engine, the tiny random model's
reply draws on nothing, so its document is "given"; on the bundled model a quoting reply is tied and a story
about something else is not.  And the count a document's chip shows is the count the context meter shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.state.attachments import entry
from app.state.context import meter_text, usage
from engine.api import Sampling
from engine.documents import grounding, render
from engine.runtime.prompt_documents import Documents
from tests.engine.runtime.test_prompt_documents import NOTE, FakeIndex, ask, engine_on
from tests.support.engine_runner import EngineRunner, done

PASSAGE = (
    "The lighthouse on Skerry Point was built in 1873 and first lit in the spring of 1874. Its keeper, "
    "Mairi Gunn, kept the log for thirty-one years."
)
STORY = (
    "Once upon a time a small fox lived at the edge of the forest. Every morning it ran down to the river "
    "to watch the boats, and one day it decided to build a boat of its own."
)


def test_a_quote_is_tied_to_its_passage() -> None:
    reply = "The text says the lighthouse on Skerry Point was built in 1873, and Mairi Gunn kept the log."
    assert grounding.shared_run(reply, PASSAGE) == ("the", "lighthouse", "on", "skerry", "point")
    assert grounding.tied("THE LIGHTHOUSE, on Skerry-Point, was BUILT in 1873!", PASSAGE)  # case and punctuation


@pytest.mark.parametrize(
    "reply",
    [
        STORY,  # about something else
        "It was one of the first lights on that coast, and it is one of the oldest.",  # common words only
        "A lighthouse was constructed at Skerry Point in 1873.",  # a paraphrase: given, not shown as a source
        "",
    ],
)
def test_a_reply_that_shares_no_run_of_five_words_is_not_tied(reply: str) -> None:
    assert not grounding.tied(reply, PASSAGE)


def _sources(reply: str) -> tuple[dict, ...]:
    whole = [render.Whole("h1", "handbook.pdf", "Coffee is free on Fridays and the office opens at nine.")]
    passages = [render.Passage("n1", "history.md", 2, 100, 300, PASSAGE)]
    sources, texts = render.sources(whole, passages), render.source_texts(whole, passages)
    return grounding.mark(sources, texts, reply)


def test_the_line_under_a_reply_says_given_unless_its_text_is_tied() -> None:
    assert render.sources_line(_sources(STORY)) == "Given: handbook.pdf \u00b7 [1] history.md, part 3"
    quoting = "Its keeper, Mairi Gunn, kept the log for thirty-one years."
    assert render.sources_line(_sources(quoting)) == "Sources: handbook.pdf (given) \u00b7 [1] history.md, part 3"
    assert [render.source_word(s) for s in _sources(quoting)] == ["Given", "Source"]
    stored_before = [{"name": "handbook.pdf", "chunk": -1}]  # a reply saved before the mark: as it always read
    assert render.sources_line(stored_before) == "Sources: handbook.pdf"


def test_a_reply_that_draws_on_nothing_is_labelled_given(tiny_dir: Path, brisk_data_dir: Path) -> None:
    with engine_on(tiny_dir, FakeIndex()) as runner:
        doc = runner.index.add("handbook.pdf", NOTE)  # type: ignore[attr-defined]
        _, reply = ask(runner, "What colour are the badges?", (doc,))
    assert reply.text and not grounding.tied(reply.text, NOTE)  # random weights: no run of the note's words
    assert [s.get("tied") for s in reply.metrics.sources] == [False]
    assert render.sources_line(reply.metrics.sources) == "Given: handbook.pdf"


def test_the_chip_and_the_context_meter_count_the_same_tokens(tiny_dir: Path, brisk_data_dir: Path) -> None:
    with engine_on(tiny_dir, FakeIndex()) as runner:
        doc = runner.index.add("handbook.pdf", NOTE)  # type: ignore[attr-defined]
        (chip,) = runner.engine.count_tokens([NOTE])  # what the window's chip says (DocumentsController.count)
        _, reply = ask(runner, "What colour are the badges?", (doc,))
    assert reply.metrics.document_tokens == chip
    docs = [entry(doc, "handbook.pdf", "/docs/handbook.pdf", len(NOTE), chip)]
    parts = usage([reply.metrics.to_dict()], docs)
    assert parts.whole == chip and parts.chat == reply.metrics.prompt_tokens + reply.metrics.completion_tokens - chip
    assert meter_text(parts, 512).endswith(f"(documents {chip:,})")


@pytest.fixture
def bundled_with_documents(bundled_engine: EngineRunner):  # noqa: ANN201
    index = FakeIndex()
    before = bundled_engine.engine.documents
    bundled_engine.engine.documents = Documents(lambda: index)
    bundled_engine.index = index  # type: ignore[attr-defined]
    yield bundled_engine
    bundled_engine.engine.documents = before


def test_on_the_bundled_model_a_quote_is_a_source_and_a_story_is_given(bundled_with_documents: EngineRunner) -> None:
    runner = bundled_with_documents
    doc = runner.index.add("history.md", PASSAGE)  # type: ignore[attr-defined]

    def reply(question: str):  # noqa: ANN202
        messages = [{"role": "user", "content": question}]
        events = runner.run(messages, sampling=Sampling(max_tokens=48), answer_cache=False, documents=(doc,))
        return done(events)

    quote = reply("Copy the first sentence of the document word for word.")
    assert render.sources_line(quote.metrics.sources) == "Sources: history.md", quote.text
    story = reply("Write a short story about a fox who builds a boat.")
    assert render.sources_line(story.metrics.sources) == "Given: history.md", story.text
