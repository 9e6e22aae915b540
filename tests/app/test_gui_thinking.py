"""A thinking model's reply in the window: its thinking collapsed and live over the answer, opened by a click,
kept apart from the answer (history and later prompts carry the answer alone), its own waterfall bar, and the
chat's thinking switch where the model's template has one."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.panels.trace import ReplyTrace
from engine.api import Done, Loaded, Started, Thinking, Token
from tests.support.fake_engine import METRICS
from tests.support.gui_harness import Harness, fake, last_bubble, stored, type_and_send

ANSWER = "Hello there, friend."
THOUGHT_LINE = "Thought for 0.4 s (2 tokens), first answer token at 0.6 s"


def test_a_reply_with_thinking_shows_it_collapsed_and_a_click_opens_it(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.thinking = ["I ", "ponder."]
    engine.metrics = dataclasses.replace(METRICS, thinking_tokens=2, thinking_s=0.42, answer_ttft_s=0.63)
    engine.hold_after = 1  # held inside the thinking
    type_and_send(qtbot, window, "Hi")
    qtbot.waitUntil(engine.held.is_set)
    reply = window.session.active
    assert reply is not None
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None
    qtbot.waitUntil(lambda: bubble.thinking.text().startswith("\u25b8 Thinking\u2026 "))  # live, collapsed
    assert bubble.plain_text == "" and "I " not in bubble.content.text()
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(lambda: window.session.active is None)

    assert bubble.thinking.text() == "\u25b8 " + THOUGHT_LINE
    assert bubble.plain_text == ANSWER and "ponder" not in bubble.content.text()
    view = window.chat_view
    view.scrollTo(view.index_of(bubble.message_id))
    box = view.row_layout(bubble.message_id)
    assert box is not None and box.thinking_header is not None and box.thinking is None
    closed_height = box.bubble.height()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=box.thinking_header.center())
    assert bubble.thinking.text() == "\u25be " + THOUGHT_LINE + "\nI ponder."
    box = view.row_layout(bubble.message_id)
    assert box is not None and box.thinking is not None and box.bubble.height() > closed_height
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=box.thinking_header.center())
    assert bubble.thinking.text().startswith("\u25b8 ")

    conversation = reply.conversation_id
    assistant = stored(window, conversation)[-1]
    assert assistant.content == ANSWER and assistant.metrics["thinking"] == "I ponder."
    panel = window.latency.panel
    panel.flush()
    assert "thinking" in [s.name for s in panel.waterfall.spans]

    engine.thinking, engine.hold_after = [], None  # the next turn's prompt carries the answer alone
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        type_and_send(qtbot, window, "And then?")
    assert engine.requests[-1].messages[-2] == {"role": "assistant", "content": ANSWER}
    qtbot.waitUntil(lambda: window.session.active is None)

    harness.close(window)
    again = harness.open()
    again.open_conversation(conversation)
    shown = again.chat_view.bubbles()
    assert shown[1].thinking.text() == "\u25b8 " + THOUGHT_LINE, "reopening shows the thinking, collapsed"
    assert last_bubble(again).thinking.text() == "", "a reply without thinking has no line"


def test_the_thinking_switch_shows_where_the_template_has_one_and_goes_with_the_request(
    qtbot: QtBot, harness: Harness
) -> None:
    plain = harness.open()
    assert not plain.parameters.panel.thinking_box.isVisibleTo(plain)
    harness.close(plain)
    window = harness.open()
    fake(window).load_info["thinking_switch"] = True  # the next load's model has the switch
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.load_model()
    panel = window.parameters.panel
    assert panel.thinking_box.isVisibleTo(window) and panel.thinking_box.currentData() == "auto"
    panel.thinking_box.setCurrentIndex(panel.thinking_box.findData("off"))
    panel.thinking_box.activated.emit(panel.thinking_box.currentIndex())
    assert panel.own == {"thinking": "off"}
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        type_and_send(qtbot, window, "Hi")
    assert fake(window).requests[-1].thinking == "off"
    assert fake(window).requests[-1].sampling.temperature == 0.0  # the option is no sampling value


def test_the_trace_gives_thinking_its_own_bar_while_it_streams() -> None:
    trace = ReplyTrace("r")
    for event in (Started("r", 0.1), Thinking("r", 0.3, "I", (1,)), Thinking("r", 0.9, "x", (2,))):
        trace.apply(event)
    assert [s.name for s in trace.spans()][-1] == "thinking" and trace.numbers()["completion_tokens"] == 2
    trace.apply(Token("r", 1.0, "A", (3,)))
    trace.apply(Token("r", 1.5, "B", (4,)))
    bars = {s.name: (s.start_s, s.end_s) for s in trace.spans()}
    assert bars["thinking"] == (0.3, 1.0) and bars["decode"] == (1.0, 1.5)
    numbers = trace.numbers()
    assert numbers["thinking_tokens"] == 2 and numbers["answer_ttft_s"] == 1.0
    assert abs(numbers["thinking_s"] - 0.7) < 1e-9
