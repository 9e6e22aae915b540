"""The decode loop: prefill in chunks, then one token per model step.

``Decoder.run(...)`` takes prompt token ids and a
:class:`~engine.model.kv.KVState` that may already hold a prefix of them (from
the KV or prefix cache), computes only the rest, then samples (one token per
step, or a verified speculative draft) until EOS, a stop string, ``max_tokens``,
the model's context or cancel.  It emits ``PrefillProgress`` and ``Token``
events and returns a :class:`DecodeResult` with typed :class:`~engine.api.Metrics`;
the engine sends ``Done`` or, if anything raises, ``Error``.  Cancel is checked
after every model step.  All times come from ``time.perf_counter()`` relative
to ``t0``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.api import DraftStats, Event, Metrics, PrefillProgress, Sampling, Token
from engine.model.kv import KVState, forward
from engine.runtime import sampling
from engine.runtime.speculative import Controller, Drafter, verify

Emit = Callable[[Event], None]
PREFILL_CHUNK = 256


@dataclass
class StreamText:
    """Incremental detokenizer with stop strings; emits only text that is final."""

    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    stopped: bool = False

    def add(self, ids: list[int]) -> str:
        """Append token ids; return the new text that can be shown now."""
        self.ids.extend(ids)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        safe = len(self.text)
        for stop in self.stop:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.stopped, safe = self.text[:at], True, at
                break
        if not self.stopped:
            if self.text.endswith("\ufffd"):  # a multi-byte character is not complete yet
                safe = len(self.text.rstrip("\ufffd"))
            hold = max((len(s) - 1 for s in self.stop), default=0)
            safe = max(self.emitted, min(safe, len(self.text) - hold))
        return self.flush(safe)

    def flush(self, upto: int | None = None) -> str:
        upto = len(self.text) if upto is None else upto
        delta = self.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return delta


@dataclass
class DecodeResult:
    text: str
    finish_reason: str
    metrics: Metrics
    ids: list[int] = field(default_factory=list)


class Decoder:
    def __init__(self, model: Any, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.controller = Controller()  # learns across requests: plain step time, draft lengths

    def prefill(
        self,
        state: KVState,
        prompt: list[int],
        emit: Emit,
        request_id: str,
        t0: float,
        cancelled: Callable[[], bool],
    ) -> torch.Tensor | None:
        """Compute the prompt tokens ``state`` lacks; return the last position's logits."""
        start = len(state)
        logits = None
        for begin in range(start, len(prompt), PREFILL_CHUNK):
            chunk = prompt[begin : begin + PREFILL_CHUNK]
            logits = forward(self.model, state, chunk)
            emit(PrefillProgress(request_id, time.perf_counter() - t0, begin + len(chunk), len(prompt)))
            if cancelled():
                return None
        return logits

    def run(
        self,
        request_id: str,
        prompt: list[int],
        state: KVState,
        params: Sampling,
        emit: Emit,
        cancelled: Callable[[], bool],
        t0: float,
        drafters: Sequence[Drafter] = (),
        context: int | None = None,
    ) -> DecodeResult:
        """Decode one reply; ``context`` (the model's length) ends it with ``finish_reason="context"``."""
        reused = len(state)
        assert reused < len(prompt) and state.tokens == prompt[:reused], "state must hold a strict prefix"
        generator = sampling.make_generator(params.seed)
        stream = StreamText(self.tokenizer, params.stop)
        control = self.controller
        t_prefill = time.perf_counter()
        logits = self.prefill(state, prompt, emit, request_id, t0, cancelled)
        prefill_s = time.perf_counter() - t_prefill
        generated: list[int] = []
        finish = "cancelled"
        ttft = None
        t_first = time.perf_counter()
        draft_steps = 0
        per_source: dict[str, list[int]] = {}  # source -> [drafted, accepted, steps]
        token_times: list[float] = []  # since t0, one per generated token
        pending_ids: list[int] = []
        limit = context or 1 << 62  # positions the model can hold

        def take(token: int, from_draft: bool) -> str | None:
            """Add one token to the reply; return a finish reason when the reply is over."""
            if token in self.eos_ids:
                return "stop"
            generated.append(token)
            token_times.append(time.perf_counter() - t0)
            pending_ids.append(token)
            delta = stream.add([token])
            if delta:
                emit(Token(request_id, time.perf_counter() - t0, delta, tuple(pending_ids), from_draft))
                pending_ids.clear()
            if stream.stopped:
                return "stop"
            if len(generated) >= params.max_tokens:
                return "length"
            if len(prompt) + len(generated) >= limit:
                return "context"
            return None

        if logits is not None:
            token = sampling.pick(logits[-1], params, self._history(prompt, [], params), generator)
            ttft = time.perf_counter() - t0
            t_first = time.perf_counter()
            reason = take(token, False)
            while reason is None and not cancelled():
                drafts: list[int] = []
                probs = None
                source = ""
                for drafter in drafters:
                    room = min(params.max_tokens - len(generated), limit - len(prompt) - len(generated)) - 1
                    k = min(control.draft_length(drafter.name), room)
                    if k > 0:
                        drafts, probs = drafter.propose(prompt + generated, k, params)
                        drafts = drafts[:k]
                        if drafts:
                            source = drafter.name
                            break
                step_start = time.perf_counter()
                logits = forward(self.model, state, [token, *drafts], all_logits=bool(drafts))
                if drafts:
                    n_ok, token = verify(logits, drafts, probs, params, prompt + generated, generator)
                    state.crop(len(state) - (len(drafts) - n_ok))
                    control.record(source, len(drafts), n_ok, time.perf_counter() - step_start)
                    draft_steps += 1
                    stats = per_source.setdefault(source, [0, 0, 0])
                    stats[0] += len(drafts)
                    stats[1] += n_ok
                    stats[2] += 1
                    for d in drafts[:n_ok]:
                        reason = take(d, True)
                        if reason:
                            break
                    if reason:
                        break
                else:
                    token = sampling.pick(logits[-1], params, self._history(prompt, generated, params), generator)
                    control.record_plain(time.perf_counter() - step_start)
                reason = take(token, False)
            finish = reason or "cancelled"
        tail = stream.flush()
        if tail or pending_ids:
            emit(Token(request_id, time.perf_counter() - t0, tail, tuple(pending_ids)))
        end = time.perf_counter()
        decode_s = end - t_first
        n = len(generated)
        drafted = sum(v[0] for v in per_source.values())
        accepted_total = sum(v[1] for v in per_source.values())
        gaps = sorted(b - a for a, b in zip(token_times, token_times[1:], strict=False))
        speedup = None
        if drafters and control.plain_step_s and n > 1 and decode_s > 0:
            # measured plain step time x tokens, against the time the reply actually took
            speedup = control.plain_step_s * (n - 1) / decode_s
        metrics = Metrics(
            prompt_tokens=len(prompt),
            cached_tokens=reused,
            computed_tokens=len(prompt) - reused,
            prefill_s=prefill_s,
            ttft_s=ttft,
            completion_tokens=n,
            decode_s=decode_s,
            tpot_s=decode_s / (n - 1) if n > 1 else None,
            tpot_p50_s=_quantile(gaps, 0.5),
            tpot_p95_s=_quantile(gaps, 0.95),
            tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            total_s=end - t0,
            drafted=drafted,
            accepted=accepted_total,
            acceptance=accepted_total / drafted if drafted else None,
            accepted_per_step=accepted_total / draft_steps if draft_steps else None,
            draft_sources={k: DraftStats(v[0], v[1], v[2]) for k, v in per_source.items()},
            plain_step_s=control.plain_step_s if speedup is not None else None,
            speedup=speedup,
        )
        return DecodeResult(stream.text, finish, metrics, generated)

    @staticmethod
    def _history(prompt: list[int], generated: list[int], params: Sampling) -> torch.Tensor | None:
        return torch.tensor(prompt + generated) if params.repetition_penalty != 1.0 else None


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of already sorted values (nearest rank), or None when there are none."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]
