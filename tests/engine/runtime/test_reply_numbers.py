"""The numbers a reply states about itself: per-token times and the speed-up against plain decoding."""

from __future__ import annotations

import pytest

from engine.runtime.reply_metrics import per_token_times
from engine.runtime.speculative import Controller
from engine.runtime.speculative.controller import PLAIN_MIN


def test_tokens_accepted_together_share_their_steps_time() -> None:
    # the first token (TTFT), then a plain step of 10 ms, then a verification of 30 ms that gave 3 tokens
    steps = [[0.100], [0.110], [0.140, 0.140, 0.140]]
    assert per_token_times(steps) == pytest.approx([0.010, 0.010, 0.010, 0.010])
    assert 0.0 not in per_token_times(steps), "no 0.0 ms gaps between tokens that arrived together"
    assert per_token_times([[0.1], [], [0.12]]) == pytest.approx([0.02]), "a step that gave no token is skipped"


def test_the_speedup_reference_waits_for_enough_plain_steps_and_ignores_a_slow_first_one() -> None:
    controller = Controller()
    controller.record_plain(0.176)  # a new model's first step
    for _ in range(PLAIN_MIN - 2):
        controller.record_plain(0.0147)
    assert controller.plain_step_reference() is None, "too few steps to state a speed-up against"
    controller.record_plain(0.0147)
    assert controller.plain_step_reference() == pytest.approx(0.0147), "the median, not the slow first step"
    assert controller.plain_step_s is not None and controller.plain_step_s > 0.02, "(the EMA still remembers it)"
