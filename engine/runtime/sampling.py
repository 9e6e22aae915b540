"""Turn next-token logits into a token id.

``distribution(logits, params, history)`` applies, in order, the repetition
penalty, temperature, top-k and top-p, and returns probabilities (or ``None``
for greedy).  ``pick(logits, ...)`` returns one token id.  The speculative
decoder uses ``distribution`` too, so plain and speculative sampling see the
very same distribution.

The repetition penalty counts ``recent(reply, penalty)``: the reply's own last
``PENALTY_WINDOW`` tokens (llama.cpp's ``repeat_last_n`` is 64 too), never the
prompt.  Counting the prompt made a grounded reply avoid the very words of the
document, system prompt or pasted text it should quote, and made prompt lookup's
drafts (which are those words) fail.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.api import Sampling

PENALTY_WINDOW = 64  # the reply's last tokens the repetition penalty counts


def recent(reply: Sequence[int], penalty: float) -> torch.Tensor | None:
    """The ids the repetition penalty counts after ``reply`` (the reply's tokens so far, no prompt):
    its last ``PENALTY_WINDOW`` tokens, or None when the penalty is off or nothing was said yet."""
    if penalty == 1.0 or not reply:
        return None
    return torch.tensor(list(reply[-PENALTY_WINDOW:]), dtype=torch.long)


def penalise(logits: torch.Tensor, history: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty over the ids in ``history`` (1-D long tensor, from :func:`recent`):
    each such id's logit is divided by ``penalty`` when positive, multiplied when not, once however often
    it occurs."""
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
