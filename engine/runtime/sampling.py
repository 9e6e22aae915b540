"""Turn next-token logits into a token id.

``processed(logits, params, reply)`` is the logits processing, in llama.cpp's
order: OpenAI's ``logit_bias`` added, the repetition penalty (multiplicative,
over the reply's recent tokens), then OpenAI's presence and frequency penalties
(additive, over the whole reply: ``logit - frequency * count - presence * (count
> 0)``).  ``distribution(logits, params, reply)`` adds temperature, top-k and
top-p and returns probabilities (or ``None`` for greedy); ``pick(logits, ...)``
returns one token id; ``logprobs(...)`` the log-softmax of the processed logits
over the temperature (1 when greedy), the numbers ``Sampling.logprobs`` asks
for.  The speculative decoder's check (``speculative.verify``) calls the same
functions with the same reply, so a token is chosen from the very same
distribution however it was proposed.

``reply`` is always the reply's tokens before the one being chosen, never the
prompt.  With ``Sampling.seed`` each position draws from a generator of its
own, ``positional(seed, position)``, so a seeded reply is a function of the
seed alone: a draft is checked by drawing the position's token exactly as a
plain step would and comparing (``speculative.verify``), never by drawing from
a stream shared with the other positions.

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


def processed(logits: torch.Tensor, params: Sampling, reply: Sequence[int] = ()) -> torch.Tensor:
    """1-D ``logits`` after bias and penalties (the very same tensor when none applies)."""
    if params.logit_bias:  # ids past the vocabulary are left out: Decoder.stream refuses them before any step
        pairs = [(token, bias) for token, bias in params.logit_bias if token < logits.numel()]
        ids = torch.tensor([token for token, _ in pairs], dtype=torch.long)
        logits = logits.index_add(-1, ids, torch.tensor([bias for _, bias in pairs], dtype=logits.dtype))
    logits = penalise(logits, recent(reply, params.repetition_penalty), params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and reply:
        ids, counts = torch.tensor(list(reply), dtype=torch.long).unique(return_counts=True)
        minus = counts.to(logits.dtype) * params.frequency_penalty + params.presence_penalty
        logits = logits.index_add(-1, ids, -minus)
    return logits


def distribution(logits: torch.Tensor, params: Sampling, reply: Sequence[int] = ()) -> torch.Tensor | None:
    """Probabilities over the vocabulary for 1-D ``logits`` after ``reply``, or None when greedy."""
    logits = processed(logits.float(), params, reply)
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
    reply: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> int:
    """The token after ``reply``: the processed logits' argmax when greedy, else one draw from
    ``generator`` (with a seed, pass ``positional(seed, len(reply))``)."""
    if params.temperature <= 0:
        return int(processed(logits, params, reply).argmax())
    probs = distribution(logits, params, reply)
    assert probs is not None
    return int(torch.multinomial(probs, 1, generator=generator))


def logprobs(
    logits: torch.Tensor, params: Sampling, reply: Sequence[int], token: int
) -> tuple[float, list[tuple[int, float]]]:
    """``token``'s log probability after ``reply``, and the ``params.top_logprobs`` likeliest (id, log
    probability) pairs, best first: the log-softmax of the processed logits over the temperature (1 when
    greedy), the distribution the sampler draws from; top-k and top-p are left out, so every token keeps a
    finite number (llama.cpp and vLLM give the model's raw softmax by default: docs/features/server.md)."""
    scaled = processed(logits.float(), params, reply)
    if params.temperature > 0:
        scaled = scaled / params.temperature
    log = torch.log_softmax(scaled, dim=-1)
    top: list[tuple[int, float]] = []
    if params.top_logprobs:
        values, ids = torch.topk(log, min(params.top_logprobs, log.numel()))
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return float(log[token]), top


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.seed()) % (2**63))
    return gen


def positional(seed: int, position: int) -> torch.Generator:
    """The generator position ``position`` of a reply seeded with ``seed`` draws from (splitmix64 of the
    pair: neighbouring seeds and positions get unrelated streams)."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    gen = torch.Generator()
    gen.manual_seed((z ^ (z >> 31)) & ((1 << 63) - 1))
    return gen
