"""Turn next-token logits into a token id.

``distribution(logits, params, history)`` applies, in order, the repetition
penalty, temperature, top-k and top-p, and returns probabilities (or ``None``
for greedy).  ``pick(logits, ...)`` returns one token id.  The speculative
decoder uses ``distribution`` too, so plain and speculative sampling see the
very same distribution.
"""

from __future__ import annotations

import torch

from engine.api import Sampling


def penalise(logits: torch.Tensor, history: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty over ids in ``history`` (1-D long tensor)."""
    if penalty == 1.0 or history is None or history.numel() == 0:
        return logits
    logits = logits.clone()
    seen = logits.index_select(-1, history)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    logits.index_copy_(-1, history, seen)
    return logits


def distribution(logits: torch.Tensor, params: Sampling, history: torch.Tensor | None = None) -> torch.Tensor | None:
    """Probabilities over the vocabulary for 1-D ``logits``, or None when greedy."""
    logits = penalise(logits.float(), history, params.repetition_penalty)
    if params.temperature <= 0:
        return None
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = sorted_probs.cumsum(-1)
        drop = cumulative - sorted_probs > params.top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def pick(
    logits: torch.Tensor,
    params: Sampling,
    history: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> int:
    if params.temperature <= 0:
        return int(penalise(logits, history, params.repetition_penalty).argmax())
    probs = distribution(logits, params, history)
    assert probs is not None
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.seed()) % (2**63))
    return gen
