"""GUI: how replies look and keep up: the stats line, Markdown, draft colours, throttling, scrolling,
no blank space under the last message, selecting a message's text, the hooks for the latency panel."""

from __future__ import annotations

import re
from dataclasses import replace

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QTextBrowser, QToolTip
from pytestqt.qtbot import QtBot

from app.state.reply import stats_line
from app.views.markdown_render import CODE_BG, DRAFT_COLOUR, render_reply
from app.window import MainWindow
from engine.api import Done
from tests.support.fake_engine import METRICS
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

# -- rendering and responsiveness --------------------------------------------------------------------------


def test_stats_line_shows_only_what_exists() -> None:
    assert stats_line(METRICS.to_dict()) == FULL_STATS
    assert stats_line({"ttft_s": 0.5}) == "TTFT 0.50 s"
    assert stats_line({"prompt_tokens": 12, "completion_tokens": 3}) == "3 tokens \u00b7 12 prompt tokens"
    assert stats_line({}, "cancelled") == "stopped"
    assert stats_line({"completion_tokens": 9, "drafted": 0, "accepted": 0}) == "9 tokens"
    assert stats_line({"prompt_tokens": 35, "cached_tokens": 0}) == "reused 0 of 35 prompt tokens"
    # a remote engine: the prompt counts only where its server reported them, never a made-up "0 of 0"
    remote = {"completion_tokens": 4, "prompt_tokens": 0, "cached_tokens": 0, "server": {"model": "m"}}
    assert stats_line(remote) == "4 tokens"
    reported = {**remote, "prompt_tokens": 30, "server_reported": ["prompt_tokens"]}
    assert stats_line(reported) == "4 tokens \u00b7 30 prompt tokens"
    assert stats_line({"drafted": 40, "accepted": 31, "speedup": 1.84}) == (
        "accepted 31 of 40 drafted (78 %) \u00b7 1.8\u00d7 plain decode"
    )
    assert stats_line({"completion_tokens": 2, "quant": "int8-cpu"}) == "2 tokens \u00b7 int8-cpu"
    # a reply from the answer cache read no prompt: no "reused 0 of 0 prompt tokens"
    hit = {"completion_tokens": 5, "prompt_tokens": 0, "cached_tokens": 0, "answer_cache": "exact"}
    assert stats_line(hit) == "5 tokens"


def test_markdown_rendering() -> None:
    html = render_reply("Use `x`:\n\n```python\nif a < b:\n    pass\n```\n<script>alert(1)</script>")
    assert CODE_BG in html and "monospace" in html
    assert "if a &lt; b:" in re.sub(r"<[^>]+>", "", html), "the code, escaped, under its colours"
    assert '<span style="color: #007020; font-weight: bold">if</span>' in html, "Pygments coloured the keyword"
    assert "<script>" not in html and "&lt;script&gt;" in html
    coloured = render_reply([("plain ", False), ("drafted", True), ("\n# Head", True)], colour_drafts=True)
    assert coloured.count(DRAFT_COLOUR) == 2
    assert "<h1>" in coloured
    assert DRAFT_COLOUR not in render_reply([("drafted", True)], colour_drafts=False)
    half = render_reply("Here:\n```py\nx = 1", streaming=True)
    assert "monospace" in half and "```" not in half


def test_a_reply_cut_off_inside_a_code_block_keeps_its_formatting() -> None:
    """Stop or the token limit in the middle of a block: no literal fence, indentation kept, no italics."""
    cut = render_reply("Try this:\n\n```python\ndef first_item(my_list):\n    return my_list[0]\n    # _not_ italic")
    text = re.sub(r"<[^>]+>", "", cut)
    assert "```" not in cut and "<em>" not in cut and "<i>" not in cut
    assert "def first_item(my_list):\n    return my_list[0]" in text, "indentation and underscores as written"
    assert "monospace" in cut and "# _not_ italic" in text
    drafted = render_reply([("```python\nx_1 = 1\n", True), ("y_2 = 2", True)], colour_drafts=True)
    assert DRAFT_COLOUR not in drafted and "x_1" in re.sub(r"<[^>]+>", "", drafted), "code keeps its own colours"


def test_drafted_tokens_are_coloured_only_when_enabled(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).draft_every = 2
    chat(qtbot, window, "Hi")
    assert DRAFT_COLOUR not in last_bubble(window).content.text(), "off by default: a reply reads as plain text"
    window.apply_settings(replace(window.settings, colour_draft_tokens=True))  # Speed > Colour drafted tokens
    chat(qtbot, window, "Again")
    assert DRAFT_COLOUR in last_bubble(window).content.text()
    window.apply_settings(replace(window.settings, colour_draft_tokens=False))
    chat(qtbot, window, "Once more")
    assert DRAFT_COLOUR not in last_bubble(window).content.text()


def test_forced_tokens_have_their_own_colour(qtbot: QtBot, harness: Harness) -> None:
    from app.views import markdown_render
    from engine.storage import Settings

    window = harness.open(settings=Settings(colour_draft_tokens=True))
    fake(window).draft_every, fake(window).forced_every = 2, 3  # "Hello", " there"=draft, ","=forced, ...
    chat(qtbot, window, "Hi")
    shown = last_bubble(window).content.text()
    assert markdown_render.FORCED_COLOUR in shown and markdown_render.DRAFT_COLOUR in shown
    assert markdown_render.FORCED_COLOUR != markdown_render.DRAFT_COLOUR
    # one run of each kind right after the other stays balanced, and block syntax keeps no marker
    html = markdown_render.render_reply(
        [("# Title ", False), ("here", "forced"), ("\n- item ", True), ("one", "forced")], colour_drafts=True
    )
    assert html.count("<span") == html.count("</span>") == 3 and "<h1>" in html and "<li>" in html


def test_fast_streams_are_throttled(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = [f"w{i} " for i in range(300)]
    engine.token_pause = 0.0
    renders = 0

    def counting(*_: object) -> None:  # each repaint of the streaming reply is one row change
        nonlocal renders
        renders += 1

    window.chat_view.chat_model.dataChanged.connect(counting)
    chat(qtbot, window, "Count")
    assert last_bubble(window).plain_text == "".join(engine.tokens)
    assert renders < 100


def test_view_stays_at_the_bottom_unless_scrolled_up(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = [f"Paragraph {i}.\n\n" for i in range(60)]
    bar = window.chat_view.verticalScrollBar()
    chat(qtbot, window, "Long one")
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())

    engine.hold_after = 10
    type_and_send(qtbot, window, "Another long one")
    qtbot.waitUntil(engine.held.is_set)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    bar.setValue(0)  # the user scrolls up to read
    assert not window.chat_view.pinned
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(lambda: last_bubble(window).plain_text.endswith("Paragraph 59.\n\n"))
    assert bar.value() == 0
    bar.setValue(bar.maximum())
    assert window.chat_view.pinned


def test_switching_conversations_mid_stream(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    other = chat(qtbot, window, "Other chat")
    window.new_chat()
    send_and_hold(qtbot, window, "Streaming chat")
    streaming = window.session.conversation_id
    assert streaming is not None
    window.open_conversation(other)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Other chat", FULL_REPLY]
    assert stored(window, streaming)[1].content == FULL_REPLY
    window.open_conversation(streaming)
    assert [b.plain_text for b in window.chat_view.bubbles()] == ["Streaming chat", FULL_REPLY]


# -- the view's geometry, text selection, hooks ---------------------------------------------------------


def _blank_under_last(window: MainWindow) -> int:
    view = window.chat_view
    box = view.row_layout(last_bubble(window).message_id)
    assert box is not None
    return view.viewport().height() - 1 - box.bubble.bottom()


LAYOUT_WAIT_MS = 20_000  # relayout after paints: generous, as a loaded CI machine can be slow


def test_no_blank_space_under_the_last_message_long_or_short(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.tokens = ["Answer paragraph. "] * 40
    for n in range(4):
        chat(qtbot, window, f"Question {n}")
    view, bar = window.chat_view, window.chat_view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=LAYOUT_WAIT_MS)
    qtbot.waitUntil(lambda: 0 <= _blank_under_last(window) <= 24, timeout=LAYOUT_WAIT_MS)
    window.open_conversation(window.session.conversation_id or "")  # reopened: the same
    qtbot.waitUntil(
        lambda: bar.value() == bar.maximum() and 0 <= _blank_under_last(window) <= 24, timeout=LAYOUT_WAIT_MS
    )

    engine.hold_after = 3  # and while streaming
    type_and_send(qtbot, window, "One more")
    qtbot.waitUntil(engine.held.is_set)
    qtbot.waitUntil(
        lambda: bar.value() == bar.maximum() and 0 <= _blank_under_last(window) <= 24, timeout=LAYOUT_WAIT_MS
    )
    assert view.pinned
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(
        lambda: bar.value() == bar.maximum() and 0 <= _blank_under_last(window) <= 24, timeout=LAYOUT_WAIT_MS
    )


def test_a_message_text_can_be_selected_and_copied(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).tokens = ["Some **bold** text and `code`."]
    chat(qtbot, window, "Hi")
    view = window.chat_view
    reply = last_bubble(window)
    box = view.row_layout(reply.message_id)
    assert box is not None
    # a double-click as Qt delivers it: press, release, then the double-click event
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=box.content.center())
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=box.content.center())
    browser = view.findChild(QTextBrowser)
    assert browser is not None and browser.isVisible() and browser.isReadOnly()
    assert browser.toPlainText() == "Some bold text and code."
    assert box.content.contains(browser.geometry().center())
    browser.selectAll()
    browser.copy()
    assert QApplication.clipboard().text() == "Some bold text and code."

    user = view.bubbles()[0]
    opened = view.select_text(user.message_id)  # the same from the context menu's "Select text"
    assert isinstance(opened, QTextBrowser) and opened.toPlainText() == "Hi"
    menu = view.context_menu(user.message_id)
    assert [a.text() for a in menu.actions() if a.text()] == [
        "Copy",
        "Edit",
        "Compare\u2026",
        "Branch from here",
        "Select text",
    ]


def test_actions_wait_while_a_reply_streams(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    chat(qtbot, window, "First")
    first_reply = last_bubble(window).message_id
    send_and_hold(qtbot, window, "Second")
    click_action(qtbot, window, first_reply, "regenerate")  # greyed out: nothing happens
    assert len(engine.requests) == 2
    assert not next(
        a for a in window.chat_view.context_menu(first_reply).actions() if a.text() == "Regenerate"
    ).isEnabled()
    QApplication.clipboard().setText("")
    click_action(qtbot, window, first_reply, "copy")  # copying still works
    assert QApplication.clipboard().text() == FULL_REPLY
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()


def test_compare_action_and_reply_tooltip_for_the_latency_panel(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    chat(qtbot, window, "Hi")
    view = window.chat_view
    user, reply = view.bubbles()
    view.set_compare_available(False)  # as in a window without the latency panel
    assert view.action_rect(user.message_id, "compare").isEmpty()  # hidden until a panel offers it
    view.set_compare_available(True)
    with qtbot.waitSignal(view.compare_requested) as asked:
        click_action(qtbot, window, user.message_id, "compare")
    assert asked.args == [user.message_id]
    assert view.action_rect(reply.message_id, "compare").isEmpty()  # only on the user's messages

    view.set_reply_tooltip(reply.message_id, "fp16-cpu \u00b7 speculative: lookup")
    box = view.row_layout(reply.message_id)
    assert box is not None
    pos = box.content.center()
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, pos, view.viewport().mapToGlobal(pos)))
    qtbot.waitUntil(lambda: QToolTip.text() == "fp16-cpu \u00b7 speculative: lookup")
    view.tooltip_provider = lambda message_id: f"ran as #{message_id}"
    assert reply.tooltip == "fp16-cpu \u00b7 speculative: lookup"  # an explicit text wins
    view.set_reply_tooltip(reply.message_id, "")
    assert reply.tooltip == f"ran as #{reply.message_id}"
    QToolTip.hideText()


def test_a_code_block_has_a_copy_link_that_copies_the_code_as_written(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).tokens = ["Like this:\n\n", "```python\n", "def first(my_list):\n", "    return my_list[0]\n", "```\n"]
    chat(qtbot, window, "How?")
    view = window.chat_view
    message_id = last_bubble(window).message_id
    view.scrollTo(view.index_of(message_id))
    box = view.row_layout(message_id)
    item = view.chat_model.item(message_id)
    assert box is not None and item is not None
    where = next(
        (
            QPoint(x, y)
            for y in range(box.content.top(), box.content.bottom(), 2)
            for x in range(box.content.left(), box.content.right(), 4)
            if view.delegate.anchor_at(item, box, x, y) == "brisk-copy:0"
        ),
        None,
    )
    assert where is not None, "the block shows a Copy code link"
    QApplication.clipboard().setText("something else")
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=where)
    code = "def first(my_list):\n    return my_list[0]"
    assert QApplication.clipboard().text() == code, "the code, indentation and all, without fences"
    assert window.composer.hint.text() == f"Copied {len(code)} characters to the clipboard."
    assert view.state() != view.State.EditingState, "a click on the link opens no text editor"
