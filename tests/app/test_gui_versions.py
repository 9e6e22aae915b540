"""Regenerate is a new reply (issue 50): past the answer cache, sampled, and every version kept and browsable.

The fake engine here answers as a model would: a greedy request gets the same reply each time, a sampled
one a reply of its own seed; a request the answer cache may answer gets the cached badge.  Regenerate on a
cached greedy reply must give a different reply from the model, and each version stays on the message,
with its own timings, browsed with "‹ 2/3 ›", kept across a reopen of the database; the version shown
is the one the next turn continues from.
"""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.window import MainWindow
from engine.api import Done, Metrics, Request
from tests.support import gui_harness
from tests.support.fake_engine import FakeEngine
from tests.support.gui_harness import FULL_REPLY, Harness, chat, click_action, fake, last_bubble, stored

CACHED = Metrics(answer_cache="exact", lookup_s=0.03, saved_s=1.5, completion_tokens=5)


class SeededFake(FakeEngine):
    """Greedy: the script's reply every time; sampled: "Sampled reply <seed>", a reply of that seed."""

    def _serve(self, request: Request, t0: float) -> None:
        if request.sampling.temperature <= 0:
            super()._serve(request, t0)
            return
        script, self.tokens = self.tokens, ["Sampled", f" reply {request.sampling.seed}"]
        try:
            super()._serve(request, t0)
        finally:
            self.tokens = script


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gui_harness, "FakeEngine", SeededFake)


def regenerate(qtbot: QtBot, window: MainWindow, message_id: int, ttft_s: float) -> Request:
    """Click Regenerate on a reply whose new version takes ``ttft_s`` to its first token; the request sent."""
    engine = fake(window)
    engine.metrics = Metrics(ttft_s=ttft_s, tokens_per_s=40.0, completion_tokens=2)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        click_action(qtbot, window, message_id, "regenerate")
    qtbot.waitUntil(lambda: window.session.active is None)
    return engine.requests[-1]


def shown_version(window: MainWindow, message_id: int) -> str:
    """The "2/3" drawn between the reply's version arrows."""
    from app.views.message_geometry import action_text

    item = window.chat_view.chat_model.item(message_id)
    assert item is not None
    return action_text(item, "version")


@pytest.mark.usefixtures("seeded")
def test_regenerate_is_a_new_sampled_reply_and_each_version_is_kept(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.cached = CACHED  # the question was answered before: a greedy ask comes from the answer cache
    conversation = chat(qtbot, window, "Tell me a story")
    first = last_bubble(window)
    assert first.plain_text == FULL_REPLY and first.badge.text().startswith("From cache, exact")
    mid = first.message_id
    assert window.chat_view.action_rect(mid, "version").isEmpty(), "one version: no arrows"

    second = regenerate(qtbot, window, mid, ttft_s=0.5)
    asked = engine.requests[0]
    assert second.messages == asked.messages, "the same history, without the reply itself"
    assert second.fresh and not second.answer_cache, "past the answer cache, and not kept as its answer"
    assert second.sampling.temperature == 0.8 and second.sampling.seed is not None, "a greedy chat samples"
    reply = last_bubble(window)
    assert reply.message_id == mid, "the new reply is a version of the same message"
    assert reply.plain_text == f"Sampled reply {second.sampling.seed}" != FULL_REPLY
    assert reply.badge.text() == "", "from the model, not the cache"
    assert reply.stats.text().startswith("TTFT 0.50 s")
    assert shown_version(window, mid) == "2/2"

    third = regenerate(qtbot, window, mid, ttft_s=0.25)
    assert third.sampling.seed != second.sampling.seed, "a new seed each time"
    assert last_bubble(window).plain_text == f"Sampled reply {third.sampling.seed}"
    assert shown_version(window, mid) == "3/3"
    assert [m.content for m in window.store.versions(mid)] == [
        FULL_REPLY,
        f"Sampled reply {second.sampling.seed}",
        f"Sampled reply {third.sampling.seed}",
    ]

    # browse back: each version with its own text, badge and timings; the arrows stop at the ends
    menu = {a.text(): a for a in window.chat_view.context_menu(mid).actions()}
    assert menu["Previous version"].isEnabled() and not menu["Next version"].isEnabled()
    click_action(qtbot, window, mid, "older")
    qtbot.waitUntil(lambda: shown_version(window, mid) == "2/3")
    assert last_bubble(window).plain_text == f"Sampled reply {second.sampling.seed}"
    assert last_bubble(window).stats.text().startswith("TTFT 0.50 s")
    click_action(qtbot, window, mid, "older")
    qtbot.waitUntil(lambda: shown_version(window, mid) == "1/3")
    assert last_bubble(window).plain_text == FULL_REPLY
    assert last_bubble(window).badge.text().startswith("From cache, exact")
    click_action(qtbot, window, mid, "older")  # the first version: the arrow is greyed, nothing changes
    assert shown_version(window, mid) == "1/3"
    assert len(engine.requests) == 3, "browsing asks the model nothing"

    # the versions are in the database: a new window on it shows the one left shown, and browses the rest
    harness.close(window)
    again = harness.open()
    again.open_conversation(conversation)
    assert last_bubble(again).plain_text == FULL_REPLY and shown_version(again, mid) == "1/3"
    click_action(qtbot, again, mid, "newer")
    qtbot.waitUntil(lambda: shown_version(again, mid) == "2/3")
    assert last_bubble(again).plain_text == f"Sampled reply {second.sampling.seed}"

    # the next turn continues from the version shown
    fake(again).cached = None
    chat(qtbot, again, "And then?")
    sent = fake(again).requests[-1].messages
    assert sent[-2:] == (
        {"role": "assistant", "content": f"Sampled reply {second.sampling.seed}"},
        {"role": "user", "content": "And then?"},
    )
    assert [m.content for m in stored(again, conversation)][:2] == [
        "Tell me a story",
        f"Sampled reply {second.sampling.seed}",
    ]


@pytest.mark.usefixtures("seeded")
def test_regenerate_keeps_a_sampling_chats_temperature_and_drops_later_turns(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation = chat(qtbot, window, "First")
    window.session.set_chat_params({"temperature": 0.3})
    first_reply = last_bubble(window).message_id
    chat(qtbot, window, "Second")
    request = regenerate(qtbot, window, first_reply, ttft_s=0.1)
    assert request.sampling.temperature == 0.3
    assert [(m.role, m.version, m.versions) for m in stored(window, conversation)] == [
        ("user", 1, 1),
        ("assistant", 2, 2),
    ], "the turns after a regenerated reply go, as before"
    assert [b.message_id for b in window.chat_view.bubbles()][-1] == first_reply
