"""The decode layers on their own: token steps (engine.runtime.steps) and text (engine.runtime.detokenize)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine.runtime.steps as steps_module
from engine.api import Sampling
from engine.model.kv import KVState
from engine.runtime.detokenize import StreamText
from engine.runtime.speculative import Controller, PromptLookup
from engine.runtime.steps import PREFILL_CHUNK, Prefilled, Step, generate_steps
from tests.support.tiny import make_tokenizer


@pytest.fixture(scope="module")
def model(tiny_dir: Path):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def steps(model, prompt: list[int], **kwargs):  # noqa: ANN001, ANN201
    return generate_steps(
        model,
        KVState(),
        prompt,
        kwargs.pop("params", Sampling(max_tokens=64)),
        generator=torch.Generator().manual_seed(0),
        controller=kwargs.pop("controller", Controller()),
        **kwargs,
    )


def test_prefill_in_chunks_then_one_token_per_plain_step(model) -> None:  # noqa: ANN001
    prompt = [3 + i % 200 for i in range(PREFILL_CHUNK + 10)]
    it = steps(model, prompt)
    chunks = [next(it), next(it)]
    assert all(isinstance(c, Prefilled) and c.total == len(prompt) and c.seconds > 0 for c in chunks)
    assert [c.done for c in chunks] == [PREFILL_CHUNK, len(prompt)]
    for _ in range(3):
        step = next(it)
        assert isinstance(step, Step) and len(step.ids) == 1 and step.source is None and step.seconds > 0
        assert list(step.provenance()) == [(step.ids[0], None)]


def test_nothing_runs_after_the_consumer_stops(model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    calls = []
    real = steps_module.forward
    monkeypatch.setattr(steps_module, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    it = steps(model, [5, 6, 7])
    next(it), next(it)  # prefill, first token: one forward
    it.close()
    assert len(calls) == 1


def test_steps_end_when_the_context_is_full(model) -> None:  # noqa: ANN001
    state = KVState()
    prompt = [5, 6, 7, 8, 9, 10]
    it = generate_steps(
        model, state, prompt, Sampling(max_tokens=100), generator=torch.Generator(), controller=Controller(), context=16
    )
    tokens = [i for item in it if isinstance(item, Step) for i in item.ids]
    assert len(prompt) + len(tokens) == 16
    assert len(state) == 15  # the last token is never fed: the model holds at most 16 positions


def take(items, n: int) -> list[Step]:  # noqa: ANN001
    """The decode steps that give the first ``n`` tokens (the steps run until the context is full)."""
    out: list[Step] = []
    for item in items:
        if isinstance(item, Step):
            out.append(item)
            if sum(len(s.ids) for s in out) >= n:
                items.close()
                return out
    return out


def test_speculative_steps_carry_their_source_and_match_plain_ones(model) -> None:  # noqa: ANN001
    prompt = [5, 6, 7, 8] * 12
    plain = [i for s in take(steps(model, prompt), 40) for i in s.ids]
    controller = Controller()
    controller.record_plain(1.0)  # a slow plain step, so drafting always pays
    spec = take(steps(model, prompt, controller=controller, drafters=[PromptLookup()]), 40)
    assert [i for s in spec for i in s.ids][:40] == plain[:40]
    drafted = [s for s in spec if s.source == "lookup"]
    assert drafted and all(s.drafted >= s.accepted for s in drafted)
    assert [src for s in drafted for _, src in s.provenance()].count("lookup") == sum(s.accepted for s in drafted)


def test_stream_text_holds_back_what_may_change() -> None:
    tok = make_tokenizer()

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    text = StreamText(tok, stop=("END",))
    assert text.add(ids("ab")) == "", "the last two characters may start a stop string"
    assert text.add(ids("E")) == "a"
    assert text.add(ids("ND tail")) == "b" and text.stopped and text.text == "ab"
    assert text.flush() == ""
    euro = StreamText(tok)
    first, *rest = ids("€")
    assert rest, "a byte-level tokenizer splits a multi-byte character"
    assert euro.add([first]) == "", "an incomplete UTF-8 character is not shown"
    assert euro.add(rest) == "€"


def _stream_matches_full_decode(tok: Any, ids: list[int], chunks: list[int]) -> StreamText:
    """Feed ``ids`` in pieces of the given sizes; after each, ``text`` must be the decode of everything so far."""
    stream = StreamText(tok)
    stream.next_try = 6  # checkpoints early and often
    out, i, k = "", 0, 0
    while i < len(ids):
        piece = ids[i : i + chunks[k % len(chunks)]]
        i, k = i + len(piece), k + 1
        out += stream.add(piece)
        assert stream.text == tok.decode(ids[:i], skip_special_tokens=True)
    assert out + stream.flush() == tok.decode(ids, skip_special_tokens=True)
    return stream


@pytest.mark.parametrize("which", ["tiny", "bundled"])
def test_stream_text_decodes_incrementally_and_equals_a_full_decode(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from engine.runtime import detokenize

    if which == "tiny":
        tok = make_tokenizer()
    else:
        from engine.api import ModelSpec
        from engine.model.loader import load_model

        tok = load_model(ModelSpec(dtype="float32", device="cpu")).tokenizer
    monkeypatch.setattr(detokenize, "CHECKPOINT", 5)
    monkeypatch.setattr(detokenize, "WINDOW", 3)
    text = (
        "Café crème, naïve façade — 東京 and 😀🎉 emoji; code: `def f(x): return x ** 2`  \n\n"
        "Spaces  , before . punctuation ! and 'quotes' don't change. Ünïcödé ½ ∑ → done."
    ) * 3
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream = _stream_matches_full_decode(tok, ids, [1, 1, 2, 1, 3])
    assert stream.settled_ids > 0, "checkpoints were taken: later tokens decode only the text after them"
    rng = random.Random(7)
    vocab = len(tok)
    for _ in range(3):  # arbitrary ids, incomplete characters and special tokens among them
        noise = [rng.randrange(vocab) for _ in range(120)]
        _stream_matches_full_decode(tok, noise, [1, 2, 1, 4])


def test_stream_text_without_checkpoints_for_a_tokenizer_that_a_split_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.runtime import detokenize

    class FirstCharacterDropped:  # as sentencepiece drops a leading space, whatever comes first here
        def __init__(self, tok: Any) -> None:
            self.tok = tok

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return str(self.tok.decode(ids, skip_special_tokens=skip_special_tokens))[1:]

    monkeypatch.setattr(detokenize, "CHECKPOINT", 4)
    tok = FirstCharacterDropped(make_tokenizer())
    ids = make_tokenizer()(" one two three four five six seven eight nine ten" * 4, add_special_tokens=False)[
        "input_ids"
    ]
    stream = _stream_matches_full_decode(tok, ids, [1])
    assert stream.settled_ids == 0 and stream.failures == detokenize.GIVE_UP
