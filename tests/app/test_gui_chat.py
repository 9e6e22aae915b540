"""GUI: a turn streams, Enter sends, Esc and Stop end a reply; regenerate, edit and copy."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.views.composer import EMPTY_HINT
from engine.api import Done, Loaded
from engine.storage import Settings
from tests.support.gui_harness import (
    FULL_REPLY,
    FULL_STATS,
    Harness,
    chat,
    click_action,
    fake,
    last_bubble,
    send_and_hold,
    stored,
    type_and_send,
)

# -- streaming, Enter/Esc ------------------------------------------------------------------


def test_tokens_appear_before_done(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.hold_after = 2
    qtbot.keyClicks(window.composer.editor, "Hi there")
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(engine.held.is_set)
    reply = window.session.active
    assert reply is not None
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None
    qtbot.waitUntil(lambda: bubble.plain_text == "Hello there")
    qtbot.waitUntil(lambda: bubble.stats.text().startswith("TTFT "))
    assert "friend" not in bubble.content.text()
    assert window.composer.button.text() == "Stop"
    assert window.composer.editor.toPlainText() == ""
    [user, assistant] = stored(window, reply.conversation_id)
    assert (user.role, user.content) == ("user", "Hi there")
    assert assistant.status == "streaming"

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    assert bubble.plain_text == FULL_REPLY
    assert bubble.stats.text() == FULL_STATS
    assert window.composer.button.text() == "Send"
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == (FULL_REPLY, "done")
    assert assistant.metrics["cached_tokens"] == 1180
    request = engine.requests[0]
    assert request.messages == (
        {"role": "system", "content": Settings().system_prompt},
        {"role": "user", "content": "Hi there"},
    )
    assert request.conversation_id == reply.conversation_id
    assert request.prefix_cache is True


def test_enter_sends_shift_enter_adds_line_whitespace_is_not_sent(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    editor = window.composer.editor
    qtbot.keyClicks(editor, "line one")
    qtbot.keyClick(editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(editor, "line two")
    assert editor.toPlainText() == "line one\nline two"
    assert engine.requests == []

    saved = editor.toPlainText()
    editor.setPlainText("   \n\t  ")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    window.composer.button.click()
    assert engine.requests == []
    assert window.composer.hint.isVisible()
    assert window.composer.hint.text() == EMPTY_HINT
    assert editor.toPlainText() == "   \n\t  "  # nothing lost

    editor.setPlainText(saved)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(engine.requests) == 1)
    assert engine.requests[0].messages[-1] == {"role": "user", "content": "line one\nline two"}
    assert editor.toPlainText() == ""
    qtbot.waitUntil(lambda: window.session.active is None)


def test_typing_works_before_the_model_loads_but_send_waits(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open(load=False)
    button = window.composer.button
    assert not button.isEnabled()
    assert "loading" in button.toolTip().lower()
    qtbot.keyClicks(window.composer.editor, "early bird")
    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
    assert window.composer.editor.toPlainText() == "early bird"
    assert "loading" in window.composer.hint.text().lower()
    assert window.store.list_conversations() == []

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()
    assert button.isEnabled()
    assert window.status_area.model_label.text() == "fake-model"
    assert not window.status_area.progress.isVisible()
    chat(qtbot, window, window.composer.text())
    assert fake(window).requests[0].messages[-1]["content"] == "early bird"


def test_escape_stops_and_keeps_the_partial_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = send_and_hold(qtbot, window, "Tell me a story")
    reply = window.session.active
    assert reply is not None
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None
    qtbot.waitUntil(lambda: bubble.plain_text == "Hello there")

    qtbot.keyClick(window.composer.editor, Qt.Key.Key_Escape)
    assert window.session.active is None
    assert window.composer.button.text() == "Send"
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Hello there", "cancelled")
    assert bubble.plain_text == "Hello there"
    assert bubble.stats.text().endswith("stopped")
    qtbot.waitUntil(lambda: engine.cancelled == [reply.request_id])
    # the engine's own Done(cancelled) adds its metrics to the stopped reply, not its text
    qtbot.waitUntil(lambda: "reused 1180 of 1200" in bubble.stats.text())
    assistant = stored(window, reply.conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Hello there", "cancelled")
    assert assistant.metrics["cached_tokens"] == 1180


def test_stop_button_toggles(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.hold_after = 1
    type_and_send(qtbot, window, "Go")
    qtbot.waitUntil(engine.held.is_set)
    assert window.composer.button.text() == "Stop"
    window.composer.button.click()
    assert window.composer.button.text() == "Send"
    qtbot.waitUntil(lambda: len(engine.cancelled) == 1)
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assert stored(window, conversation_id)[1].status == "cancelled"


# -- regenerate, edit, copy ------------------------------------------------------------------------


def test_regenerate_resubmits_the_same_history(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    conversation_id = chat(qtbot, window, "Hi")
    first = engine.requests[0]
    engine.tokens = ["Another", " answer"]
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        click_action(qtbot, window, last_bubble(window).message_id, "regenerate")
    assert len(engine.requests) == 2
    assert engine.requests[1].messages == first.messages
    assert engine.requests[1].id != first.id
    messages = stored(window, conversation_id)
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "Hi", "done"),
        ("assistant", "Another answer", "done"),
    ]
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Hi", "Another answer"]


def test_edit_an_earlier_message_truncates_and_reasks(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    conversation_id = chat(qtbot, window, "Hi")
    chat(qtbot, window, "Second question")
    first_user = stored(window, conversation_id)[0]
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        assert window.edit_message(first_user.id, "Hello again")
    assert engine.requests[-1].messages[1:] == ({"role": "user", "content": "Hello again"},)
    assert [(m.role, m.content) for m in stored(window, conversation_id)] == [
        ("user", "Hello again"),
        ("assistant", FULL_REPLY),
    ]
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Hello again", FULL_REPLY]


def test_copy_puts_the_reply_on_the_clipboard(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    chat(qtbot, window, "Hi")
    QApplication.clipboard().setText("something else")
    click_action(qtbot, window, last_bubble(window).message_id, "copy")
    assert QApplication.clipboard().text() == FULL_REPLY
    hint = window.composer.hint
    assert hint.isVisible() and hint.text() == f"Copied {len(FULL_REPLY)} characters to the clipboard."


def test_the_context_meter_says_how_much_of_the_context_the_chat_fills(qtbot: QtBot, harness: Harness) -> None:
    from engine.api import Loaded

    window = harness.open()
    engine = fake(window)
    engine.load_info = {**engine.load_info, "context_length": 8192}
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()
    meter = window.composer.context
    assert meter.text() == "Context: empty"
    conversation = chat(qtbot, window, "Hi")
    done = engine.metrics
    used = done.prompt_tokens + done.completion_tokens
    said = f"Context: {used:,} of 8,192 tokens ({100 * used / 8192:.0f} %)"
    assert meter.text() == said and meter.isVisible()
    window.new_chat()
    assert meter.text() == "Context: empty"
    window.open_conversation(conversation)
    assert meter.text() == said, "read back from the stored reply"


def test_the_meter_counts_the_last_reply_the_model_computed() -> None:
    from app.state.context import context_text, tokens_in_chat

    computed = {"prompt_tokens": 300, "completion_tokens": 40}
    from_cache = {"prompt_tokens": 0, "completion_tokens": 12, "answer_cache": "exact"}
    assert tokens_in_chat([computed, from_cache]) == 340, "a cached reply read no prompt: the one before counts"
    assert tokens_in_chat([None, from_cache]) is None
    assert context_text(None, 2048) == "Context: empty" and context_text(None, 0) == ""
    assert context_text(1536, 2048) == "Context: 1,536 of 2,048 tokens (75 %)"
    assert context_text(1536, 0) == "Context: 1,536 tokens", "a remote server's context length is not known"


def test_the_draft_goes_to_the_engine_as_it_is_typed_and_the_switch_stops_it(qtbot, harness) -> None:  # noqa: ANN001
    """Prefill while typing (issue 26): 150 ms after typing pauses (at once on a paste) the window hands the
    engine the request Send would make; the composer says what is ready; the panel's switch turns it off."""
    window = harness.open()
    engine = fake(window)
    qtbot.keyClicks(window.composer.editor, "Hello")
    assert not engine.hints  # still typing
    qtbot.waitUntil(lambda: len(engine.hints) == 1, timeout=2_000)
    request = engine.hints[-1]
    assert request.messages[-1] == {"role": "user", "content": "Hello"}
    assert request.sampling == window.session.draft_request("x").sampling
    qtbot.waitUntil(lambda: window.composer.prefilled.isVisible())
    assert window.composer.prefilled.text() == "1 token ready"
    window.composer.editor.insertPlainText(" there, a pasted paragraph of some length")  # a paste: at once
    assert len(engine.hints) == 2 and engine.hints[-1].messages[-1]["content"].endswith("some length")
    chat(qtbot, window, "Hello again")
    assert engine.requests[-1].conversation_id == window.session.conversation_id
    assert not window.composer.prefilled.isVisible()

    qtbot.keyClicks(window.composer.editor, "Draft in this chat")
    qtbot.waitUntil(lambda: engine.hints[-1].messages[-1]["content"] == "Draft in this chat", timeout=2_000)
    first = engine.hints[-1].conversation_id
    window.new_chat()  # the draft stays in the composer: it is prefilled for the chat now open instead
    assert engine.hints[-1].conversation_id != first
    assert engine.hints[-1].messages[-1]["content"] == "Draft in this chat"
    window.composer.clear()

    switches = window.latency.panel.switches
    switches.checks["prefill_typing"].setChecked(False)
    assert window.settings.prefill_while_typing is False
    sent = len(engine.hints)
    qtbot.keyClicks(window.composer.editor, "Not sent")
    qtbot.wait(400)
    assert len(engine.hints) == sent
