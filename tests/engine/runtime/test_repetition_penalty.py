"""The repetition penalty counts the reply's last 64 tokens, never the prompt, with or without drafts.

A grounded reply quotes its document: counting the prompt's tokens made the bundled model avoid the
document's own words (issue 50), so a token in the prompt keeps its logit and only the reply's recent
tokens are penalised.  The decode loop is driven here by a scripted model (fixed logits), so each
assertion names the exact token the rule picks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.api import Sampling
from engine.runtime import sampling, steps
from engine.runtime.speculative import Controller, PromptLookup, verify
from engine.runtime.steps import Step, generate_steps
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.scripted_state import ScriptedState
from tests.support.tiny import make_tiny_model

VOCAB = 16
LIKED = {5: 2.0, 6: 1.9, 7: 1.8}  # the scripted model's logits: 5 best, then 6, then 7; every other id 0


def scripted_forward(model: object, state: ScriptedState, ids: list[int], all_logits: bool = False, **_: object):  # noqa: ANN201
    state.tokens.extend(ids)
    row = torch.zeros(VOCAB)
    for token, logit in LIKED.items():
        row[token] = logit
    return row.repeat(len(ids) if all_logits else 1, 1)


def reply(monkeypatch: pytest.MonkeyPatch, prompt: list[int], params: Sampling, n: int) -> list[int]:
    monkeypatch.setattr(steps, "forward", scripted_forward)
    out: list[int] = []
    items = generate_steps(None, ScriptedState(), prompt, params, generator=torch.Generator(), controller=Controller())  # type: ignore[arg-type]
    for item in items:
        if isinstance(item, Step):
            out.extend(item.ids)
        if len(out) >= n:
            break
    return out[:n]


def test_a_prompt_token_keeps_its_logit_and_a_reply_token_is_penalised(monkeypatch: pytest.MonkeyPatch) -> None:
    document = [5, 5, 5, 9, 5]  # the document says 5 again and again: the reply may still say it
    got = reply(monkeypatch, document, Sampling(repetition_penalty=1.5), 6)
    # 5 first (unpenalised: only the prompt said it); then 5 is the reply's (2.0 / 1.5 = 1.33 < 1.9): 6;
    # then 7; then all three are penalised alike and 5 leads again, and keeps leading
    assert got == [5, 6, 7, 5, 5, 5]
    assert reply(monkeypatch, document, Sampling(), 3) == [5, 5, 5]  # penalty 1: plain greedy


def test_the_penalty_counts_only_the_last_64_reply_tokens() -> None:
    row = torch.zeros(VOCAB)
    row[5], row[6] = 2.0, 1.5  # 5 penalised at 1.5: 1.33 < 1.5
    params = Sampling(repetition_penalty=1.5)
    said_long_ago = [5] + [8] * sampling.PENALTY_WINDOW
    said_lately = [5] + [8] * (sampling.PENALTY_WINDOW - 1)
    assert sampling.pick(row, params, said_long_ago) == 5
    assert sampling.pick(row, params, said_lately) == 6
    assert sampling.recent(said_lately, 1.0) is None  # off: nothing to count


def test_verify_penalises_each_row_as_a_plain_step_would() -> None:
    """Row i follows reply + drafts[:i]: its window, and nothing of the prompt, is penalised."""
    logits = torch.zeros(3, VOCAB)
    logits[:, 5], logits[:, 6] = 2.0, 1.9
    params = Sampling(repetition_penalty=1.5)
    # the reply so far is [9]: row 0 picks 5, row 1 (after the draft 5) picks 6, row 2 (after 5, 6) picks 5
    assert verify(logits, [5, 6], None, params, [9], None) == (2, 5)
    # a window that already holds 5: row 0 must pick 6, so the draft 5 is refused there
    assert verify(logits, [5, 6], None, params, [5], None) == (0, 6)
    # 5 said 65 tokens ago is out of the window: row 0 picks it again
    assert verify(logits, [5, 6], None, params, [5] + [8] * sampling.PENALTY_WINDOW, None) == (2, 5)


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    draft_dir = make_tiny_model(tmp_path_factory.mktemp("draft"), seed=1, layers=1, hidden=32)
    runner = EngineRunner(str(tiny_dir), draft=str(draft_dir))
    yield runner
    runner.close()


DOC = "The lighthouse on Skerry Point was built in 1873 and painted white with a red band in 1901."
QUOTE = [{"role": "user", "content": f"Repeat this text exactly: {DOC} {DOC}"}]


@pytest.mark.parametrize("source", ["lookup", "draft", "auto"])
def test_greedy_with_the_penalty_is_identical_with_and_without_drafts(tiny_pair: EngineRunner, source: str) -> None:
    # 160 tokens: the window of 64 fills and slides, and lookup drafts from the twice-said document
    penalised = Sampling(max_tokens=160, repetition_penalty=2.0)

    def run(speculative: str) -> list[object]:
        return tiny_pair.run(QUOTE, sampling=penalised, speculative=speculative, prefix_cache=False, answer_cache=False)

    plain, spec = run("off"), run(source)
    assert token_ids(spec) == token_ids(plain)
    assert done(spec).text == done(plain).text
    assert len(token_ids(plain)) > sampling.PENALTY_WINDOW or done(plain).finish_reason == "stop"


def test_prompt_lookup_drafts_are_accepted_under_the_penalty(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt says 5 6 7 5 5 5 ...; the scripted model, penalised, says the same: lookup's drafts stand."""
    monkeypatch.setattr(steps, "forward", scripted_forward)
    controller = Controller()
    controller.record_plain(0.01)  # a measured plain step: drafting may start
    prompt = [5, 6, 7] + [5] * 24 + [9]
    items = generate_steps(
        None,
        ScriptedState(),
        prompt,
        Sampling(repetition_penalty=1.5, max_tokens=40),
        generator=torch.Generator(),
        controller=controller,
        drafters=[PromptLookup()],
    )  # type: ignore[arg-type]
    got: list[int] = []
    accepted = 0
    for item in items:
        if isinstance(item, Step):
            got.extend(item.ids)
            accepted += item.accepted
        if len(got) >= 30:
            break
    assert got == [5, 6, 7] + [5] * (len(got) - 3)
    assert accepted > 10
