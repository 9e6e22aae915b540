"""The latency panel on a scripted stream: numbers, charts, remote greying, switches, a fast stream.

Every test drives a real window over the FakeEngine (tests/support/fake_engine.py)
through the real bridge; the panel is read through its widgets.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QTimer
from pytestqt.qtbot import QtBot

from app.panels.latency import REDRAW_MS
from app.panels.numbers import DASH
from app.state.config import ReplyConfig, config_tooltip
from engine.api import Done, DraftStats, Loaded, Metrics, ModelInfo, Span
from engine.storage import Settings
from tests.support.gui_harness import Harness, chat, fake, send_and_hold, type_and_send

RICH = Metrics(
    prompt_tokens=300,
    cached_tokens=260,
    computed_tokens=40,
    completion_tokens=5,
    ttft_s=0.120,
    tpot_s=0.020,
    tpot_p50_s=0.018,
    tpot_p95_s=0.041,
    tokens_per_s=50.0,
    total_s=0.200,
    prefill_s=0.050,
    drafted=8,
    accepted=6,
    acceptance=0.75,
    draft_sources={"lookup": DraftStats(drafted=8, accepted=6, steps=3)},
    tools_wall_s=0.300,
    tools_sequential_s=0.500,
    answer_cache="semantic",
    similarity=0.93,
    spans=(
        Span("queue", 0.0, 0.001),
        Span("prompt", 0.001, 0.004),
        Span("cache lookup", 0.004, 0.006),
        Span("prefill", 0.006, 0.056),
        Span("first token", 0.056, 0.120),
        Span("decode", 0.120, 0.200),
        Span("tool:clock", 0.080, 0.110),
    ),
)


def test_panel_follows_a_scripted_reply(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    panel = window.latency.panel
    assert panel.numbers.text("model") == "fake-model"
    assert "257.5 MB" in panel.numbers.text("memory")
    engine = fake(window)
    engine.metrics = RICH
    engine.draft_every = 2
    send_and_hold(qtbot, window, "Hello")
    qtbot.waitUntil(lambda: panel.trace is not None and panel.trace.tokens == 2)
    panel.flush()
    assert panel.status.text().startswith("Streaming")
    assert panel.numbers.text("ttft").endswith(" s")  # live, from the first token's t
    assert panel.numbers.text("total") == DASH
    assert panel.tokens.points == 2
    assert [s.name for s in panel.waterfall.spans][:2] == ["queue", "first token"]
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(lambda: panel.history_chart.count == 1)
    panel.flush()
    numbers = panel.numbers
    assert numbers.text("ttft") == "0.120 s"
    assert numbers.text("tpot") == "20.0 ms \u00b7 18.0 ms \u00b7 41.0 ms"
    assert numbers.text("speed") == "50.0"
    assert numbers.text("prompt") == "40 computed \u00b7 260 reused of 300"
    assert numbers.text("prefill") == "0.050 s"
    assert numbers.text("drafts") == "lookup 6/8 (75 %), 2.0/step"
    assert numbers.text("answer_cache") == "semantic hit (similarity 0.93)"
    assert numbers.text("tools") == "0.300 s \u00b7 0.200 s"
    assert [s.name for s in panel.waterfall.spans] == [s.name for s in RICH.spans]
    assert panel.tokens.points == 5
    assert len(panel.tokens.drafts.data) == 2  # tokens 2 and 4 were drafted
    assert panel.status.text().startswith("Last reply")


def test_missing_figures_are_dashes(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).metrics = Metrics(ttft_s=0.1)
    chat(qtbot, window, "Hi")
    panel = window.latency.panel
    qtbot.waitUntil(lambda: panel.history_chart.count == 1)
    panel.flush()
    for key in ("answer_cache", "tools", "total", "prefill"):
        assert panel.numbers.text(key) == DASH, key


def test_a_remote_backend_greys_out_what_it_cannot_report(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    panel = window.latency.panel
    window.bridge.event.emit(Loaded("remote-model", "remote", "", 0.0, ModelInfo(endpoint="http://x")))
    prompt = panel.numbers.values["prompt"]
    assert not prompt.isEnabled() and "remote server" in prompt.toolTip()
    assert not panel.numbers.values["drafts"].isEnabled()
    assert panel.numbers.values["ttft"].isEnabled()  # measured at the client
    fake(window).metrics = Metrics(prompt_tokens=40, cached_tokens=32, ttft_s=0.3, server_reported=("prompt_tokens",))
    chat(qtbot, window, "Hi")
    qtbot.waitUntil(lambda: panel.history_chart.count == 1)
    panel.flush()
    assert prompt.isEnabled()
    assert prompt.text() == "8 computed \u00b7 32 reused of 40"
    assert not panel.numbers.values["drafts"].isEnabled()


def test_each_switch_changes_the_next_request_and_is_recorded(
    qtbot: QtBot, harness: Harness, brisk_data_dir: Path
) -> None:
    window = harness.open(settings=Settings(speculative="off"))
    switches = window.latency.panel.switches
    engine = fake(window)

    def last_request_after(click: object) -> tuple[object, dict]:
        click()  # type: ignore[operator]
        conversation = chat(qtbot, window, f"question {len(engine.requests)}")
        stored = window.store.messages(conversation)[-1]
        return engine.requests[-1], stored.metrics

    request, metrics = last_request_after(lambda: switches.checks["prefix_cache"].click())
    assert request.prefix_cache is False and metrics["config"]["prefix_cache"] == "off"
    assert window.settings.prefix_cache is False
    assert Settings.load(brisk_data_dir / "settings.json").prefix_cache is False  # persisted
    request, metrics = last_request_after(lambda: switches.speculative.setCurrentIndex(2))
    assert request.speculative == "lookup" and metrics["config"]["speculative"] == "lookup"
    request, metrics = last_request_after(lambda: switches.checks["answer_cache"].click())
    assert request.answer_cache is False and metrics["config"]["answer_cache"] == "off"
    request, metrics = last_request_after(lambda: switches.checks["parallel_tools"].click())
    assert request.parallel_tools is False and metrics["config"]["parallel_tools"] == "off"
    assert "Parallel tools: off" in config_tooltip(metrics)
    assert "Speculative: lookup" in config_tooltip(metrics)
    history = window.latency.panel.history
    assert [p.config.speculative for p in history.points] == ["off", "lookup", "lookup", "lookup"]
    qtbot.waitUntil(lambda: window.latency.panel.history_chart.count == 4)  # redrawn at the next paint tick
    assert len(window.latency.panel.history_chart.series) == 2  # "no prefix cache" and "..., spec=lookup"


def test_streaming_off_shows_the_reply_at_the_end(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    window.latency.panel.switches.checks["stream"].click()
    engine = send_and_hold(qtbot, window, "Hello")
    qtbot.waitUntil(lambda: window.session.active is not None and window.session.active.tokens == 2)
    reply = window.session.active
    assert reply is not None and reply.config == ReplyConfig.current(window.settings, stream=False)
    qtbot.wait(120)  # longer than the chat view's repaint throttle: nothing may appear
    bubble = window.chat_view.bubble(reply.message_id)
    assert bubble is not None and bubble.plain_text == ""
    window.latency.panel.flush()
    status = window.latency.panel.status.text()
    assert status.startswith("Writing the reply (shown when done)") and "Streaming" not in status, status
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done)):
        engine.release()
    qtbot.waitUntil(lambda: bubble.plain_text == "Hello there, friend.")
    stored = window.store.messages(reply.conversation_id)[-1]
    assert stored.metrics["config"]["stream"] == "off"


def test_quant_switch_reloads_with_progress(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.load_steps = [(0.3, "Quantizing"), (0.9, "Packing")]
    panel = window.latency.panel
    seen: list[str] = []
    window.bridge.event.connect(lambda e: seen.append(panel.reload_label.text()) if not isinstance(e, Loaded) else None)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        panel.switches.quant.setCurrentText("int8-cpu")
    assert engine.loads[-1].quant == "int8-cpu" and window.settings.quant == "int8-cpu"
    assert any("Reloading with int8-cpu: Quantizing" in text for text in seen), seen
    assert panel.reload_bar.isHidden()
    conversation = chat(qtbot, window, "Hi")
    assert window.store.messages(conversation)[-1].metrics["config"]["quant"] == "int8-cpu"


def stream_with_a_ticking_timer(qtbot: QtBot, harness: Harness, tokens: int, pause_s: float) -> dict[str, float]:
    """Stream ``tokens`` tokens ``pause_s`` apart through a window with a 1 ms timer running.

    Returns the stream's wall time, how often the timer ticked while tokens were
    still arriving, the panel's redraws and the longest gap between ticks (printed
    for docs/PERFORMANCE.md; a figure of the machine, so no test asserts on it).
    """
    window = harness.open()
    engine = fake(window)
    engine.tokens = [f" w{i}" for i in range(tokens)]
    engine.token_pause = pause_s
    ticks: list[tuple[float, int]] = []
    arrived = [0]
    window.bridge.event.connect(lambda e: arrived.__setitem__(0, arrived[0] + 1))
    timer = QTimer()
    timer.setInterval(1)
    timer.timeout.connect(lambda: ticks.append((time.perf_counter(), arrived[0])))
    timer.start()
    redraws_before = window.latency.panel.redraws
    started = time.perf_counter()
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=120_000):
        type_and_send(qtbot, window, "Go")
    wall = time.perf_counter() - started
    qtbot.waitUntil(lambda: window.session.active is None)
    qtbot.wait(100)
    timer.stop()
    assert window.latency.panel.tokens.points == tokens or window.latency.panel.trace.tokens == tokens
    during = [t for t, n in ticks if 0 < n < arrived[0]]
    gaps = [b[0] - a[0] for a, b in zip(ticks, ticks[1:], strict=False)]
    rate = "no pause" if not pause_s else f"{1 / pause_s:.0f} tokens/s"
    redraws = window.latency.panel.redraws - redraws_before
    print(
        f"\nlongest gap between timer ticks, {tokens} tokens at {rate}: {max(gaps) * 1000:.1f} ms "
        f"({len(ticks)} ticks, {redraws} panel redraws in {wall:.2f} s)"
    )
    harness.close(window)
    return {"wall_s": wall, "ticks_during": len(during), "redraws": redraws}


def redraw_allowance(wall_s: float) -> float:
    """The most redraws a throttled panel may make in ``wall_s`` (one per REDRAW_MS, and the last one)."""
    return wall_s * 1000 / REDRAW_MS + 3


def test_the_event_loop_keeps_ticking_while_tokens_stream_fast(qtbot: QtBot, harness: Harness) -> None:
    """2000 tokens at about 2000 tokens/s (ten times the bundled model's decode speed): timers keep running
    while tokens arrive, and the panel redraws at its throttled rate, not once per token."""
    seen = stream_with_a_ticking_timer(qtbot, harness, 2000, 0.0005)
    assert seen["ticks_during"] >= 10, seen
    assert 1 <= seen["redraws"] <= redraw_allowance(seen["wall_s"]) and seen["redraws"] < 2000 / 4, seen


def test_a_burst_of_tokens_is_delivered_in_slices(qtbot: QtBot, harness: Harness) -> None:
    """3000 tokens with no pause at all: the bridge re-emits queued events in slices, so timers still run."""
    seen = stream_with_a_ticking_timer(qtbot, harness, 3000, 0.0)
    assert seen["ticks_during"] >= 1, seen
    assert 1 <= seen["redraws"] <= redraw_allowance(seen["wall_s"]), seen


def test_the_bridge_re_emits_a_backlog_in_bounded_slices(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a clock that moves 1 ms a reading, one drain emits about SLICE_S worth of events and hands the rest
    to the event loop; all arrive, in order, with a timer running between slices."""
    import app.bridge as bridge_module

    clock = itertools.count(0.0, 0.001)
    monkeypatch.setattr(bridge_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    bridge = bridge_module.EngineBridge(lambda on_event: None)  # type: ignore[arg-type, return-value]
    got: list[object] = []
    bridge.event.connect(got.append)
    feeder = threading.Thread(target=lambda: [bridge._on_backend_event(i) for i in range(300)])
    feeder.start()
    feeder.join()  # 300 events queued from another thread, one wake-up on its way
    bridge._drain()
    first_slice = len(got)
    assert 1 <= first_slice <= bridge_module.SLICE_S / 0.001 + 2, first_slice
    ticks: list[int] = []
    timer = QTimer()
    timer.setInterval(0)
    timer.timeout.connect(lambda: ticks.append(len(got)))
    timer.start()
    qtbot.waitUntil(lambda: len(got) == 300)
    timer.stop()
    assert got == list(range(300)), "every event, in order"
    assert any(first_slice <= n < 300 for n in ticks), "the timer ran while events were still queued"
    bridge.shutdown()
