"""The engine's public types: the loop test behind ``Sampling.stop_repeats`` and its checked values."""

from __future__ import annotations

import pytest

from engine.api import Sampling, repeats


def test_repeats_finds_a_block_said_three_times_in_a_row_and_nothing_less() -> None:
    story = list(range(100, 140))
    assert not repeats(story, 3)
    assert repeats([*story, 1, 2, 3, 4] * 1 + [1, 2, 3, 4] * 2, 3), "a 4-token block three times"
    assert not repeats([*story, 1, 2, 3, 4, 1, 2, 3, 4], 3), "twice is not a loop"
    assert repeats([*story, *([7] * 12)], 3), "one token over and over: caught after 12"
    assert not repeats([*story, *([7] * 11)], 3)
    sentence = list(range(60))  # a 60-token line three times: still a block it looks for
    assert repeats([*story, *sentence, *sentence, *sentence], 3)
    assert not repeats([*story, 1, 2, 3, 1, 2, 3, 1, 2, 3], 3), "blocks under 4 tokens (a list's '1. 2. 3.') pass"


@pytest.mark.parametrize("value", [-1, 1, 2.5, True])
def test_stop_repeats_must_be_off_or_two_or_more(value: object) -> None:
    problems = Sampling(stop_repeats=value).problems()  # type: ignore[arg-type]
    assert problems and problems[0].startswith("stop_repeats must be 0 (off)"), problems
