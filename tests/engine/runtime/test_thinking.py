"""Thinking models: ``<think>...</think>`` split from the answer as it streams, its own tokens and time, the
template's ``enable_thinking`` switch, and later turns' prompts without the earlier thinking.

The replies are scripted on the tiny random model with a regex format (the grammar writes exactly the text a
thinking model would), so every event goes through the real engine."""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.api import Done, Request, Sampling, Started, Thinking, Token, reply_format
from engine.model.template import render_chat, takes_thinking_switch, template_switches, thinking_switches
from engine.runtime.prompt import render
from engine.runtime.thinking import ThinkingSplit, prompt_opens_thinking
from tests.support.engine_runner import EngineRunner, done
from tests.support.tiny import make_tiny_model

# Qwen3's shape: earlier replies keep only what follows </think>; enable_thinking=false writes an empty thinking
QWEN3_LIKE = (
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)
# DeepSeek-R1's distills: the generation prompt opens the thinking, the reply starts inside it
OPENED = QWEN3_LIKE.split("{% if enable_thinking")[0] + "{{ '<think>\\n' }}{% endif %}"
THOUGHT = "<think>\nI ponder.\n</think>\n\nParis."
ASK = [{"role": "user", "content": "Capital of France?"}]


def folder(path: Path, template: str) -> Path:
    make_tiny_model(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    runner = EngineRunner(str(folder(tmp_path_factory.mktemp("qwen3-like"), QWEN3_LIKE)))
    yield runner
    runner.close()


def scripted(text: str, **kwargs: object) -> dict[str, object]:
    """Request arguments for a reply that writes exactly ``text``."""
    sampling = Sampling(max_tokens=100, format=reply_format("regex", re.escape(text)))
    return {"sampling": sampling, "answer_cache": False, "speculative": "off", **kwargs}


def run_split(text: str, cuts: list[int], opened: bool = False) -> tuple[str, str]:
    split, thinking, answer = ThinkingSplit(opened), "", ""
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        a, b = split.add(text[start:end])
        thinking, answer = thinking + a, answer + b
    a, b = split.flush()
    assert (thinking + a, answer + b) == (split.thinking, split.answer)
    return split.thinking, split.answer


def test_the_split_holds_wherever_the_tags_are_cut() -> None:
    rng = random.Random(7)
    cases = [
        (THOUGHT, False, ("I ponder.", "Paris.")),
        ("\n<think>two\nlines\n</think>\nA </think> <think>", False, ("two\nlines", "A </think> <think>")),
        ("\nI ponder.\n</think>\n\nParis.", True, ("I ponder.", "Paris.")),  # the prompt opened it
        ("<think>\ncut off before its end", False, ("cut off before its end", "")),
    ]
    for text, opened, expected in cases:
        for _ in range(150):
            cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(12, len(text) - 1))))
            assert run_split(text, cuts, opened) == expected, (text, cuts)
        assert run_split(text, list(range(1, len(text))), opened) == expected  # a character a token


def test_a_reply_without_thinking_passes_through_exactly() -> None:
    for text in ["Hello <think> there", "  <thing>", "<thi", " \n", "", "</think> x"]:
        for cuts in ([], list(range(1, len(text)))):
            assert run_split(text, cuts) == ("", text)
    off = ThinkingSplit(enabled=False)  # a raw prompt's completion: all text
    assert off.add(THOUGHT) == ("", THOUGHT) and off.flush() == ("", "")


def test_a_template_switch_is_found_and_passed_when_rendering(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(folder(tmp_path, QWEN3_LIKE))
    assert takes_thinking_switch(tokenizer)
    assert thinking_switches(tokenizer, "auto") == {}
    assert thinking_switches(tokenizer, "off") == {"enable_thinking": False}
    assert render_chat(tokenizer, ASK).endswith("assistant\n")
    with template_switches(thinking_switches(tokenizer, "off")):
        assert render_chat(tokenizer, ASK).endswith("assistant\n<think>\n\n</think>\n\n")
        assert not prompt_opens_thinking(tokenizer, render(tokenizer, ASK))
    assert render_chat(tokenizer, ASK).endswith("assistant\n")  # only inside the with
    tokenizer.chat_template = OPENED
    assert not takes_thinking_switch(tokenizer) and thinking_switches(tokenizer, "off") == {}
    assert prompt_opens_thinking(tokenizer, render(tokenizer, ASK))


def test_a_thinking_reply_streams_its_thinking_apart_with_its_own_clock(thinker: EngineRunner) -> None:
    assert thinker.load_event.info.thinking_switch is True  # type: ignore[union-attr]
    events = thinker.run(ASK, **scripted(THOUGHT, prefix_cache=False))
    end = done(events)
    assert end.text == "Paris." and end.thinking == "I ponder."
    assert "".join(e.text for e in events if isinstance(e, Thinking)) == "I ponder."
    assert "".join(e.text for e in events if isinstance(e, Token)) == "Paris."
    m = end.metrics
    assert m.thinking_tokens == len("<think>\nI ponder.\n</think>")  # a byte a token
    assert m.completion_tokens == len(THOUGHT)
    assert m.ttft_s is not None and m.thinking_s is not None and m.answer_ttft_s is not None
    assert m.answer_ttft_s >= m.ttft_s + m.thinking_s
    first_answer = next(e for e in events if isinstance(e, Token))
    assert m.answer_ttft_s <= first_answer.t
    names = [s.name for s in m.spans]
    assert names.index("first token") < names.index("thinking") < names.index("decode")
    bar = next(s for s in m.spans if s.name == "thinking")
    assert bar.start_s == m.ttft_s and bar.seconds == pytest.approx(m.thinking_s)
    # a reply without thinking has none of these numbers
    plain = done(thinker.run(ASK, **scripted("Paris.", prefix_cache=False)))
    assert plain.thinking == "" and plain.metrics.thinking_tokens == 0 and plain.metrics.thinking_s is None
    assert "thinking" not in [s.name for s in plain.metrics.spans]


def test_the_chats_switch_renders_the_template_off_or_on(thinker: EngineRunner) -> None:
    def prompt_tokens(choice: str) -> int:
        events = thinker.run(ASK, **scripted("Paris.", prefix_cache=False, thinking=choice))
        return next(e for e in events if isinstance(e, Started)).prompt_tokens

    auto = prompt_tokens("auto")
    assert prompt_tokens("on") == auto
    assert prompt_tokens("off") == auto + len("<think>\n\n</think>\n\n")


def test_a_reply_that_starts_inside_its_thinking(tmp_path: Path) -> None:
    runner = EngineRunner(str(folder(tmp_path, OPENED)))
    try:
        assert runner.load_event.info.thinking_switch is False  # type: ignore[union-attr]
        end = done(runner.run(ASK, **scripted("I ponder.\n</think>\n\nParis.", prefix_cache=False)))
        assert (end.thinking, end.text) == ("I ponder.", "Paris.")
        assert end.metrics.thinking_tokens == len("I ponder.\n</think>")
    finally:
        runner.close()


def test_the_next_turn_leaves_the_thinking_out_and_reuses_only_what_it_renders(thinker: EngineRunner) -> None:
    first = thinker.run(ASK, **scripted(THOUGHT, conversation_id="c-think"))
    prompt1 = next(e for e in first if isinstance(e, Started)).prompt_tokens
    assert done(first).text == "Paris."  # what the history keeps: the answer alone
    history = [*ASK, {"role": "assistant", "content": done(first).text}, {"role": "user", "content": "And Italy?"}]
    tokenizer = thinker.engine.serving.res.loaded.tokenizer  # type: ignore[attr-defined]
    assert "<think>" not in render_chat(tokenizer, history)
    greedy = {"sampling": Sampling(max_tokens=8), "answer_cache": False, "speculative": "off"}
    warm = thinker.run(history, conversation_id="c-think", **greedy)
    cold = thinker.run(history, prefix_cache=False, **greedy)
    # the kept KV holds the thinking after the first prompt: only the first prompt is reused, never the thinking
    assert done(warm).metrics.cached_tokens == prompt1
    assert done(warm).metrics.prompt_tokens == len(render(tokenizer, history))

    def ids(events: list[object]) -> list[int]:
        return [i for e in events if isinstance(e, Token | Thinking) for i in e.ids]

    assert ids(warm) == ids(cold) and done(warm).text == done(cold).text  # greedy output unchanged


def test_a_draft_typed_is_prefilled_with_the_chats_switch(thinker: EngineRunner) -> None:
    """The prefill while typing renders like its Send: with the switch, and never taken for another choice."""
    engine = thinker.engine

    def hinted_send(hint_choice: str, send_choice: str, conversation: str) -> Done:
        args = scripted("Paris.", conversation_id=conversation)
        draft = Request(uuid.uuid4().hex, tuple(ASK), args["sampling"], conversation, thinking=hint_choice)  # type: ignore[arg-type]
        engine.hint(draft)  # type: ignore[attr-defined]
        reached = threading.Event()
        engine.call(lambda _engine: reached.set())  # type: ignore[attr-defined]  # queued after the hint
        assert reached.wait(60)
        began = time.monotonic()
        while engine.hints.pending():  # type: ignore[attr-defined]
            assert time.monotonic() - began < 60, "the hint did not finish"
            time.sleep(0.01)
        return done(thinker.run(ASK, **args, thinking=send_choice))

    auto = done(thinker.run(ASK, **scripted("Paris.", prefix_cache=False))).metrics.prompt_tokens
    off = hinted_send("off", "off", "typed-off")
    assert off.metrics.prompt_tokens == auto + len("<think>\n\n</think>\n\n") and off.metrics.typed_tokens > 0
    other = hinted_send("auto", "off", "typed-auto")  # a draft rendered without the switch is not this prompt
    assert other.metrics.prompt_tokens == off.metrics.prompt_tokens


def test_a_done_event_carries_the_thinking_in_json() -> None:
    assert Done("r", 1.0, "Paris.", thinking="I ponder.").to_json()["thinking"] == "I ponder."
    assert Thinking("r", 0.5, "I", (7,)).to_json()["type"] == "thinking"
