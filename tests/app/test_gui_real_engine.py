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
        model=str(tiny_dir), device="cpu", dtype="float32", quant="none", max_tokens=48, prefix_cache=False
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
