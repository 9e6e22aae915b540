"""The innermost generator: token ids from the model, one model step at a time.

``generate_steps(model, state, prompt, params, ...)`` computes the prompt
tokens that ``state`` (a :class:`~engine.model.kv.KVState` holding a strict
prefix of ``prompt``) lacks, in chunks, yielding a :class:`Prefilled` after
each chunk; then it yields one :class:`Step` per model step: the first token,
then either one sampled token (a plain step) or the drafts the target accepted
plus its own next token (a speculative step: draft, verify in one forward, and
crop the rejected drafts' KV).

It is lazy, in the style of mlx-lm's ``generate_step``: no model step runs
until the consumer asks for the next item, so the consumer ends a reply (EOS,
stop string, ``max_tokens``, cancel) by not asking, and cancel is honoured
after every model step.  The generator itself knows only the model's context:
it ends (returns) when the next step would need a position beyond
``context``, never feeding the model more than ``context`` positions.
``max_tokens`` only bounds how much it drafts.  It knows nothing of text,
events or metrics.  Plain steps' times go to ``engine.runtime.threads.observe_step``,
which lowers the thread count while a busy core would stall every op.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.api import Sampling
from engine.model.kv import KVState, forward
from engine.runtime import batching, sampling
from engine.runtime.grammar import Grammar, ToolCalls
from engine.runtime.speculative import Controller, Drafter, RowRates, verify
from engine.runtime.threads import observe_step

PREFILL_CHUNK = 256
FORCED = "forced"  # a Step's source for tokens the reply's format allowed as the only continuation


@dataclass(frozen=True)
class Prefilled:
    """A prefill chunk is in the KV cache: ``done`` of ``total`` prompt positions, in ``seconds``."""

    done: int
    total: int
    seconds: float


@dataclass(frozen=True)
class Step:
    """One decode step's new tokens, in order.

    ``ids[:accepted]`` were drafted by ``source`` and accepted by the target;
    ``ids[-1]`` is the target's own token (sampled, a correction or the bonus
    token).  A plain step has ``source=None`` and one id.  ``seconds`` is the
    step's model time (forward plus sampling or verification; for the first
    token, the sampling after prefill).
    """

    ids: tuple[int, ...]
    source: str | None = None
    drafted: int = 0
    seconds: float = 0.0
    # with Sampling.logprobs, for each id: its log probability and the top (id, log probability) pairs
    logprobs: tuple[tuple[float, list[tuple[int, float]]], ...] = ()

    @property
    def accepted(self) -> int:
        return len(self.ids) - 1

    def provenance(self) -> Iterator[tuple[int, str | None]]:
        """Each token with the source that drafted it (None: the target's own)."""
        for i, token in enumerate(self.ids):
            yield token, self.source if i < self.accepted else None


def generate_steps(
    model: Any,
    state: KVState,
    prompt: list[int],
    params: Sampling,
    *,
    generator: torch.Generator,
    controller: Controller,
    drafters: Sequence[Drafter] = (),
    context: int | None = None,
    grammar: Grammar | ToolCalls | None = None,
    known: torch.Tensor | None = None,
) -> Generator[Prefilled | Step, None, None]:
    """Prefill ``prompt`` into ``state``, then yield decode steps until the context is full.

    With a ``grammar`` (``engine.runtime.grammar``) every row sampled from is masked to what it allows,
    the tokens it forces are fed with the next step as drafts of source ``FORCED`` (a model step saved
    each time all stand; checked like any draft, so the reply equals the one without them), and other
    drafts are cut at the first token it rejects.

    ``state`` holds a strict prefix of ``prompt``, or all of it when ``known`` gives the logits [vocab] of
    its last token (a draft prefilled to its end while it was typed): then no model step runs before the
    first token."""
    start = len(state)
    whole = known is not None and start == len(prompt)  # prefilled to its end, its last logits kept
    assert (start < len(prompt) or whole) and state.tokens == prompt[:start], "state must hold a prefix of the prompt"
    limit = context or 1 << 62  # positions the model can hold
    logits = known[None] if whole and known is not None else None
    if whole:
        yield Prefilled(len(prompt), len(prompt), 0.0)
    for begin in range(start, len(prompt), PREFILL_CHUNK):
        t = time.perf_counter()
        chunk = prompt[begin : begin + PREFILL_CHUNK]
        logits = forward(model, state, chunk)
        yield Prefilled(begin + len(chunk), len(prompt), time.perf_counter() - t)
        if begin + PREFILL_CHUNK < len(prompt):
            batching.pause()  # the other requests in flight step between this prompt's chunks
    assert logits is not None
    generated: list[int] = []  # every token yielded so far; the consumer reads them in order
    rates = RowRates()  # this reply's own acceptance per source (what its drafts are weighed by in a batch)

    t = time.perf_counter()
    row = _row(logits[-1], grammar)
    token = sampling.pick(row, params, generated, _draws(params, generated, generator))  # no reply yet
    if grammar is not None:
        grammar.accept([token])
    seconds = time.perf_counter() - t
    yield Step((token,), seconds=seconds, logprobs=_logprobs(params, row[None], [token], generated))
    generated.append(token)

    # ``token`` is the last yielded token, not yet in the KV cache; feeding it (and k drafts after
    # it) fills positions len(prompt) + len(generated) - 1 ... + k, which must stay below ``limit``
    while len(prompt) + len(generated) < limit:
        room = min(params.max_tokens - len(generated), limit - len(prompt) - len(generated)) - 1
        t_draft = time.perf_counter()  # a step's time includes making its drafts, or failing to
        drafts, probs, source = _constrained_drafts(
            grammar, drafters, controller, prompt + generated, room, params, rates
        )
        t = time.perf_counter()
        logits = batching.decode(model, state, [token, *drafts], bool(drafts), forward)  # with the others in flight
        shape = batching.last_step()
        if shape is not None:
            controller.observe(shape)  # what a plain step and a drafted token cost at this batch width
        if drafts:
            assert source is not None
            if grammar is not None:
                logits = grammar.masks_along(logits, drafts)
            accepted, token = verify(logits, drafts, probs, params, generated, generator)
            state.crop(len(state) - (len(drafts) - accepted))  # forget the rejected drafts' KV
            seconds = time.perf_counter() - t_draft
            if source != FORCED:  # forced tokens are the format's
                rates.record(source, len(drafts), accepted)
                if batching.stepped_alone():
                    controller.record(source, len(drafts), accepted, seconds)
                else:  # a batched step's time is not this request's (``observe`` has the batch's)
                    controller.record_accepted(source, len(drafts), accepted)
            ids = (*drafts[:accepted], token)
            if grammar is not None:
                grammar.accept(ids)
            lp = _logprobs(params, logits, ids, generated)
            generated.extend(ids)
            yield Step(ids, source, len(drafts), seconds, lp)
        else:
            row = _row(logits[-1], grammar)
            token = sampling.pick(row, params, generated, _draws(params, generated, generator))
            now = time.perf_counter()
            seconds = now - t
            if batching.stepped_alone():  # a batched step's time is the batch's, not this model step's
                controller.record_plain(seconds)  # the model's own step: what drafting is weighed against
                observe_step(seconds, len(state))  # fewer threads while another program holds a core
            if grammar is not None:
                grammar.accept([token])
            lp = _logprobs(params, row[None], [token], generated)
            generated.append(token)
            yield Step((token,), seconds=now - t_draft, logprobs=lp)


def _draws(params: Sampling, reply: list[int], generator: torch.Generator) -> torch.Generator:
    """What the token after ``reply`` is drawn from: with a seed, its position's own generator."""
    return generator if params.seed is None else sampling.positional(params.seed, len(reply))


def _logprobs(
    params: Sampling, rows: torch.Tensor, ids: Sequence[int], reply: list[int]
) -> tuple[tuple[float, list[tuple[int, float]]], ...]:
    """With ``params.logprobs``: each of ``ids``'s numbers, row i read after ``reply + ids[:i]``."""
    if not params.logprobs:
        return ()
    return tuple(sampling.logprobs(rows[i], params, [*reply, *ids[:i]], t) for i, t in enumerate(ids))


def _row(logits: torch.Tensor, grammar: Grammar | ToolCalls | None) -> torch.Tensor:
    return logits if grammar is None else grammar.masked(logits)


def _constrained_drafts(
    grammar: Grammar | ToolCalls | None,
    drafters: Sequence[Drafter],
    controller: Controller,
    context: list[int],
    room: int,
    params: Sampling,
    rates: RowRates | None = None,
) -> tuple[list[int], torch.Tensor | None, str | None]:
    """What to feed with the next step: the format's forced tokens, else drafts cut to what it accepts."""
    if grammar is not None and room > 0:
        forced = grammar.forced()[:room]
        if forced:
            return forced, None, FORCED
    drafts, probs, source = _draft(drafters, controller, context, room, params, rates)
    if grammar is None or not drafts:
        return drafts, probs, source
    keep = grammar.valid_prefix(drafts)
    if not keep:
        return [], None, None
    return drafts[:keep], probs[:keep] if probs is not None else None, source


def _draft(
    drafters: Sequence[Drafter],
    controller: Controller,
    context: list[int],
    room: int,
    params: Sampling,
    rates: RowRates | None = None,
) -> tuple[list[int], torch.Tensor | None, str | None]:
    """The first source (best first) that proposes something within ``room`` tokens, with its drafts; how
    many each may propose depends on the rows the step will have (``Controller.draft_length``)."""
    width = batching.width() if drafters else 1
    for drafter in drafters:
        k = min(controller.draft_length(drafter.name, width, rates), room)
        if k > 0:
            t = time.perf_counter()
            drafts, probs = drafter.propose(context, k, params)
            if drafts:
                controller.record_made(drafter.name, len(drafts[:k]), time.perf_counter() - t)
                return drafts[:k], probs, drafter.name
            controller.record_empty(drafter.name, time.perf_counter() - t)
    return [], None, None
