"""Speculative decoding: drafts from cheap sources, verified by the target in one forward.

``verify`` is the whole acceptance rule (a pure function).  Drafters propose
up to ``k`` tokens that follow a context:

* :class:`PromptLookup` — n-gram matches in the prompt and reply so far;
* :class:`AnswerDrafts` — continuations of earlier answers to similar questions;
* :class:`DraftModel` — a small causal LM with the same vocabulary, whose KV is
  kept between steps and turns and rolled back after a rejection.

:class:`Controller` adapts ``k`` per source from acceptance and measured step
times, and pauses a source when drafting does not pay, so speculative decoding
is never much slower than plain decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engine.api import Sampling
from engine.model.kv import KVState, common_prefix, forward
from engine.runtime import sampling


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    params: Sampling,
    history: list[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Check ``drafts`` against target ``logits`` (``[len(drafts) + 1, vocab]``).

    Returns ``(accepted, next_token)``: the first ``accepted`` drafts stand, and
    ``next_token`` is the target's own token after them (a correction, or the
    bonus token when every draft was accepted).

    Greedy: accept while the draft equals the target's argmax.  Sampling (the
    rule of Leviathan et al. and Chen et al.): accept draft x with probability
    min(1, p(x) / q(x)); on rejection draw from max(p - q, 0) normalised; so the
    output has exactly the target's distribution p.  Deterministic drafters
    have a one-hot q, so acceptance is p(x) and the residual is p without x.
    """
    k = len(drafts)
    penalty = params.repetition_penalty != 1.0

    def hist(i: int) -> torch.Tensor | None:
        return torch.tensor(history + drafts[:i]) if penalty else None

    if params.temperature <= 0:
        if not penalty:
            targets = logits.argmax(-1).tolist()
        else:
            targets = [
                int(sampling.penalise(logits[i], hist(i), params.repetition_penalty).argmax()) for i in range(k + 1)
            ]
        accepted = 0
        while accepted < k and drafts[accepted] == targets[accepted]:
            accepted += 1
        return accepted, targets[accepted]
    for i, x in enumerate(drafts):
        p = sampling.distribution(logits[i], params, hist(i))
        assert p is not None
        q_x = float(draft_probs[i, x]) if draft_probs is not None else 1.0
        if float(torch.rand((), generator=generator)) * q_x < float(p[x]):  # u < p/q without dividing by 0
            continue
        if draft_probs is not None:
            residual = (p - draft_probs[i]).clamp_min(0)
        else:
            residual = p.clone()
            residual[x] = 0
        if float(residual.sum()) <= 0:
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    p = sampling.distribution(logits[k], params, hist(k))
    assert p is not None
    return k, int(torch.multinomial(p, 1, generator=generator))


class Drafter(Protocol):
    name: str

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` tokens that may follow ``context``, and their draft probabilities (None: one-hot)."""
        ...


def ngram_continuation(corpus: torch.Tensor, tail: list[int], k: int, exclude_end: bool) -> list[int]:
    """Tokens after the latest occurrence of ``tail`` in ``corpus`` (not counting ``corpus``'s own end)."""
    n = len(tail)
    limit = corpus.numel() - (n if exclude_end else 0)
    if n == 0 or limit < n:
        return []
    windows = corpus[:limit].unfold(0, n, 1)
    hits = (windows == torch.tensor(tail)).all(1).nonzero().flatten()
    for start in reversed(hits.tolist()):
        follow = corpus[start + n : start + n + k]
        if follow.numel():
            return follow.tolist()
    return []


@dataclass
class PromptLookup:
    """Drafts by finding the reply's last few tokens earlier in the prompt or reply."""

    max_ngram: int = 4
    min_ngram: int = 2
    name: str = "lookup"

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        corpus = torch.tensor(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            follow = ngram_continuation(corpus, context[-n:], k, exclude_end=True)
            if follow:
                return follow, None
        return [], None


@dataclass
class AnswerDrafts:
    """Drafts from earlier answers (token ids) to questions like this one.

    While the reply so far equals the start of an earlier answer, that answer's
    next tokens are the draft; after a divergence, n-gram matches into the
    answers take over.  Tokens the model would not produce are rejected, so
    stale answers cost speed, never correctness.
    """

    answers: list[list[int]]
    prompt_length: int
    min_ngram: int = 2
    name: str = "answers"
    _corpus: list[torch.Tensor] = field(default_factory=list)

    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        reply = context[self.prompt_length :]
        for answer in self.answers:
            if answer[: len(reply)] == reply and len(answer) > len(reply):
                return answer[len(reply) : len(reply) + k], None
        if not self._corpus:
            self._corpus = [torch.tensor(a) for a in self.answers if a]
        for n in (4, 3, self.min_ngram):
            if len(reply) < n:
                continue
            for corpus in self._corpus:
                follow = ngram_continuation(corpus, reply[-n:], k, exclude_end=False)
                if follow:
                    return follow, None
        return [], None


class DraftModel:
    """A small model drafting for a larger one; its KV persists across steps and turns."""

    name = "draft-model"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.state = KVState()

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: Sampling) -> tuple[list[int], torch.Tensor | None]:
        keep = min(common_prefix(self.state.tokens, context), len(context) - 1)
        self.state.crop(keep)
        logits = forward(self.model, self.state, context[keep:])[-1]
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            q = sampling.distribution(logits, params, None)
            token = int(logits.argmax()) if q is None else int(torch.multinomial(q, 1))
            drafts.append(token)
            if q is not None:
                probs.append(q)
            if i + 1 < k:
                logits = forward(self.model, self.state, [token])[-1]
        return drafts, torch.stack(probs) if probs else None


@dataclass
class SourceStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    efficiency: float = 1.0  # EMA of (tokens gained per step) * plain step time / step time
    paused_until: int = 0
    pause: int = 8


@dataclass
class Controller:
    """Chooses how many tokens to draft, per source, from what drafting has earned."""

    k_max: int = 12
    # After a rejection k shrinks to the accepted length + 1, but, when part of the draft was
    # accepted, not below a source's floor. Lookups cost nothing to propose and a few more rows
    # cost little to verify (a step verifying 4 to 8 tokens measured 1.0-1.5x a plain one
    # here), so their drafts stay long enough to catch the next run of copied text; a draft
    # model pays a forward per drafted token, so it has no floor.
    k_floor: dict[str, int] = field(default_factory=lambda: {"lookup": 4, "answers": 4})
    k: dict[str, int] = field(default_factory=dict)
    stats: dict[str, SourceStats] = field(default_factory=dict)
    plain_step_s: float | None = None  # EMA of measured single-token steps
    step: int = 0

    def draft_length(self, source: str) -> int:
        s = self.stats.setdefault(source, SourceStats())
        if self.plain_step_s is None or self.step < s.paused_until:
            return 0
        return self.k.setdefault(source, 4)

    def record_plain(self, seconds: float) -> None:
        self.step += 1
        self.plain_step_s = seconds if self.plain_step_s is None else 0.8 * self.plain_step_s + 0.2 * seconds

    def record(self, source: str, drafted: int, accepted: int, seconds: float) -> None:
        self.step += 1
        s = self.stats.setdefault(source, SourceStats())
        s.drafted += drafted
        s.accepted += accepted
        s.steps += 1
        if self.plain_step_s:
            gain = (accepted + 1) * self.plain_step_s / seconds
            s.efficiency = 0.7 * s.efficiency + 0.3 * gain
            if s.efficiency < 1.0:  # drafting costs more than it brings: back off, exponentially
                s.paused_until = self.step + s.pause
                s.pause = min(s.pause * 2, 256)
                s.efficiency = 1.0
            elif accepted == drafted:
                s.pause = 8
        k = self.k.get(source, 4)
        if accepted == drafted:
            self.k[source] = min(self.k_max, k + 2)
        else:
            floor = self.k_floor.get(source, 1) if accepted else 1  # a miss from the start: a cold source
            self.k[source] = max(floor, min(k, accepted + 1))
