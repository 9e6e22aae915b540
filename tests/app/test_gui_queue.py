"""A message sent while the chat's reply streams waits in the chat, greyed, and is sent when the reply ends."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.views.chat_model import QUEUED_ID, QUEUED_NOTICE
from engine.api import Done
from tests.support.gui_harness import FULL_REPLY, Harness, last_bubble, send_and_hold, stored, type_and_send


def test_a_message_sent_while_streaming_waits_and_goes_out_when_the_reply_ends(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = send_and_hold(qtbot, window, "First")
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    type_and_send(qtbot, window, "Second")
    assert len(engine.requests) == 1, "nothing goes out while the reply streams"
    queued = last_bubble(window)
    assert queued.message_id == QUEUED_ID and queued.plain_text == "Second"
    assert queued.notice.isVisible() and queued.notice.text() == QUEUED_NOTICE
    assert window.composer.text() == "" and window.composer.queued.isVisible()
    assert [m.role for m in stored(window, conversation_id)] == ["user", "assistant"], "queued: not stored yet"

    engine.hold_after = None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        engine.release()  # the first reply ends; the queued message goes out at once
    qtbot.waitUntil(lambda: len(engine.requests) == 2)
    second = engine.requests[1]
    assert [m["content"] for m in second.messages[-3:]] == ["First", FULL_REPLY, "Second"]
    qtbot.waitUntil(lambda: window.session.active is None and len(stored(window, conversation_id)) == 4)
    assert [m.content for m in stored(window, conversation_id)] == ["First", FULL_REPLY, "Second", FULL_REPLY]
    shown = [b.plain_text for b in window.chat_view.bubbles()]
    assert shown == ["First", FULL_REPLY, "Second", FULL_REPLY], "its reply appears in the chat"
    assert window.chat_view.bubble(QUEUED_ID) is None and not window.composer.queued.isVisible()


def test_a_queued_message_can_be_taken_back(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = send_and_hold(qtbot, window, "First")
    type_and_send(qtbot, window, "Never mind")
    type_and_send(qtbot, window, "And another")  # one waits already: this one stays in the box
    assert window.session.queued() == "Never mind" and window.composer.text() == "And another"
    window.composer.editor.clear()
    qtbot.mouseClick(window.composer.queued_cancel, Qt.MouseButton.LeftButton)
    assert window.session.queued() is None and window.chat_view.bubble(QUEUED_ID) is None
    assert window.composer.text() == "Never mind", "the text goes back into the box"
    engine.hold_after = None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        engine.release()
    qtbot.waitUntil(lambda: window.session.active is None)
    assert len(engine.requests) == 1, "nothing was sent after the reply"
