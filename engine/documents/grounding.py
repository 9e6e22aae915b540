"""Whether a reply's text can be tied to a document or passage it was given: a shared run of words.

``tied(reply, text)`` is True when the reply and the text share a run of ``RUN``
(5) consecutive words, compared case-folded with punctuation dropped, of which
at least ``CONTENT`` (2) are not among a few very common words ("of the", "it
is one of the" tie nothing).  ``mark(sources, texts, reply)`` gives each of a
reply's sources (``render.sources``) ``"tied": True`` or ``False``; a source
without the key (a reply stored before it) is shown as before, as a source.

Why a shared run and not a share of overlapping words (ROUGE-1/2): a share counts
the words every English text has, so an unrelated story scores against any
handbook and the threshold would move with the lengths; a run of five words in
the same order is what quoting or close restating looks like, costs one set
lookup a reply word, and can be shown to a user as the words that tie the two.
It is strict on purpose: a reply that only paraphrases is labelled "given",
which is true (the passage was in its prompt), never "source", which it may not
be.  Text without spaces between words (Chinese, Japanese) has no runs and is
never tied.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

RUN = 5  # consecutive words shared
CONTENT = 2  # of them, at least this many not in COMMON
COMMON_WORDS = (
    "a an and are as at be but by for from had has have he her his i if in is it its of on or our she so that the "
    "their them there they this to was we were what which who will with you your not no do does did can could "
    "would should may might one all any some more most also than then these those about into over"
)
COMMON = frozenset(COMMON_WORDS.split())
WORD = re.compile(r"\w+(?:['’]\w+)*")


def words(text: str) -> list[str]:
    """The text's words, case-folded, without punctuation (``don't`` stays one word)."""
    return [w.casefold() for w in WORD.findall(text)]


def runs(text: str) -> Iterator[tuple[str, ...]]:
    """Each run of ``RUN`` consecutive words of ``text`` with at least ``CONTENT`` uncommon words."""
    found = words(text)
    for i in range(len(found) - RUN + 1):
        run = tuple(found[i : i + RUN])
        if sum(w not in COMMON for w in run) >= CONTENT:
            yield run


def shared_run(reply: str, text: str) -> tuple[str, ...] | None:
    """The first run of the reply's words that ``text`` has too (see the module's docstring), or None."""
    mine = set(runs(reply))
    if not mine:
        return None
    return next((run for run in runs(text) if run in mine), None)


def tied(reply: str, text: str) -> bool:
    return shared_run(reply, text) is not None


def mark(sources: Sequence[Mapping[str, Any]], texts: Sequence[str], reply: str) -> tuple[dict[str, Any], ...]:
    """``sources`` (one text each, in the same order) each with ``"tied"``: whether ``reply`` can be tied to it."""
    mine = set(runs(reply))
    return tuple(
        {**source, "tied": bool(mine) and any(run in mine for run in runs(text))}
        for source, text in zip(sources, texts, strict=True)
    )
