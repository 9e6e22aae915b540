"""The acceptance rule of speculative decoding, as one pure function.

``verify(logits, drafts, draft_probs, params, reply, generator)`` takes the
target model's logits for the positions of ``k`` drafted tokens plus one, and
returns ``(accepted, next_token)``: the first ``accepted`` drafts stand and
``next_token`` is the target's own token after them.  It reads nothing but its
arguments and changes nothing but ``generator``'s state, so a reply's tokens
follow exactly the target's distribution whichever drafter proposed them.
"""

from __future__ import annotations

import torch

from engine.api import Sampling
from engine.runtime import sampling


def verify(
    logits: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    params: Sampling,
    reply: list[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Check ``drafts`` against target ``logits`` (``[len(drafts) + 1, vocab]``).

    ``draft_probs`` (``[len(drafts), vocab]``) is the drafter's distribution q
    for each draft, or None for a deterministic drafter (prompt lookup, earlier
    answers), whose q is one-hot.  ``reply`` is the reply's tokens before the
    drafts: row i is processed after ``reply + drafts[:i]`` (``sampling.processed``:
    bias, the repetition penalty's window, presence and frequency counts), exactly
    as a plain step would.  With ``params.seed`` a sampled row is checked like a
    greedy one, against the position's own draw, and ``generator`` is not used.
    """
    k = len(drafts)
    plain = params.repetition_penalty == 1.0 and not (
        params.logit_bias or params.presence_penalty or params.frequency_penalty
    )

    if params.temperature <= 0 or params.seed is not None:
        # Greedy: the target's token at row i is t_i = argmax of row i processed as a plain step after
        # reply + drafts[:i] would process it (``sampling.processed``).  Seeded: t_i is the draw a plain
        # step makes at that position from its own generator (``sampling.positional``), so checking a
        # draft takes nothing from any other position's randomness.  Draft i stands iff drafts[i] == t_i
        # for it and every draft before it; the first mismatch is replaced by t_i, and when all k stand,
        # row k gives one more token (the "bonus").  Plain decoding would have produced t_0, t_1, ... one
        # step at a time, so the output is identical token for token.
        if params.temperature <= 0 and plain:
            targets = logits.argmax(-1).tolist()
        else:
            targets = []
            for i in range(k + 1):
                before = reply + drafts[:i]
                seeded = None if params.seed is None else sampling.positional(params.seed, len(before))
                targets.append(sampling.pick(logits[i], params, before, seeded))
                if i < k and targets[i] != drafts[i]:
                    break
        accepted = 0
        while accepted < k and drafts[accepted] == targets[accepted]:
            accepted += 1
        return accepted, targets[accepted]

    # Sampling (Leviathan et al. 2023; Chen et al. 2023).  With p the target's distribution and q
    # the drafter's at a position, accept draft x with probability min(1, p(x) / q(x)); on
    # rejection draw from the residual r = max(p - q, 0) / sum(max(p - q, 0)).  Then
    #   P(token = y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x q(x) min(1, p(x)/q(x))) r(y)
    #                = min(q(y), p(y)) + (sum_x max(p(x) - q(x), 0)) r(y)
    #                = min(q(y), p(y)) + max(p(y) - q(y), 0) = p(y),
    # so every emitted token has exactly the target's distribution.  A deterministic drafter has
    # q = one-hot(x): acceptance is p(x) and the residual is p with x removed.
    for i, x in enumerate(drafts):
        p = sampling.distribution(logits[i], params, reply + drafts[:i])
        assert p is not None
        q_x = float(draft_probs[i, x]) if draft_probs is not None else 1.0
        # u < p(x) / q(x), written as u * q(x) < p(x) so that q(x) = 0 never divides
        if float(torch.rand((), generator=generator)) * q_x < float(p[x]):
            continue
        if draft_probs is not None:
            residual = (p - draft_probs[i]).clamp_min(0)
        else:
            residual = p.clone()
            residual[x] = 0
        if float(residual.sum()) <= 0:  # p == q up to rounding: any draw from p is right
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    # every draft stood: the bonus token is a plain draw from p at row k
    p = sampling.distribution(logits[k], params, reply + drafts)
    assert p is not None
    return k, int(torch.multinomial(p, 1, generator=generator))
