"""The composer hands its draft over while it is typed (issue 50): after a pause, and at least every
``DRAFT_MAX_WAIT_MS`` while keys keep coming, so a steady typist's draft is prefilled too.

The report: 300 words typed at 80 ms a key, with no pause as long as the old 150 ms debounce, were handed
over only once typing stopped, so 14 of 353 prompt tokens were ready at Send.  Here the real widget is typed
into at 60 ms a key (a key every 60 ms leaves the 150 ms pause timer no chance to fire)."""

from __future__ import annotations

import time

from pytestqt.qtbot import QtBot

from app.views.composer import DRAFT_MAX_WAIT_MS, DRAFT_PAUSE_MS, Composer

KEY_MS = 60


def type_steadily(qtbot: QtBot, composer: Composer, text: str) -> list[tuple[float, str]]:
    """Type ``text`` a key every ``KEY_MS``; return (seconds since the first key, draft) of each hand-over."""
    handed: list[tuple[float, str]] = []
    began = time.perf_counter()
    composer.draft_changed.connect(lambda draft: handed.append((time.perf_counter() - began, draft)))
    for char in text:
        qtbot.keyClicks(composer.editor, char)
        qtbot.wait(KEY_MS)
    return handed


def test_a_steady_typists_draft_is_handed_over_while_keys_keep_coming(qtbot: QtBot) -> None:
    composer = Composer()
    qtbot.addWidget(composer)
    text = "the harbour office opens at eight"  # 33 keys: about 2 s
    assert KEY_MS < DRAFT_PAUSE_MS < DRAFT_MAX_WAIT_MS
    handed = type_steadily(qtbot, composer, text)
    during = [draft for _at, draft in handed if draft != text]
    assert len(during) >= 3, f"handed over while typing: {during}"  # about 2 s of keys: every 300 ms
    assert len(handed) < len(text) // 2, "handed over a few times, not at every key"
    assert all(text.startswith(draft) for draft in during)
    assert [len(d) for d in during] == sorted(len(d) for d in during)  # in the order it was typed
    qtbot.waitUntil(lambda: bool(handed) and handed[-1][1] == text, timeout=5_000)  # the pause after the last key


def test_a_keystroke_copies_no_draft(qtbot: QtBot) -> None:
    """A keystroke does constant work whatever the draft's length: the draft is copied once a hand-over."""
    composer = Composer()
    qtbot.addWidget(composer)
    composer.editor.setPlainText("word " * 20_000)  # a paste: handed over at once
    copies = 0
    plain = composer.editor.toPlainText

    def counted() -> str:
        nonlocal copies
        copies += 1
        return plain()

    composer.editor.toPlainText = counted  # type: ignore[method-assign]
    handed = type_steadily(qtbot, composer, "abcdefghij")
    assert copies == len(handed) < 10


def test_the_typing_bench_hands_drafts_over_as_the_composer_does() -> None:
    from engine.bench import typing_prefill

    assert typing_prefill.PAUSE_S * 1000 == DRAFT_PAUSE_MS and typing_prefill.EVERY_S is not None
    assert typing_prefill.EVERY_S * 1000 == DRAFT_MAX_WAIT_MS
    from app.views.composer import PASTE_CHARS

    assert typing_prefill.PASTE_CHARS == PASTE_CHARS
