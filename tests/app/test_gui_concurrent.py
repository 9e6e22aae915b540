"""Several chats stream at once (issue 50): busy state and Stop are per chat, each reply lands in its own chat.

The fake engine here serves each request on a thread of its own, as the engine's batch serves requests in
flight together: each reply sends its first token, then waits at a gate the test opens (or a cancel), then
ends with its second token.  Before the fix a streaming reply in one chat showed Stop in every chat and
refused a Send anywhere else.
"""

from __future__ import annotations

import threading

import pytest
from pytestqt.qtbot import QtBot

from app.window import MainWindow
from engine.api import Done, Request, Started, Token
from engine.storage import Store
from tests.support import gui_harness
from tests.support.fake_engine import FakeEngine
from tests.support.gui_harness import Harness, fake, stored, type_and_send


class ParallelFake(FakeEngine):
    """Each request streams on its own thread: "Answer" at once, then, once ``open(question)`` (or a cancel),
    " to <question>" and ``Done``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gates: dict[str, threading.Event] = {}  # question -> its reply waits for this
        self.stopped: set[str] = set()  # request ids cancelled

    def submit(self, request: Request) -> None:
        self.requests.append(request)
        question = str(request.messages[-1]["content"])
        self.gates[question] = threading.Event()
        threading.Thread(target=self._stream, args=(request, question), daemon=True).start()

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.stopped.add(request_id)
        for request in self.requests:
            if request.id == request_id:
                self.gates[str(request.messages[-1]["content"])].set()

    def open(self, question: str) -> None:
        self.gates[question].set()

    def _stream(self, request: Request, question: str) -> None:
        self.on_event(Started(request.id, 0.0, prompt_tokens=3))
        self.on_event(Token(request.id, 0.01, "Answer", (1,)))
        self.gates[question].wait(10)
        if request.id in self.stopped:
            self.on_event(Done(request.id, 0.02, "Answer", "cancelled", self.metrics))
            return
        self.on_event(Token(request.id, 0.02, f" to {question}", (2,)))
        self.on_event(Done(request.id, 0.03, f"Answer to {question}", "stop", self.metrics))


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gui_harness, "FakeEngine", ParallelFake)


def engine_of(window: MainWindow) -> ParallelFake:
    engine = fake(window)
    assert isinstance(engine, ParallelFake)
    return engine


def start(qtbot: QtBot, window: MainWindow, question: str) -> str:
    """Send ``question`` in the open chat (a new one if none) and wait for its first token; the chat's id."""
    type_and_send(qtbot, window, question)
    conversation = window.session.conversation_id
    assert conversation is not None
    qtbot.waitUntil(lambda: getattr(window.session.active, "text", "") == "Answer")  # its first token is in
    return conversation


def button(window: MainWindow) -> str:
    return window.composer.button.text()


@pytest.mark.usefixtures("parallel")
def test_two_chats_stream_at_once_each_with_its_own_send_or_stop(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = engine_of(window)
    first = start(qtbot, window, "First question")
    assert button(window) == "Stop" and window.stop_action.isEnabled()

    window.new_chat()  # another chat while the first streams: it may send
    assert button(window) == "Send" and not window.stop_action.isEnabled()
    second = start(qtbot, window, "Second question")
    assert second != first
    assert len(engine.requests) == 2, "the second chat's message went out while the first streams"
    assert button(window) == "Stop"
    assert {r.conversation_id for r in window.session.all_streaming()} == {first, second}

    window.open_conversation(first)  # back to the first: its own reply, still streaming, and its Stop
    assert button(window) == "Stop"
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["First question", "Answer"]

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.open("Second question")  # the other chat's reply ends: this one still streams
    assert button(window) == "Stop"
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["First question", "Answer"]
    assert stored(window, second)[-1].content == "Answer to Second question"

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.open("First question")
    qtbot.waitUntil(lambda: button(window) == "Send")
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["First question", "Answer to First question"]
    for conversation, question in ((first, "First question"), (second, "Second question")):
        assert [(m.role, m.content, m.status) for m in stored(window, conversation)] == [
            ("user", question, "done"),
            ("assistant", f"Answer to {question}", "done"),
        ]
    window.open_conversation(second)
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Second question", "Answer to Second question"]
    assert engine.cancelled == []


@pytest.mark.usefixtures("parallel")
def test_stop_stops_only_the_open_chats_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = engine_of(window)
    first = start(qtbot, window, "Keep going")
    window.new_chat()
    second = start(qtbot, window, "Stop me")
    stopped = engine.requests[-1].id
    window.composer.button.click()  # Stop, in the second chat
    assert button(window) == "Send"
    qtbot.waitUntil(lambda: engine.cancelled == [stopped])
    qtbot.waitUntil(lambda: stored(window, second)[-1].status == "cancelled")
    assert window.session.streaming(first) is not None, "the other chat's reply goes on"

    window.open_conversation(first)
    assert button(window) == "Stop"
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.open("Keep going")
    qtbot.waitUntil(lambda: button(window) == "Send")
    assert stored(window, first)[-1].content == "Answer to Keep going"
    assert stored(window, second)[-1].content == "Answer"
    assert engine.cancelled == [stopped]


@pytest.mark.usefixtures("parallel")
def test_deleting_a_chat_stops_its_reply_and_closing_stops_them_all(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = engine_of(window)
    doomed = start(qtbot, window, "Doomed")
    window.new_chat()
    kept = start(qtbot, window, "Kept")
    assert window.delete_conversation(doomed, confirm=False)
    assert engine.cancelled == [engine.requests[0].id], "the deleted chat's reply was stopped, not the open one's"
    assert window.session.streaming(kept) is not None and button(window) == "Stop"
    window.new_chat()
    third = start(qtbot, window, "Third")
    harness.close(window)  # as the close button does: every reply still streaming stops and keeps its text
    assert sorted(engine.cancelled) == sorted(r.id for r in engine.requests)
    with Store(harness.db_path) as store:
        for conversation in (kept, third):
            assert (store.messages(conversation)[-1].content, store.messages(conversation)[-1].status) == (
                "Answer",
                "cancelled",
            )


@pytest.mark.usefixtures("parallel")
def test_the_latency_panel_shows_the_open_chats_reply(qtbot: QtBot, harness: Harness) -> None:
    """The walk: a reply that ended in the chat in view while another chat streamed was never shown; the panel
    and the status bar's latency line kept the reply begun last, from the other chat."""
    window = harness.open()
    engine = engine_of(window)
    panel = window.latency.panel
    first = start(qtbot, window, "First question")
    first_id = engine.requests[-1].id
    window.new_chat()
    start(qtbot, window, "Second question")
    second_id = engine.requests[-1].id
    assert panel.trace is not None and panel.trace.request_id == second_id

    window.open_conversation(first)
    assert panel.trace is not None and panel.trace.request_id == first_id, "the open chat's own reply"
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.open("First question")
    panel.flush()
    assert panel.trace.status == "done" and panel.trace.tokens == 2
    assert len(panel.history.points) == 1, "the finished reply is on the history chart"
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.open("Second question")  # the other chat's reply ends out of view
    panel.flush()
    assert panel.trace.request_id == first_id and len(panel.history.points) == 2
