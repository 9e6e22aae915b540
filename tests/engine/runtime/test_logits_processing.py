"""OpenAI's logits processing (``logit_bias``, presence and frequency penalties), logprobs and seeded draws.

The rules are checked on fixed logits, where each assertion names the exact number; the decode loop on a
scripted model whose logits depend on the tokens before (so a wrong draft is caught); and the whole engine
on the tiny model, where drafting must leave a greedy or seeded reply token for token as it was.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.answer_cache.keys import context_hash, sampling_dict
from engine.api import Sampling
from engine.runtime import sampling, steps
from engine.runtime.speculative import AnswerDrafts, Controller, verify
from engine.runtime.steps import Step, generate_steps
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.scripted_state import ScriptedState

VOCAB = 32
DOC = (
    "The keeper climbed the stairs at dusk, lit the lamp, wound the clockwork that turned the lens, "
    "and wrote the weather in the log: wind from the west, sea calm, visibility good."
)
QUOTE = [{"role": "user", "content": f"Repeat this text exactly: {DOC}"}]


def test_bias_and_openai_penalties_follow_openais_formula() -> None:
    row = torch.zeros(VOCAB)
    row[3], row[4], row[5] = 1.0, 2.0, 3.0
    params = Sampling(logit_bias=((3, 5.0), (5, -100.0)), presence_penalty=0.5, frequency_penalty=0.25)
    got = sampling.processed(row, params, [4, 4, 4, 3])
    # 3: 1 + 5 - 0.25 * 1 - 0.5 = 5.25; 4: 2 - 0.25 * 3 - 0.5 = 0.75; 5: 3 - 100; every other id untouched
    assert got[3].item() == pytest.approx(5.25) and got[4].item() == pytest.approx(0.75)
    assert got[5].item() == pytest.approx(-97.0) and got[6].item() == 0.0
    assert row[3].item() == 1.0  # the model's own logits are not changed
    assert sampling.pick(row, params, [4, 4, 4, 3]) == 3
    assert sampling.pick(row, Sampling(), [4, 4, 4, 3]) == 5
    assert sampling.processed(row, Sampling(), [4, 4]) is row  # nothing set: the very same tensor


def test_logprobs_are_the_log_softmax_the_sampler_draws_from() -> None:
    row = torch.linspace(-2, 2, VOCAB)
    params = Sampling(temperature=0.7, logit_bias=((0, 3.0),), frequency_penalty=0.5, logprobs=True, top_logprobs=3)
    logprob, top = sampling.logprobs(row, params, [31], 31)
    expected = torch.log_softmax(sampling.processed(row, params, [31]) / 0.7, -1)
    assert logprob == pytest.approx(expected[31].item())
    assert [i for i, _ in top] == expected.topk(3).indices.tolist()
    probs = sampling.distribution(row, params, [31])
    assert probs is not None and torch.allclose(probs.log(), expected, atol=1e-5)
    greedy, _ = sampling.logprobs(row, Sampling(logprobs=True), [], 31)  # greedy: temperature 1
    assert greedy == pytest.approx(torch.log_softmax(row, -1)[31].item())


def test_verify_processes_each_row_as_a_plain_step() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 5], logits[:, 6] = 2.0, 1.0
    biased = Sampling(logit_bias=((6, 1.5),))
    assert verify(logits, [6, 6], None, biased, [], None) == (2, 6)
    assert verify(logits, [5, 6], None, biased, [], None) == (0, 6)  # the bias made 6 the greedy token
    # presence: after the draft 6, row 1 sees it said and prefers 5 again
    present = Sampling(logit_bias=((6, 1.5),), presence_penalty=1.0)
    assert verify(logits, [6, 6], None, present, [], None) == (1, 5)


def scripted_forward(model: object, state: ScriptedState, ids: list[int], all_logits: bool = False, **_: object):  # noqa: ANN201
    """Logits that depend on the whole context: a random row seeded by the tokens so far."""
    rows = []
    for token in ids:
        state.tokens.append(token)
        gen = torch.Generator().manual_seed(hash(tuple(state.tokens)) % (1 << 62))
        rows.append(torch.randn(VOCAB, generator=gen) * 2)
    out = torch.stack(rows)
    return out if all_logits else out[-1:]


def decode(monkeypatch: pytest.MonkeyPatch, params: Sampling, drafters: list, n: int = 40) -> list[Step]:  # type: ignore[type-arg]
    monkeypatch.setattr(steps, "forward", scripted_forward)
    out: list[Step] = []
    got = 0
    items = generate_steps(
        None,  # type: ignore[arg-type]
        ScriptedState(),  # type: ignore[arg-type]
        [1, 2, 3],
        params,
        generator=sampling.make_generator(params.seed),
        controller=Controller(),
        drafters=drafters,
    )
    for item in items:
        if isinstance(item, Step):
            out.append(item)
            got += len(item.ids)
            if got >= n:
                break
    return out


def ids(items: list[Step]) -> list[int]:
    return [t for s in items for t in s.ids][:40]


class Wrong:
    """Drafts the right reply with every third token wrong (so checks reject as well as accept)."""

    name = "answers"

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], None]:
        said = len(context) - 3
        out = [(t + 1) % VOCAB if (said + i) % 3 == 2 else t for i, t in enumerate(self.reply[said : said + k])]
        return out, None


@pytest.mark.parametrize(
    "params",
    [
        Sampling(max_tokens=64, logit_bias=((7, 2.0), (9, -100.0)), presence_penalty=0.4, frequency_penalty=0.6),
        Sampling(max_tokens=64, temperature=1.0, seed=1234),
        Sampling(max_tokens=64, temperature=0.8, top_p=0.9, seed=7, frequency_penalty=1.0, logit_bias=((4, 1.0),)),
    ],
)
def test_drafts_leave_a_processed_or_seeded_reply_as_it_was(monkeypatch: pytest.MonkeyPatch, params: Sampling) -> None:
    plain = ids(decode(monkeypatch, params, []))
    assert (9, -100.0) not in params.logit_bias or 9 not in plain  # banned
    for drafter in (AnswerDrafts([plain], 3), Wrong(plain)):
        drafted = decode(monkeypatch, params, [drafter])
        assert ids(drafted) == plain
        assert sum(s.drafted for s in drafted) > 0 and any(s.accepted < s.drafted for s in drafted) == (
            isinstance(drafter, Wrong)
        )


def test_logprobs_of_verified_tokens_equal_plain_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    params = Sampling(max_tokens=64, temperature=0.9, seed=3, presence_penalty=0.5, logprobs=True, top_logprobs=4)
    plain = decode(monkeypatch, params, [])
    drafted = decode(monkeypatch, params, [Wrong(ids(plain))])
    numbers = [lp for s in plain for lp in s.logprobs][:40]
    again = [lp for s in drafted for lp in s.logprobs][:40]
    assert len(numbers) == 40 and all(len(top) == 4 for _, top in numbers)
    for (a, top_a), (b, top_b) in zip(numbers, again, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and [i for i, _ in top_a] == [i for i, _ in top_b]
    assert all(a <= 0 and math.isfinite(a) for a, _ in numbers)


@pytest.mark.parametrize(
    "params",
    [
        Sampling(max_tokens=48, logit_bias=((40, 3.0), (70, -100.0)), presence_penalty=0.5, frequency_penalty=0.3),
        Sampling(max_tokens=48, temperature=1.0, seed=1234, presence_penalty=0.3),
    ],
)
def test_the_tiny_model_replies_alike_with_and_without_drafts(tiny_engine: EngineRunner, params: Sampling) -> None:
    def ask(source: str) -> list[object]:
        return tiny_engine.run(QUOTE, sampling=params, speculative=source, prefix_cache=False, answer_cache=False)

    plain = ask("off")
    for source in ("lookup", "auto"):  # auto drafts the reply just given (every earlier reply's n-grams)
        spec = ask(source)
        assert token_ids(spec) == token_ids(plain) and done(spec).text == done(plain).text
    assert done(spec).metrics.drafted > 0


def test_answer_cache_keys_follow_bias_and_penalties_not_logprobs() -> None:
    base = context_hash([], sampling=Sampling())
    assert sampling_dict(Sampling()) == sampling_dict(Sampling(logprobs=True, top_logprobs=5))
    assert context_hash([], sampling=Sampling(logprobs=True, top_logprobs=2)) == base
    for changed in (
        Sampling(logit_bias=((5, 1.0),)),
        Sampling(presence_penalty=0.5),
        Sampling(frequency_penalty=-0.5),
    ):
        assert context_hash([], sampling=changed) != base
    assert "logit_bias" not in sampling_dict(Sampling())  # keys made before the fields existed still hit
