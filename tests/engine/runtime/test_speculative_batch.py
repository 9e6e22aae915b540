"""Drafting decided per step for the whole batch: a drafted token delays every row of a batched step, so a
row drafts only where its expected accepted tokens beat what its rows cost at the step's width (measured
per width, here on a fake clock), and greedy output stays the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine.runtime.steps as steps_module
from engine.api import Sampling
from engine.model.kv import KVState, forward, forward_many
from engine.runtime.batching import Batch
from engine.runtime.speculative import Controller, RowRates, SourceStats
from engine.runtime.speculative.controller import StepShape, best_length, bucket
from engine.runtime.steps import Step, generate_steps

PLAIN_1, EXTRA_1 = 0.010, 0.001  # a lone step, and what each drafted token adds to it: drafting pays
PLAIN_ROW, EXTRA_4 = 0.004, 0.008  # each further row of a batched step, and a drafted token there: it does not


def test_one_row_drafts_where_four_rows_do_not() -> None:
    """The same source, the same run rate: alone it drafts, in a step of four rows whose drafted tokens cost
    what was measured there it does not (the old rule, blind to the width, drafted in both)."""
    c = Controller()
    c.record_plain(PLAIN_1)
    c.stats["lookup"] = SourceStats(run_accepted=1.0, run_rejected=1.0, row_cost=0.3)  # half its tokens stand
    assert c.draft_length("lookup", 1) >= 1
    assert c.draft_length("lookup", 4) == 0, "no plain step of four rows measured yet: none drafts"
    c.observe(StepShape(101, 4, 4, 0.020))  # four rows, a token each: 20 ms
    c.observe(StepShape(101, 4, 4, 0.020))  # the same step, reported by its next row: counted once
    assert c.draft_length("lookup", 4) == 4, "what a drafted token costs at four rows is not known: measure it"
    c.observe(StepShape(102, 4, 8, 0.032))  # four drafted tokens made it 12 ms longer: 3 ms, 0.15 plain, each
    assert c.extra_at[bucket(4)] == pytest.approx(0.003)
    # a token accepted half the time gains 0.5 of a row; it costs four rows 0.15 of a step each: 0.6
    assert c.draft_length("lookup", 4) == 0
    assert c.draft_length("lookup", 3) == 0, "three rows: their own plain step is not measured"
    assert c.draft_length("lookup", 1) >= 1, "alone, the same source still drafts"
    # a source copying a passage (nearly all accepted) pays even at four rows
    c.stats["copy"] = SourceStats(run_accepted=30.0, run_rejected=0.5)
    assert c.draft_length("copy", 4) >= 2
    for number in range(103, 103 + 16):  # plain steps of four rows; after a while the source is probed
        c.observe(StepShape(number, 4, 4, 0.020))
    assert c.draft_length("lookup", 4) == 1 and c.draft_length("lookup", 4) == 0, "one probe, then none"


def test_in_a_batch_each_row_is_weighed_by_its_own_acceptance() -> None:
    """One reply copying its earlier answer makes the source's rate high; a reply beside it whose drafts from
    that source keep failing stops drafting, while the copying one drafts long."""
    c = Controller()
    c.observe(StepShape(201, 4, 4, 0.020))
    c.observe(StepShape(202, 4, 8, 0.032))  # 0.15 of a plain step a drafted token
    c.stats["answers"] = SourceStats(run_accepted=30.0, run_rejected=0.5)
    copying, other = RowRates(), RowRates()
    for _ in range(3):
        copying.record("answers", 6, 6)
        other.record("answers", 4, 0)
    assert c.draft_length("answers", 4, copying) >= 4
    assert c.draft_length("answers", 4) >= 4, "the source's own rate alone would have it draft"
    assert c.draft_length("answers", 4, other) == 0
    c.record_plain(0.010)
    c.stats["answers"].row_cost = 0.3
    assert c.draft_length("answers", 1, copying) >= 4, "alone too, a row is weighed by its own acceptance"
    assert c.draft_length("answers", 1, other) == 1


def test_best_length_weighs_the_whole_batch() -> None:
    assert best_length(0.5, 0.15, 12) >= 1  # alone: at least one token, as before
    assert best_length(0.5, 0.15, 12, width=4) == 0
    assert best_length(0.5, 0.1, 12, width=4) >= 1  # cheap rows: 0.4 a token against 0.5 gained
    assert best_length(0.95, 0.15, 12, width=4) >= 3  # a copying source: 0.95 gained against 0.6
    assert best_length(0.95, 0.15, 12, width=8) == 0  # eight rows: 1.2 a token


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Oracle:
    """Proposes the reply's true next token, then wrong ones: about half of what it drafts stands."""

    name = "lookup"

    def __init__(self, reference: dict[int, list[int]], prompts: list[list[int]]) -> None:
        self.reference = reference
        self.prompts = prompts

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        for i, prompt in enumerate(self.prompts):
            if context[: len(prompt)] == prompt:
                right = self.reference[i][len(context) - len(prompt)]
                return [right] + [(right + 1) % 200 + 3 for _ in range(k - 1)], None
        return [], None


N = 40  # tokens a reply


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture
def one_thread() -> Any:
    """A tiny model's step is a few small ops: on a shared 2-core machine one thread runs it 10x faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reply(model: Any, prompt: list[int], controller: Controller, drafters: list[Any], out: list[Step]) -> None:
    got = 0
    for item in generate_steps(
        model,
        KVState(),
        prompt,
        Sampling(max_tokens=N),
        generator=torch.Generator().manual_seed(0),
        controller=controller,
        drafters=drafters,
    ):
        if isinstance(item, Step):
            out.append(item)
            got += len(item.ids)
            if got >= N:
                return


def test_four_rows_stop_drafting_what_does_not_pay_and_greedy_is_unchanged(
    model: Any, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    clock = Clock()
    monkeypatch.setattr(steps_module.time, "perf_counter", clock)  # the time module: batching's clock too

    def alone(model_: Any, state: KVState, ids: list[int], *args: Any, **kwargs: Any) -> torch.Tensor:
        clock.now += PLAIN_1 + EXTRA_1 * (len(ids) - 1)
        return forward(model_, state, ids, *args, **kwargs)

    def many(model_: Any, jobs: list[tuple[KVState, list[int], bool]]) -> list[torch.Tensor]:
        fed = sum(len(ids) for _, ids, _ in jobs)
        clock.now += PLAIN_1 + PLAIN_ROW * (len(jobs) - 1) + EXTRA_4 * (fed - len(jobs))
        return forward_many(model_, jobs)

    monkeypatch.setattr(steps_module, "forward", alone)
    prompts = [[3 + (7 * i + 5 * j) % 150 for j in range(12 + 3 * i)] for i in range(4)]
    reference: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        steps: list[Step] = []
        _reply(model, prompt, Controller(), [], steps)
        reference[i] = [t for s in steps for t in s.ids][:N]
    oracle = Oracle(reference, prompts)
    controller = Controller()
    lone: list[Step] = []
    _reply(model, prompts[0], controller, [oracle], lone)
    assert [t for s in lone for t in s.ids][:N] == reference[0]
    assert sum(1 for s in lone if s.drafted) >= 5, "alone, drafting pays: it drafts"

    batch = Batch(many=many)
    outs: list[list[Step]] = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        batch.start(lambda i=i, prompt=prompt: _reply(model, prompt, controller, [oracle], outs[i]))
    while batch.active:
        assert batch.ready
        batch.step()
    assert batch.widest == 4
    for i, steps in enumerate(outs):
        assert [t for s in steps for t in s.ids][:N] == reference[i], "greedy output is the same in a batch"
    drafted = sum(1 for steps in outs for s in steps if s.drafted)
    # one step of four measures a drafted token's cost there, a probe now and then, a few at the narrower tail;
    # the old rule drafted on nearly every step of every row (about 80 here)
    assert drafted <= 12, drafted
    assert controller.plain_at[4] == pytest.approx(PLAIN_1 + 3 * PLAIN_ROW)
    assert controller.extra_at[bucket(4)] == pytest.approx(EXTRA_4)
