"""Answer-cache hits in the window: the badge, Regenerate past the cache, the session's hit rate, the switch."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.state.answer_stats import CacheTally, cache_badge
from engine.api import Metrics
from engine.storage import Settings
from tests.support.gui_harness import Harness, chat, click_action, fake, last_bubble

EXACT = Metrics(answer_cache="exact", total_s=0.012, saved_s=1.93, completion_tokens=5)
SEMANTIC = Metrics(
    answer_cache="semantic",
    similarity=0.931,
    cached_question="What is the capital of France?",
    total_s=0.041,
    saved_s=1.2,
)


def test_badge_texts() -> None:
    assert cache_badge(EXACT) == "From cache, exact \u00b7 12 ms \u00b7 saved 1.93 s"
    assert cache_badge(SEMANTIC) == (
        "Similar question, 0.93: \u201cWhat is the capital of France?\u201d \u00b7 41 ms \u00b7 saved 1.20 s"
    )
    assert cache_badge(Metrics(ttft_s=0.2)) == "" and cache_badge(None) == ""
    assert cache_badge({"answer_cache": "exact", "saved_s": "lots"}) == "From cache, exact"
    long = cache_badge({"answer_cache": "semantic", "cached_question": "why " * 60})
    assert long.endswith("\u2026\u201d") and len(long) < 120


def test_tally_counts_hits_and_time_saved() -> None:
    tally = CacheTally()
    assert tally.text() == "\u2014" and tally.hit_rate is None
    tally.add(Metrics(ttft_s=0.2))
    tally.add(EXACT)
    tally.add(SEMANTIC)
    assert tally.hit_rate == 2 / 3
    assert tally.text() == "2 of 3 replies (67 %) \u00b7 saved 3.13 s"


def test_a_cached_reply_is_badged_and_regenerate_asks_the_model(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    chat(qtbot, window, "What is the capital of France?")
    assert last_bubble(window).badge.text() == ""
    engine.cached = EXACT
    conversation = chat(qtbot, window, "What is the capital of France?")
    bubble = last_bubble(window)
    assert bubble.badge.text() == "From cache, exact \u00b7 12 ms \u00b7 saved 1.93 s"
    assert engine.requests[-1].answer_cache is True and engine.requests[-1].fresh is False
    panel = window.latency.panel
    assert panel.numbers.text("cache_session") == "1 of 2 replies (50 %) \u00b7 saved 1.93 s"
    panel.flush()
    assert panel.numbers.text("prompt") == "none read (answer cache)", "no prompt counts for a hit"
    assert "prompt tokens" not in bubble.stats.text()

    from engine.api import Done

    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=5000):
        click_action(qtbot, window, bubble.message_id, "regenerate")  # one Regenerate, cached reply or not
    qtbot.waitUntil(lambda: window.session.active is None)
    assert engine.requests[-1].fresh is True and engine.requests[-1].answer_cache is False
    assert len(engine.requests) == 3
    fresh = last_bubble(window)
    assert fresh.message_id == bubble.message_id, "the new reply is a version of the same message"
    assert fresh.badge.text() == "", "the fresh reply came from the model"
    assert not window.chat_view.action_rect(fresh.message_id, "regenerate").isEmpty()
    assert panel.numbers.text("cache_session") == "1 of 3 replies (33 %) \u00b7 saved 1.93 s"

    engine.cached = SEMANTIC
    chat(qtbot, window, "Which city is France's capital?")
    assert last_bubble(window).badge.text().startswith("Similar question, 0.93: \u201cWhat is the capital")
    harness.close(window)
    again = harness.open()
    again.open_conversation(conversation)
    assert last_bubble(again).badge.text().startswith("Similar question, 0.93"), "reopening keeps the badge"


def test_the_answer_cache_switch_sets_the_request(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.cached = EXACT
    window.latency.panel.switches.checks["answer_cache"].setChecked(False)
    assert window.settings.answer_cache is False
    chat(qtbot, window, "Hi")
    assert engine.requests[-1].answer_cache is False
    assert last_bubble(window).badge.text() == ""
    harness.close(window)
    assert Settings.load().answer_cache is False
