"""A chat that outgrows the context: its policy (drop the middle, or stop and say so), on the tiny model."""

from __future__ import annotations

from typing import Any

import pytest

from engine.runtime.prompt import ContextOverflow, build_prompt, prompt_budget, render
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.tiny import make_tokenizer

SYSTEM = {"role": "system", "content": "You answer in one short line about the weather and the sea."}


def chat(turns: int, repeat: int = 2) -> list[dict[str, str]]:
    """The system prompt, then ``turns`` user and assistant messages (a user message last when odd)."""
    out = [SYSTEM]
    for n in range(1, turns + 1):
        role = "user" if n % 2 else "assistant"
        out.append({"role": role, "content": f"message {n}: " + "the tide comes in and goes out. " * repeat})
    return out


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def test_drop_middle_keeps_the_system_prompt_and_the_newest_turns(tokenizer: Any) -> None:
    messages = chat(21)
    context, max_tokens = 512, 64
    assert len(render(tokenizer, messages)) > prompt_budget(context, max_tokens), "the chat must overflow"
    prompt = build_prompt(tokenizer, messages, context, max_tokens)
    first, last = prompt.dropped
    assert prompt.truncated and first == 1 and 1 < last < 20
    kept = [SYSTEM, *messages[1 + last :]]
    assert kept[1]["role"] == "user", "a cut starts at a user turn"
    assert prompt.ids == render(tokenizer, kept), "the kept prompt is the kept messages' own tokens"
    assert len(prompt.ids) <= prompt_budget(context, max_tokens)
    assert prompt.ids[: prompt.system_tokens] == render(tokenizer, [SYSTEM], add_generation_prompt=False)


def test_a_growing_chat_keeps_its_cut_until_the_rest_no_longer_fits(tokenizer: Any) -> None:
    """The cuts are stable: the next turns go on from the same kept prompt (its cache stays valid)."""
    context, max_tokens = 512, 64
    cuts = [build_prompt(tokenizer, chat(n, repeat=0), context, max_tokens).dropped for n in range(15, 61, 2)]
    cuts = [c for c in cuts if c]
    assert len(cuts) > 4
    repeats = sum(a == b for a, b in zip(cuts, cuts[1:], strict=False))
    assert repeats >= len(cuts) // 2, f"the cut moved at almost every turn: {cuts}"
    assert cuts == sorted(cuts), "a cut never moves back"


def test_a_chat_that_fits_drops_nothing(tokenizer: Any) -> None:
    prompt = build_prompt(tokenizer, chat(3), 4096, 64)
    assert not prompt.truncated and prompt.dropped == ()
    assert build_prompt(tokenizer, chat(3), 4096, 64, overflow="stop").ids == prompt.ids


def test_stop_refuses_and_says_how_far_over_and_what_to_do(tokenizer: Any) -> None:
    messages = chat(21)
    over = len(render(tokenizer, messages)) - prompt_budget(512, 64)
    with pytest.raises(ContextOverflow) as caught:
        build_prompt(tokenizer, messages, 512, 64, overflow="stop")
    text = str(caught.value)
    assert f"{over:,} over" in text
    for advice in ("Branch", "last turns", "larger context", "drop its middle"):
        assert advice in text


def test_an_unknown_policy_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="overflow policy"):
        build_prompt(tokenizer, chat(3), 4096, 64, overflow="shrug")


def test_the_engine_reports_the_dropped_turns_and_keeps_greedy_tokens(tiny_engine: EngineRunner) -> None:
    """A reply after a truncation: Done's metrics name the turns dropped, and its greedy tokens are those of
    the kept messages sent on their own."""
    from engine.api import Sampling

    messages = chat(41)
    greedy = Sampling(max_tokens=6, temperature=0.0)
    events = tiny_engine.run(messages, sampling=greedy, conversation_id="long-chat")
    metrics = done(events).metrics
    assert metrics.truncated and metrics.dropped[0] == 1
    kept = [SYSTEM, *messages[1 + metrics.dropped[1] :]]
    alone = tiny_engine.run(kept, sampling=greedy)
    assert not done(alone).metrics.truncated
    assert token_ids(events) == token_ids(alone)


def test_the_engine_refuses_a_stop_chat_with_the_message(tiny_engine: EngineRunner) -> None:
    from engine.api import Error, Sampling

    events = tiny_engine.run(chat(41), sampling=Sampling(max_tokens=4), overflow="stop")
    error = events[-1]
    assert isinstance(error, Error) and "no longer fits the model's context" in error.message


def test_a_draft_in_a_chat_past_the_context_is_prefilled_with_its_kept_turns(tokenizer: Any) -> None:
    """Prefill while typing works after a truncation: the kept turns are stable while the draft is typed, so
    the first reply after the truncation starts from them, not from the system prompt alone."""
    from engine.runtime.hints import hint_tokens, stable_prefix

    def prompt_of(messages: list[dict[str, Any]]) -> Any:
        return build_prompt(tokenizer, messages, 512, 64)

    messages = [*chat(40, repeat=0), {"role": "user", "content": "And the moon"}]
    sent = prompt_of(messages)
    assert sent.truncated
    assert hint_tokens(prompt_of, messages) == sent.ids
    assert len(stable_prefix(prompt_of, messages)) > sent.system_tokens + 100, "the kept turns are stable too"


def test_attached_documents_stay_when_the_middle_turns_go(tiny_dir: Any, brisk_data_dir: Any) -> None:
    """A chat past its context keeps its attached document whole: the middle turns give way to it."""
    from engine.api import Sampling
    from tests.engine.runtime.test_prompt_documents import NOTE, FakeIndex, engine_on

    index = FakeIndex()
    doc = index.add("rules.md", NOTE)
    with engine_on(tiny_dir, index) as engine:
        events = engine.run(chat(41), sampling=Sampling(max_tokens=4), answer_cache=False, documents=(doc,))
        metrics = done(events).metrics
    assert metrics.truncated and metrics.dropped[0] == 1
    assert metrics.document_tokens >= len(NOTE), "the document is in the prompt, whole"
    assert [s["name"] for s in metrics.sources] == ["rules.md"]
