"""Draft sources: each proposes up to ``k`` tokens that may follow a context.

A :class:`Drafter` has a ``name`` (the source named in ``DraftStats`` and the
controller) and ``propose(context, k, params) -> (drafts, probs)``, where
``probs`` is the drafter's distribution per draft (``[len(drafts), vocab]``) or
None for a deterministic drafter.  Drafts are only proposals: the target
verifies them (``engine.runtime.speculative.verify``), so a bad draft costs
speed, never correctness.

* :class:`PromptLookup` — n-gram matches in the prompt and reply so far;
* :class:`AnswerDrafts` — continuations of earlier answers to similar questions;
* :class:`DraftModel` — a small causal LM with the same vocabulary, whose KV is
  kept between steps and turns and rolled back after a rejection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engine.api import Sampling
from engine.model.kv import KVState, common_prefix, forward
from engine.runtime import sampling


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
            q = sampling.distribution(logits, params)
            token = int(logits.argmax()) if q is None else int(torch.multinomial(q, 1))
            drafts.append(token)
            if q is not None:
                probs.append(q)
            if i + 1 < k:
                logits = forward(self.model, self.state, [token])[-1]
        return drafts, torch.stack(probs) if probs else None
