"""The window on the real engine with the tiny test model: the events' real shapes.

One scenario, end to end: a first session answers a question; a second session
(a fresh engine) answers it again from the answer cache (same text, "From
cache" badge); with the answer cache switched off, asking again with "Earlier
answers" drafts the old answer, the drafted tokens are coloured, and the line
under the reply reports what was drafted and accepted.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.views.markdown_render import DRAFT_COLOUR
from app.window.main_window import MainWindow
from engine.api import Done, Loaded, LoadFailed
from engine.client import local_backend
from engine.storage import Settings, Store

QUESTION = "What do lighthouse keepers write in the log?"


def open_window(qtbot: QtBot, db: Path, settings: Settings) -> MainWindow:
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(Store(db), bridge, settings)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=120_000):
        window.load_model()
    assert window.model_ready, window.status_area.message_label.text()
    return window


def ask(qtbot: QtBot, window: MainWindow, text: str) -> None:
    window.new_chat()
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000):
        window.composer.editor.setPlainText(text)
        qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.session.active is None)


def close(window: MainWindow) -> None:
    window.close()
    window.bridge.shutdown()
    window.store.close()


def test_an_earlier_answer_is_served_from_the_cache_or_drafted_and_coloured(
    qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path
) -> None:
    db = brisk_data_dir / "brisk.db"
    # quant pinned: "auto" measures again after a noisy probe (a busy CI machine) and may pick another mode,
    # whose answers are not the first one's
    settings = Settings(
        model=str(tiny_dir),
        device="cpu",
        dtype="float32",
        quant="none",
        max_tokens=48,
        prefix_cache=False,
        colour_draft_tokens=True,  # off by default; this test checks the colour
    )
    first = open_window(qtbot, db, Settings(**{**settings.__dict__, "speculative": "off"}))
    ask(qtbot, first, QUESTION)
    answer = first.chat_view.bubbles()[-1].plain_text
    assert answer
    close(first)

    # a fresh engine: the same question is answered from the answer cache, at once, with the same text
    second = open_window(qtbot, db, Settings(**{**settings.__dict__, "speculative": "answers"}))
    ask(qtbot, second, QUESTION)
    bubble = second.chat_view.bubbles()[-1]
    assert bubble.plain_text == answer
    assert bubble.badge.text().startswith("From cache, exact")
    assert second.store.messages(second.session.conversation_id or "")[-1].metrics["answer_cache"] == "exact"

    # the cache switched off: the model writes the reply, drafting the earlier answer, and the drafts are coloured
    second.apply_settings(dataclasses.replace(second.settings, answer_cache=False))
    ask(qtbot, second, QUESTION)
    bubble = second.chat_view.bubbles()[-1]
    assert bubble.plain_text == answer  # greedy: drafting never changes the text
    assert not bubble.badge.text()
    stats = bubble.stats.text()
    found = re.search(r"accepted (\d+) of (\d+) drafted \((\d+) %\)", stats)
    assert found is not None, stats
    accepted, drafted, percent = map(int, found.groups())
    assert drafted > 0 and accepted == drafted and percent == 100
    assert "reused 0 of " in stats
    assert DRAFT_COLOUR in bubble.content.text()
    close(second)


def test_a_message_typed_edited_and_pasted_is_prefilled_and_answered_as_without(
    qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path
) -> None:
    """Prefill while typing (issue 26) on the real composer and engine: type, pause, edit in the middle, paste,
    send; the reply equals the one with the switch off, token for token, and the panel says what was reused."""
    settings = Settings(
        model=str(tiny_dir), device="cpu", dtype="float32", quant="none", max_tokens=24, answer_cache=False
    )
    message = "Tell me about the lighthouse keeper who wrote the weather in the log every evening."
    off = open_window(qtbot, brisk_data_dir / "off.db", dataclasses.replace(settings, prefill_while_typing=False))
    ask(qtbot, off, message)
    expected = off.session.messages()[-1].content
    assert off.typing.sent == 0  # the switch off: nothing was sent before Send
    close(off)

    window = open_window(qtbot, brisk_data_dir / "on.db", settings)
    window.new_chat()
    editor = window.composer.editor
    qtbot.keyClicks(editor, "Tell me about the keeper who wrote")
    qtbot.waitUntil(lambda: window.typing.sent >= 1, timeout=5_000)  # the pause after typing sends the draft
    cursor = editor.textCursor()
    cursor.setPosition(len("Tell me about the "))
    editor.setTextCursor(cursor)
    qtbot.keyClicks(editor, "lighthouse ")  # an edit in the middle
    cursor.movePosition(cursor.MoveOperation.End)
    editor.setTextCursor(cursor)
    editor.insertPlainText(" the weather in the log every evening.")  # a paste: sent at once
    assert editor.toPlainText() == message
    prefilled = window.composer.prefilled
    # the user takes a breath: the whole stable part is ready ("N tokens ready", no longer "n of N")
    qtbot.waitUntil(
        lambda: prefilled.isVisible() and re.fullmatch(r"[\d,]+ tokens ready", prefilled.text()) is not None,
        timeout=10_000,
    )
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000) as done:
        qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.session.active is None)
    assert window.session.messages()[-1].content == expected
    metrics = done.args[0].metrics
    assert metrics.typed_tokens > 0
    numbers = window.latency.panel.numbers
    qtbot.waitUntil(lambda: numbers.text("typed").startswith(f"{metrics.typed_tokens:,} of "), timeout=5_000)
    assert not window.composer.prefilled.isVisible()  # the composer is empty again
    close(window)
