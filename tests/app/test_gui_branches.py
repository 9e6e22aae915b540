"""Branches in the window (issue 52): "Branch from here" on a message, "Keep last N turns…", the sidebar nesting
them under their parent, and the branch's first reply saying how much of the prompt it reused."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.views.conversation_list import BRANCH_MARK, DEPTH_ROLE
from app.window import MainWindow
from app.window import conversations as conversations_module
from engine.api import Done, Metrics
from tests.support.gui_harness import FULL_REPLY, Harness, chat, fake, stored, type_and_send


def branch_action(window: MainWindow, message_id: int):  # noqa: ANN201
    return next(a for a in window.chat_view.context_menu(message_id).actions() if a.text() == "Branch from here")


def sidebar_rows(window: MainWindow) -> list[tuple[str, int, str]]:
    model = window.sidebar.model
    return [(model.ids()[r], model.index(r).data(DEPTH_ROLE), model.index(r).data()) for r in range(model.rowCount())]


def test_branch_from_here_opens_a_nested_branch_with_the_history_up_to_that_reply(
    qtbot: QtBot, harness: Harness
) -> None:
    window = harness.open()
    parent = chat(qtbot, window, "First question")
    chat(qtbot, window, "Second question")
    first_reply = stored(window, parent)[1]
    assert first_reply.role == "assistant"

    branch_action(window, first_reply.id).trigger()

    branch = window.session.conversation_id
    assert branch is not None and branch != parent, "the branch opens at once"
    assert [(b.role, b.plain_text) for b in window.chat_view.bubbles()] == [
        ("user", "First question"),
        ("assistant", FULL_REPLY),
    ]
    assert sidebar_rows(window) == [
        (parent, 0, "First question"),
        (branch, 1, f"{BRANCH_MARK}First question (branch)"),
    ]
    assert window.sidebar.list_view.currentIndex().row() == 1, "the branch is the chat selected"
    assert window.store.get_conversation(branch).parent_id == parent
    assert len(stored(window, parent)) == 4, "the parent keeps its whole history"

    # the branch's first reply: the parent's history up to the reply, then the new message; the reuse is said
    engine = fake(window)
    engine.metrics = Metrics(prompt_tokens=48, cached_tokens=40, computed_tokens=8, ttft_s=0.05)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        type_and_send(qtbot, window, "A different second question")
    qtbot.waitUntil(lambda: window.session.active is None)
    sent = [(m["role"], m["content"]) for m in engine.requests[-1].messages]
    assert sent[-3:] == [
        ("user", "First question"),
        ("assistant", FULL_REPLY),
        ("user", "A different second question"),
    ]
    assert engine.requests[-1].conversation_id == branch
    assert "reused 40 cached tokens of 48" in window.statusBar().currentMessage()
    assert sidebar_rows(window)[1][:2] == (branch, 1), "a reply keeps the branch under its parent"

    # another chat made later sits above the family; a reply in the branch brings the family back up
    window.new_chat()
    other = chat(qtbot, window, "Unrelated")
    assert [row[:2] for row in sidebar_rows(window)] == [(other, 0), (parent, 0), (branch, 1)]
    window.sidebar.list_view.setCurrentIndex(window.sidebar.model.index(2))  # the user clicks the branch
    assert window.session.conversation_id == branch
    chat(qtbot, window, "And a third")
    assert [row[:2] for row in sidebar_rows(window)] == [(parent, 0), (branch, 1), (other, 0)]
    assert window.sidebar.list_view.currentIndex().data() == f"{BRANCH_MARK}First question (branch)"


def test_branch_from_a_question_puts_it_in_the_composer(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    parent = chat(qtbot, window, "First question")
    chat(qtbot, window, "Second question")
    question = stored(window, parent)[2]

    branch_action(window, question.id).trigger()

    branch = window.session.conversation_id
    assert branch != parent
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["First question", FULL_REPLY]
    assert window.composer.editor.toPlainText() == "Second question"


def test_keep_last_turns_and_deleting_the_parent_keeps_the_branches(
    qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = harness.open()
    parent = chat(qtbot, window, "One")
    chat(qtbot, window, "Two")
    chat(qtbot, window, "Three")
    asked: list[int] = []

    def get_int(*args: object) -> tuple[int, bool]:
        asked.append(args[3])  # type: ignore[arg-type]  # the default offered
        return 1, True

    monkeypatch.setattr(conversations_module.QInputDialog, "getInt", get_int)
    window.keep_last_action.trigger()

    tail = window.session.conversation_id
    assert asked == [2] and tail != parent
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Three", FULL_REPLY]
    assert sidebar_rows(window)[1] == (tail, 1, f"{BRANCH_MARK}One (last 1 turn)")

    assert window.delete_conversation(parent, confirm=False)
    assert sidebar_rows(window) == [(tail, 0, "One (last 1 turn)")], "the branch stays, as a chat of its own"
    assert window.store.get_conversation(tail).parent_id is None


def test_the_list_nests_branches_and_keeps_the_selected_row_through_a_move(qtbot: QtBot) -> None:
    from app.views.conversation_list import nested
    from app.views.sidebar import Sidebar
    from engine.storage import Conversation

    def chat(cid: str, parent: str | None = None) -> Conversation:
        return Conversation(cid, cid.upper(), "", 0.0, 0.0, parent_id=parent)

    # a family is as recent as its newest member; a lost parent or a loop (a damaged file) shows at the top
    listed = [chat("b2", "a"), chat("c"), chat("a"), chat("b1", "a"), chat("x", "gone"), chat("p", "q"), chat("q", "p")]
    assert [(c.id, depth) for c, depth in nested(listed)] == [
        ("a", 0),
        ("b2", 1),
        ("b1", 1),
        ("c", 0),
        ("x", 0),
        ("p", 0),
        ("q", 1),
    ]
    sidebar = Sidebar()
    qtbot.addWidget(sidebar)
    sidebar.set_conversations([chat("c"), chat("b", "a"), chat("a")])
    assert sidebar.model.ids() == ["c", "a", "b"]
    sidebar.select("b")
    moves: list[object] = []
    sidebar.model.rowsMoved.connect(lambda *args: moves.append(args))
    sidebar.upsert(chat("b", "a"), to_top=True)  # a reply in the branch: parent and branch move up, as one block
    assert sidebar.model.ids() == ["a", "b", "c"] and len(moves) == 1
    assert sidebar.list_view.currentIndex().data() == f"{BRANCH_MARK}B"
