"""Prefill while typing (issue 26): a draft hinted before Send is prefilled while the engine is idle, the
Send reuses it, and the reply is the same token for token."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from engine.api import DraftPrefill, Request, Sampling
from engine.model.kv import common_prefix
from engine.runtime.hints import HINT_CHUNK, hint_tokens, stable_prefix
from engine.runtime.prefix_cache import HINT
from tests.support.engine_runner import EngineRunner, done, settle_hints, token_ids

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 2}
# about 300 tokens for the tiny model's byte-level tokenizer: the prompt fits its 512-token context
LONG = " ".join(f"Line {i}: the shipment of {i * 3} crates left the dock at {i % 12 + 1} o'clock." for i in range(5))


@pytest.fixture
def runner(tiny_dir: Path):  # noqa: ANN201
    engine = EngineRunner(str(tiny_dir))
    yield engine
    engine.close()


def hint(runner: EngineRunner, conversation: str, messages: list[dict[str, str]]) -> None:
    request = Request(uuid.uuid4().hex, tuple(messages), Sampling(max_tokens=24), conversation_id=conversation)
    runner.engine.hint(request)  # type: ignore[attr-defined]


def send(runner: EngineRunner, conversation: str, messages: list[dict[str, str]]) -> list[object]:
    return runner.run(messages, sampling=Sampling(max_tokens=24), conversation_id=conversation, answer_cache=False)


def test_a_hinted_draft_is_reused_and_the_reply_is_the_same(runner: EngineRunner) -> None:
    messages = [SYSTEM, {"role": "user", "content": LONG}]
    plain = send(runner, "plain", messages)  # the switch off: no hint for this conversation
    runner.engine.clear_prefix_cache()  # type: ignore[attr-defined]  # so what the Send reuses is the hint's
    seen: list[object] = []
    runner.client.events.queue.clear()
    # typing: a first part, then the whole text (an edit that only adds)
    hint(runner, "typed", [SYSTEM, {"role": "user", "content": LONG[:200]}])
    hint(runner, "typed", messages)
    settle_hints(runner)
    while not runner.client.events.empty():
        seen.append(runner.client.events.get_nowait())
    progress = [e for e in seen if isinstance(e, DraftPrefill)]
    assert progress and progress[-1].conversation_id == "typed" and progress[-1].ready == progress[-1].total
    hinted = send(runner, "typed", messages)
    assert token_ids(hinted) == token_ids(plain)
    m = done(hinted).metrics
    assert m.typed_tokens >= progress[-1].total - HINT_CHUNK and m.typed_tokens > 0
    assert m.computed_tokens <= m.prompt_tokens - m.typed_tokens
    assert m.computed_tokens == 0  # the whole prompt was prefilled and its last logits kept: the text was finished
    assert not any(key.startswith(HINT) for key in runner.engine.prefix_cache.entries)  # type: ignore[attr-defined]


def test_an_edit_in_the_middle_keeps_only_what_is_still_true(runner: EngineRunner) -> None:
    first = [SYSTEM, {"role": "user", "content": LONG}]
    edited_text = LONG[:150] + " (changed here) " + LONG[150:]
    edited = [SYSTEM, {"role": "user", "content": edited_text}]
    plain = send(runner, "plain", edited)
    runner.engine.clear_prefix_cache()  # type: ignore[attr-defined]
    hint(runner, "typed", first)
    settle_hints(runner)
    hint(runner, "typed", edited)  # the stale part after the edit is dropped, the rest prefilled again
    settle_hints(runner)
    entry = runner.engine.prefix_cache.entries[HINT + "conv:typed"]  # type: ignore[attr-defined]
    tokenizer = runner.engine.loaded.tokenizer  # type: ignore[attr-defined]
    assert edited_text[:40] in tokenizer.decode(entry.tokens) and "(changed here)" in tokenizer.decode(entry.tokens)
    hinted = send(runner, "typed", edited)
    assert token_ids(hinted) == token_ids(plain) and done(hinted).metrics.typed_tokens > 0


def test_a_send_during_a_hint_is_served_first_and_the_same(runner: EngineRunner) -> None:
    long = [SYSTEM, {"role": "user", "content": LONG}]
    short = [{"role": "user", "content": "Hello there"}]
    plain = send(runner, "other", short)
    hint(runner, "typed", long)
    time.sleep(0.05)  # the hint has begun
    began = time.monotonic()
    events = send(runner, "other-2", short)  # another chat's Send while the hint runs
    assert token_ids(events) == token_ids(plain)
    assert time.monotonic() - began < 30
    assert done(events).metrics.queue_s < 1.0  # it waited for one chunk of the hint at most
    settle_hints(runner)  # the draft in the other chat keeps its prefill and finishes it afterwards
    assert HINT + "conv:typed" in runner.engine.prefix_cache.entries  # type: ignore[attr-defined]


def test_emptying_the_draft_drops_its_prefill(runner: EngineRunner) -> None:
    hint(runner, "typed", [SYSTEM, {"role": "user", "content": LONG}])
    settle_hints(runner)
    assert HINT + "conv:typed" in runner.engine.prefix_cache.entries  # type: ignore[attr-defined]
    hint(runner, "typed", [SYSTEM, {"role": "user", "content": ""}])
    settle_hints(runner)
    assert HINT + "conv:typed" not in runner.engine.prefix_cache.entries  # type: ignore[attr-defined]


def test_the_stable_prefix_holds_back_what_a_keystroke_changes(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    from engine.runtime.prompt import Prompt, build_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)

    def render(messages: list[dict[str, str]]) -> Prompt:
        return build_prompt(tokenizer, messages, 4096, 64)

    messages = [{"role": "user", "content": "The quick brown fox"}]
    stable = stable_prefix(render, messages)
    full = render(messages).ids
    assert 0 < len(stable) < len(full)
    for more in (" jumps", "es", "!", "\n\nNew paragraph"):
        longer = render([{"role": "user", "content": "The quick brown fox" + more}]).ids
        assert longer[: len(stable)] == stable, more  # whatever is typed next, the prefilled part stays true
    too_long = [{"role": "user", "content": "word " * 2000}]  # older text would be dropped at Send
    assert stable_prefix(render, too_long) == []
    # a hint prefills the stable part, then the rest to the prompt's end, guessing the text is finished
    assert hint_tokens(render, messages) == full and full[: len(stable)] == stable
    assert hint_tokens(render, too_long) == []


def finished_guess(runner: EngineRunner, typed_on: str) -> tuple[list[dict[str, str]], list[object]]:
    """(the messages with ``typed_on`` after LONG, their reply with no hint); then LONG hinted to its end,
    the guess that the text is finished, as a pause in typing leaves it."""
    more = [SYSTEM, {"role": "user", "content": LONG + typed_on}]
    plain = send(runner, "plain", more)
    runner.engine.clear_prefix_cache()  # type: ignore[attr-defined]
    hint(runner, "typed", [SYSTEM, {"role": "user", "content": LONG}])
    settle_hints(runner)
    return more, plain


def test_typing_on_after_a_finished_guess_crops_it_and_the_reply_is_the_same(runner: EngineRunner) -> None:
    """A pause prefills the draft to its end (the guess that it is finished); typing on changes the end, so
    the guess is cropped back to what is still true and the new end prefilled: the Send runs no model step
    and replies as without hints."""
    more, plain = finished_guess(runner, " Please list the crates")
    guessed = runner.engine.prefix_cache.entries[HINT + "conv:typed"].tokens  # type: ignore[attr-defined]
    hint(runner, "typed", more)
    settle_hints(runner)
    entry = runner.engine.prefix_cache.entries[HINT + "conv:typed"]  # type: ignore[attr-defined]
    shared = common_prefix(entry.tokens, guessed)
    assert len(guessed) - 20 < shared < len(guessed) < len(entry.tokens)  # the guessed end was cropped, not more
    hinted = send(runner, "typed", more)
    assert token_ids(hinted) == token_ids(plain)
    assert done(hinted).metrics.computed_tokens == 0


def test_a_keystroke_that_shortens_the_stable_part_keeps_the_rest_reusable(runner: EngineRunner) -> None:
    """Typing on can make the stable part end one token earlier (a next character merges with the last one);
    what is still true stays in the cache although nothing is left to prefill."""
    text = LONG + " And then"
    hint(runner, "typed", [SYSTEM, {"role": "user", "content": text}])
    settle_hints(runner)
    full = runner.engine.prefix_cache.entries[HINT + "conv:typed"].tokens  # type: ignore[attr-defined]
    runner.engine.hints.start(  # type: ignore[attr-defined]
        runner.engine.prefix_cache,
        "conv:typed",
        full[:-2],  # type: ignore[attr-defined]
    )
    entry = runner.engine.prefix_cache.entries.get(HINT + "conv:typed")  # type: ignore[attr-defined]
    assert entry is not None and entry.tokens == full[:-2]
    assert not runner.engine.hints.pending()  # type: ignore[attr-defined]


def test_a_draft_moved_to_another_chat_leaves_nothing_stale(runner: EngineRunner) -> None:
    hint(runner, "first", [SYSTEM, {"role": "user", "content": LONG}])
    settle_hints(runner)
    assert HINT + "conv:first" in runner.engine.prefix_cache.entries  # type: ignore[attr-defined]
    hint(runner, "second", [SYSTEM, {"role": "user", "content": LONG + " More."}])  # the draft, in another chat
    settle_hints(runner)
    entries = runner.engine.prefix_cache.entries  # type: ignore[attr-defined]
    assert HINT + "conv:first" not in entries and HINT + "conv:second" in entries
    hint(runner, "third", [{"role": "user", "content": ""}])  # a chat opened with the composer emptied
    settle_hints(runner)
    assert not any(key.startswith(HINT) for key in runner.engine.prefix_cache.entries)  # type: ignore[attr-defined]
    assert runner.engine.hints.job is None  # type: ignore[attr-defined]


def test_a_send_of_other_text_than_the_finished_guess_computes_its_end(runner: EngineRunner) -> None:
    """The guess's kept logits belong to its exact prompt: a Send whose text went on after the last hint
    (typed faster than a pause) reuses what is still true and computes the rest, replying as without hints."""
    more, plain = finished_guess(runner, " Thanks")
    assert runner.engine.prefix_cache.entries[HINT + "conv:typed"].logits is not None  # type: ignore[attr-defined]
    hinted = send(runner, "typed", more)
    assert token_ids(hinted) == token_ids(plain)
    m = done(hinted).metrics
    assert 0 < m.computed_tokens <= 30 and m.typed_tokens > 0  # " Thanks" and the end markers, in bytes


def test_a_chunk_is_as_many_tokens_as_fit_its_time_at_the_last_steps_pace() -> None:
    from engine.runtime import hints as hints_module

    hints = hints_module.Hints()
    assert hints.chunk() == hints_module.FIRST_CHUNK  # no step timed yet: a small first one
    hints.token_s = hints_module.CHUNK_S / 20  # 20 tokens fit the time
    assert hints.chunk() == 20
    hints.token_s = 1.0  # a step this slow still prefills something
    assert hints.chunk() == hints_module.MIN_CHUNK
    hints.token_s = 1e-9
    assert hints.chunk() == hints_module.HINT_CHUNK


def test_a_long_drafts_prompt_is_rendered_once_a_hint(tiny_dir: Path) -> None:
    """The probes decide only whether anything is stable: a long draft has, so its hint renders no probe."""
    from transformers import AutoTokenizer

    from engine.runtime.prompt import Prompt, build_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    rendered: list[str] = []

    def render(messages: list[dict[str, str]]) -> Prompt:
        rendered.append(messages[-1]["content"])
        return build_prompt(tokenizer, messages, 4096, 64)

    messages = [{"role": "user", "content": LONG}]
    assert hint_tokens(render, messages) == build_prompt(tokenizer, messages, 4096, 64).ids
    assert rendered == [LONG]
