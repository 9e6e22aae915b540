"""The decode loop: prefill in chunks, then one token per model step.

``Decoder.run(request, state, emit, cancelled)`` takes prompt token ids and a
:class:`~engine.kv.KVState` that may already hold a prefix of them (from the KV
or prefix cache), computes only the rest, then samples until EOS, a stop
string, ``max_tokens`` or cancel.  It emits ``PrefillProgress``, ``Token`` and
finally ``Done`` (never ``Error``: the engine wraps exceptions).  Cancel is
checked after every model step.  All times come from ``time.perf_counter()``
relative to ``t0``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine import sampling
from engine.events import Done, Event, PrefillProgress, Sampling, Token
from engine.kv import KVState

Emit = Callable[[Event], None]
PREFILL_CHUNK = 256


@torch.inference_mode()
def forward(model: Any, state: KVState, ids: list[int], all_logits: bool = False) -> torch.Tensor:
    """Run ``ids`` through the model on top of ``state``; return logits [n, vocab] (or [1, vocab])."""
    device = model.device
    out = model(
        input_ids=torch.tensor([ids], device=device),
        cache=state.cache,
        use_cache=True,
        logits_to_keep=0 if all_logits else 1,
    )
    state.tokens.extend(ids)
    return out.logits[0].float()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ta, tb = torch.tensor(a[:n]), torch.tensor(b[:n])
    diff = (ta != tb).nonzero()
    return int(diff[0]) if diff.numel() else n


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
    metrics: dict[str, Any]


class Decoder:
    def __init__(self, model: Any, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

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
    ) -> DecodeResult:
        reused = len(state)
        assert reused < len(prompt) and state.tokens == prompt[:reused], "state must hold a strict prefix"
        generator = sampling.make_generator(params.seed)
        stream = StreamText(self.tokenizer, params.stop)
        t_prefill = time.perf_counter()
        logits = self.prefill(state, prompt, emit, request_id, t0, cancelled)
        prefill_s = time.perf_counter() - t_prefill
        generated: list[int] = []
        pending: list[int] = []  # ids not yet carried by a Token event
        history = torch.tensor(prompt)
        finish = "cancelled"
        ttft = None
        t_first = time.perf_counter()
        while logits is not None:
            token = sampling.pick(logits[-1], params, history if params.repetition_penalty != 1.0 else None, generator)
            if ttft is None:
                ttft = time.perf_counter() - t0
                t_first = time.perf_counter()
            if token in self.eos_ids:
                finish = "stop"
                break
            generated.append(token)
            pending.append(token)
            delta = stream.add([token])
            if delta:
                emit(Token(request_id, time.perf_counter() - t0, delta, tuple(pending)))
                pending.clear()
            if stream.stopped:
                finish = "stop"
                break
            if len(generated) >= params.max_tokens:
                finish = "length"
                break
            if cancelled():
                break
            if params.repetition_penalty != 1.0:
                history = torch.cat([history, torch.tensor([token])])
            logits = forward(self.model, state, [token])
        tail = stream.flush()
        if tail or pending:
            emit(Token(request_id, time.perf_counter() - t0, tail, tuple(pending)))
        end = time.perf_counter()
        decode_s = end - t_first
        n = len(generated)
        metrics = {
            "prompt_tokens": len(prompt),
            "cached_tokens": reused,
            "computed_tokens": len(prompt) - reused,
            "prefill_s": prefill_s,
            "ttft_s": ttft,
            "completion_tokens": n,
            "decode_s": decode_s,
            "tpot_s": decode_s / (n - 1) if n > 1 else None,
            "tokens_per_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            "total_s": end - t0,
        }
        return DecodeResult(stream.text, finish, metrics)


def done_event(request_id: str, t0: float, result: DecodeResult) -> Done:
    return Done(request_id, time.perf_counter() - t0, result.text, result.finish_reason, result.metrics)
