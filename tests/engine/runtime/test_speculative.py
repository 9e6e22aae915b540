"""Speculative decoding: same greedy output for every source, correct sampling, adaptive control."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from engine.api import Sampling, Token, Warning
from engine.runtime.speculative import Controller, PromptLookup, verify
from engine.runtime.speculative.controller import best_length
from tests.support.engine_runner import EngineRunner, done, token_ids
from tests.support.tiny import make_tiny_model

DOC = (
    "The lighthouse keeper climbed the stairs at dusk, lit the lamp, wound the clockwork, "
    "and wrote the weather in the log: wind from the west, sea calm, visibility good."
)
QUOTE = [{"role": "user", "content": f"Repeat this text exactly: {DOC}"}]
CHAT = [{"role": "user", "content": "Tell me something surprising about octopuses."}]
SOURCES = ["lookup", "answers", "draft", "auto"]


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    draft_dir = make_tiny_model(tmp_path_factory.mktemp("draft"), seed=1, layers=1, hidden=32)
    runner = EngineRunner(str(tiny_dir), draft=str(draft_dir))
    assert runner.draft_error is None
    yield runner
    runner.close()


def run(runner: EngineRunner, messages: list[dict[str, str]], source: str, cache: bool = False, n: int = 48):  # noqa: ANN201
    # answer_cache=False: the model writes every reply (a repeated greedy question would be a cache hit)
    return runner.run(
        messages, sampling=Sampling(max_tokens=n), speculative=source, prefix_cache=cache, answer_cache=False
    )


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_output_identical_for_every_source(tiny_pair: EngineRunner, source: str, cache: bool) -> None:
    for messages in (QUOTE, CHAT):
        plain = run(tiny_pair, messages, "off")
        spec = run(tiny_pair, messages, source, cache)
        assert token_ids(spec) == token_ids(plain)
        assert done(spec).text == done(plain).text
    m = done(spec).metrics
    assert m.accepted <= m.drafted
    if source in ("draft", "answers", "auto"):  # answers: the same question was answered just before
        assert m.drafted > 0


def test_target_as_its_own_draft_accepts_everything(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.runtime.speculative import controller

    # a draft model as large as the target costs a plain step a token, so the controller would draft little
    # (test_controller_drafts_what_pays_for_its_rows); the mechanics are what is tested here
    monkeypatch.setattr(controller, "best_length", lambda _rate, _cost, k_max: k_max)
    runner = EngineRunner(str(tiny_dir), draft=str(tiny_dir))
    try:
        run(runner, CHAT, "off", n=8)  # measure the plain step so drafting starts
        events = run(runner, CHAT, "draft", n=64)
        m = done(events).metrics
        assert m.drafted > 10
        assert m.accepted == m.drafted
        flagged = [e for e in events if isinstance(e, Token) and e.draft]
        assert sum(len(e.ids) for e in flagged) == m.accepted
    finally:
        runner.close()


@pytest.mark.parametrize("mode", ["fp16-cpu", "int8-cpu"])
def test_a_quantized_draft_changes_acceptance_not_the_reply(tiny_dir: Path, mode: str) -> None:
    from engine import quant
    from engine.api import Loaded

    runner = EngineRunner(str(tiny_dir), draft=str(tiny_dir), draft_quant=mode)  # the target, quantized
    try:
        assert runner.draft_error is None and isinstance(runner.load_event, Loaded)
        assert runner.load_event.info.draft_quant == mode
        assert runner.engine.draft is not None
        assert getattr(runner.engine.draft.model, "brisk_quant", {}).get("mode") == mode
        assert quant.weight_bytes(runner.engine.draft.model) < quant.weight_bytes(runner.engine.loaded.model)
        for messages in (QUOTE, CHAT):
            plain = run(runner, messages, "off")
            # the tiny target drafts for itself, so drafting, whose cost counts, never pays here: a slow
            # plain step keeps the controller drafting, which is what this test looks at
            assert runner.engine.decoder is not None
            runner.engine.decoder.controller.plain_step_s = 1.0
            spec = run(runner, messages, "draft", n=48)
            assert token_ids(spec) == token_ids(plain)
        m = done(spec).metrics
        assert m.drafted > 10 and m.accepted >= 0.8 * m.drafted  # nearly the target's own guesses
    finally:
        runner.close()


def test_speculative_output_is_unchanged_on_an_fp16_target(tiny_dir: Path) -> None:
    """Verification (several tokens) and single steps, both in the native step, share one KV cache."""
    runner = EngineRunner(str(tiny_dir), quant="fp16-cpu")
    try:
        assert getattr(runner.engine.loaded.model, "brisk_quant", {}).get("mode") == "fp16-cpu"
        for source in ("lookup", "auto"):
            for cache in (False, True):
                plain = run(runner, QUOTE, "off")
                spec = run(runner, QUOTE, source, cache)
                assert token_ids(spec) == token_ids(plain)
        assert done(spec).metrics.drafted > 0
    finally:
        runner.close()


def test_unknown_draft_quantization_is_a_warning_and_the_target_still_runs(tiny_dir: Path) -> None:
    runner = EngineRunner(str(tiny_dir), draft=str(tiny_dir), draft_quant="int3-cpu")
    try:
        assert isinstance(runner.draft_error, Warning)
        assert "int3-cpu" in runner.draft_error.message and "fp16-cpu" in runner.draft_error.message
        assert token_ids(run(runner, CHAT, "off", n=8))
    finally:
        runner.close()


def test_answers_source_replays_an_earlier_answer(tiny_engine: EngineRunner) -> None:
    question = [{"role": "user", "content": "What do lighthouse keepers write in the log?"}]
    first = run(tiny_engine, question, "off")
    again = run(tiny_engine, question, "answers")
    assert token_ids(again) == token_ids(first)
    m = done(again).metrics
    assert m.drafted > 0 and m.accepted == m.drafted
    assert m.draft_sources["answers"].accepted == m.accepted


def test_draft_with_other_vocabulary_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    other = make_tiny_model(tmp_path / "other", seed=2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    runner = EngineRunner(str(tiny_dir), draft=str(other))
    try:
        assert isinstance(runner.draft_error, Warning)
        assert "vocabulary" in runner.draft_error.message
        events = runner.run(CHAT, speculative="draft")
        assert "draft model" in events[-1].message
    finally:
        runner.close()


def test_verify_greedy_accepts_until_first_mismatch() -> None:
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 7, 1]):
        logits[row, best] = 5.0
    assert verify(logits, [3, 4, 5], None, Sampling(), [], None) == (2, 7)
    assert verify(logits, [3, 4, 7], None, Sampling(), [], None) == (3, 1)  # bonus token
    assert verify(logits, [9, 4, 7], None, Sampling(), [], None) == (0, 3)


@pytest.mark.parametrize("deterministic", [True, False])
def test_speculative_sampling_matches_the_target_distribution(deterministic: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 5
    target = torch.randn(vocab, generator=gen) * 1.5
    draft_logits = torch.randn(vocab, generator=gen) * 1.5
    p = torch.softmax(target, -1)
    q = torch.softmax(draft_logits, -1)
    params = Sampling(temperature=1.0)
    logits = torch.stack([target, torch.randn(vocab, generator=gen)])
    counts = torch.zeros(vocab)
    trials = 20000
    for _ in range(trials):
        if deterministic:  # a lookup-style drafter always proposes the same token
            x, probs = 2, None
        else:
            x = int(torch.multinomial(q, 1, generator=gen))
            probs = q.unsqueeze(0)
        accepted, nxt = verify(logits, [x], probs, params, [], gen)
        counts[x if accepted else nxt] += 1
    empirical = counts / trials
    tv = 0.5 * float((empirical - p).abs().sum())
    assert tv < 0.02, f"total variation {tv:.3f}: got {empirical.tolist()}, want {p.tolist()}"
    # and a wrong rule would be caught: the draft distribution itself is far from p
    assert 0.5 * float((q - p).abs().sum()) > 0.1


def test_controller_pauses_a_source_that_does_not_pay() -> None:
    c = Controller()
    assert c.draft_length("lookup") == 0, "no drafting before a plain step has been measured"
    c.record_plain(0.030)
    assert c.draft_length("lookup") == 4
    for _ in range(3):
        c.record("lookup", 4, 0, 0.040)  # nothing accepted, and slower than a plain step
    assert c.draft_length("lookup") == 0
    for _ in range(40):
        c.record_plain(0.030)
    assert c.draft_length("lookup") > 0, "a paused source is probed again later"
    c.record("lookup", 1, 1, 0.031)
    c.record("lookup", 3, 3, 0.033)
    assert c.draft_length("lookup") >= 4, "full acceptance grows the draft"


def test_controller_shrinks_model_drafts_but_keeps_lookups_long() -> None:
    c = Controller()
    c.record_plain(0.030)
    for source in ("lookup", "draft-model"):
        c.record(source, 4, 4, 0.031)
        assert c.draft_length(source) == 6
        c.record(source, 6, 1, 0.031)  # one accepted: worth it, but the rest was wasted
    assert c.draft_length("draft-model") == 2, "a draft model pays per token: shrink to accepted + 1"
    assert c.draft_length("lookup") == 4, "lookups are free to propose: keep the floor"
    c.record("lookup", 4, 0, 0.020)  # a quick step, so the source is not paused for it
    assert c.draft_length("lookup") == 1, "nothing accepted (open-ended text): drafts shrink to one token"


def test_controller_drafts_what_pays_for_its_rows() -> None:
    """Each drafted row's measured cost caps the draft: cheap rows (memory-bound fp16) keep long drafts,
    costly ones (q8's integer kernel: 0.6 of a plain step a row) keep a seldom-right source to a token or
    two, while a source copying a passage (accepted whole, again and again) still drafts long."""
    assert best_length(0.5, 0.05, 12) >= 3
    assert best_length(0.5, 0.65, 12) == 1
    assert best_length(0.97, 0.65, 12) >= 4
    c = Controller()
    c.record_plain(0.005)
    for _ in range(6):  # a seldom-right source whose four drafted rows made the step 2.6x as long
        c.record("history", 4, 1, 0.013)
        for s in c.stats.values():  # pausing is not under test here
            s.paused_until = 0
    assert c.stats["history"].row_cost == pytest.approx(0.4, abs=0.05)
    assert c.draft_length("history") <= 2
    cheap = Controller()
    cheap.record_plain(0.009)
    for _ in range(6):  # rows nearly free: the same record keeps its length
        cheap.record("history", 4, 1, 0.0095)
        for s in cheap.stats.values():
            s.paused_until = 0
    assert cheap.draft_length("history") >= 2
    copying = Controller()
    copying.record_plain(0.005)
    for k in (4, 6, 8, 10, 12, 12):  # every draft accepted whole
        copying.record("lookup", k, k, 0.005 * (1 + 0.6 * k))
    assert copying.draft_length("lookup") >= 8


def test_prompt_lookup_finds_the_continuation() -> None:
    drafts, probs = PromptLookup().propose([5, 6, 7, 8, 9, 1, 2, 5, 6, 7], 3, Sampling())
    assert drafts == [8, 9, 1] and probs is None
    assert PromptLookup().propose([1, 2, 3, 4], 3, Sampling()) == ([], None)


@pytest.mark.bundled
@pytest.mark.parametrize("source", ["lookup", "answers", "auto"])
def test_bundled_greedy_identical_with_speculation(bundled_engine: EngineRunner, source: str) -> None:
    messages = [{"role": "user", "content": f"Summarise in one sentence: {DOC}"}]
    plain = run(bundled_engine, messages, "off", n=60)
    spec = run(bundled_engine, messages, source, n=60)
    assert token_ids(spec) == token_ids(plain)
    if source != "lookup":
        assert done(spec).metrics.drafted > 0


@pytest.mark.bundled
@pytest.mark.skipif(not shutil.which(os.environ.get("CXX") or "c++"), reason="no C++ compiler: no native step")
def test_bundled_fp16_greedy_identical_with_speculation_on_the_native_step() -> None:
    """As ``make run`` decodes: fp16-cpu, plain steps and verification in the native step."""
    from engine.model import kv
    from engine.quant import native

    assert native.module(wait=True) is not None, native.status()
    runner = EngineRunner("", quant="fp16-cpu")
    try:
        assert getattr(runner.engine.loaded.model, "brisk_quant", {}).get("mode") == "fp16-cpu"
        calls = []
        fast = kv.fast_forward(runner.engine.loaded.model)  # made once per model; the engine uses this one
        rows = fast.native.rows
        fast.native.rows = lambda *a, **k: calls.append(a[0].shape[1]) or rows(*a, **k)
        for messages in (QUOTE, [{"role": "user", "content": f"Summarise in one sentence: {DOC}"}]):
            plain = run(runner, messages, "off", n=60)
            spec = run(runner, messages, "auto", n=60)
            assert token_ids(spec) == token_ids(plain)
        assert done(spec).metrics.drafted > 0
        assert 1 in calls and max(calls) > 1  # plain steps and verifications both ran natively
    finally:
        runner.close()


def test_a_source_with_nothing_to_propose_is_asked_less_often_and_again_after_it_proposes() -> None:
    c = Controller()
    c.record_plain(0.010)
    assert c.draft_length("lookup") > 0
    c.record_empty("lookup", 0.001)
    waits = []
    for _ in range(8):  # each empty answer doubles the wait, up to idle_max steps
        asked_at = c.step
        while c.draft_length("lookup") == 0:
            c.record_plain(0.010)
        waits.append(c.step - asked_at)
        c.record_empty("lookup", 0.001)
    assert waits[:3] == [1, 2, 4] and max(waits) == c.idle_max == 8
    assert c.stats["lookup"].empty_s == pytest.approx(0.009)
    c.step = c.stats["lookup"].idle_until  # asked again, and this time it has drafts that pay
    c.record("lookup", 4, 4, 0.012)
    assert c.draft_length("lookup") > 0, "after proposing, asked at every step again"


def test_the_time_spent_making_drafts_counts_against_a_source(tiny_dir: Path) -> None:
    import time as clock

    from transformers import AutoModelForCausalLM

    from engine.model.kv import KVState
    from engine.runtime.steps import generate_steps

    class Slow:
        name = "slow"

        def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], None]:
            clock.sleep(0.05)  # far longer than the tiny model's step: drafting cannot pay
            return [1] * k, None

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    controller = Controller()
    controller.record_plain(0.002)
    steps = generate_steps(
        model,
        KVState(),
        list(range(5, 15)),
        Sampling(max_tokens=40),
        generator=torch.Generator().manual_seed(0),
        controller=controller,
        drafters=[Slow()],
    )
    seen = [s for _, s in zip(range(40), steps, strict=False)]
    drafted = [s for s in seen if getattr(s, "source", None) == "slow"]
    assert drafted and all(s.seconds >= 0.05 for s in drafted), "a step's time includes making its drafts"
    assert controller.stats["slow"].paused_until > 0, "a source whose drafting costs more than it brings pauses"
    assert len(drafted) < 10


@pytest.mark.parametrize("source", SOURCES)
def test_the_loop_stop_ends_a_greedy_reply_at_the_same_token_with_or_without_drafts(
    tiny_pair: EngineRunner, source: str
) -> None:
    """The tiny random model loops at once; ``stop_repeats`` ends it, and drafting never moves the end."""
    looping = Sampling(max_tokens=96, stop_repeats=3, repetition_penalty=1.1)

    def reply(speculative: str) -> list[object]:
        return tiny_pair.run(CHAT, sampling=looping, speculative=speculative, prefix_cache=False, answer_cache=False)

    plain, spec = reply("off"), reply(source)
    assert done(plain).finish_reason == "repetition" and len(token_ids(plain)) < 96
    assert token_ids(spec) == token_ids(plain) and done(spec).finish_reason == "repetition"
    assert done(spec).text == done(plain).text
