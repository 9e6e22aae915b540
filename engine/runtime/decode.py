"""The outer generator: a reply's events and its result, from the model's token steps.

``Decoder(model, tokenizer, eos_ids)`` holds what outlives one reply (the
speculative :class:`~engine.runtime.speculative.Controller`, which learns step
times and draft lengths across requests).  ``Decoder.stream(...)`` wraps
:func:`engine.runtime.steps.generate_steps` the way mlx-lm's
``stream_generate`` wraps ``generate_step``: it yields a ``PrefillProgress``
per prefill chunk and ``Token`` events as text becomes final (through
:class:`~engine.runtime.detokenize.StreamText`, which applies stop strings),
and finally one :class:`DecodeResult` (the text, the finish reason and the
decode's :class:`~engine.api.Metrics`).

It decides when the reply is over, in this order for each token: EOS ("stop",
the token is not part of the reply), a stop string ("stop"), ``max_tokens``
("length"), a loop (``Sampling.stop_repeats``: "repetition"); the steps
ending means the model's context is full ("context");
``cancelled()``, checked after every model step, gives "cancelled".  Sending
the events, and ending the request with ``Done`` or ``Error``, is the engine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.api import Event, Logprob, Metrics, PrefillProgress, Sampling, Thinking, Token, Warning, repeats
from engine.model.kv import KVState
from engine.runtime import sampling
from engine.runtime.detokenize import StreamText
from engine.runtime.grammar import FormatError, Grammar, ToolCalls, compile_format, compile_tool_calls
from engine.runtime.reply_metrics import ReplyMeter
from engine.runtime.speculative import Controller, Drafter
from engine.runtime.steps import FORCED, Prefilled, generate_steps
from engine.runtime.thinking import ThinkingSplit, prompt_opens_thinking
from engine.runtime.token_bytes import piece_bytes


@dataclass
class DecodeResult:
    """The end of a reply: its text, why it ended (``engine.api.FINISH_REASONS``), metrics, token ids."""

    text: str
    finish_reason: str
    metrics: Metrics
    ids: list[int] = field(default_factory=list)
    thinking: str = ""  # the text inside <think>...</think> (``text`` is the answer after it)


class _Names:
    """Token ids as ``Logprob``s: their text and exact bytes (``engine.runtime.token_bytes``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.known: dict[int, tuple[str, tuple[int, ...]]] = {}

    def name(self, token: int) -> tuple[str, tuple[int, ...]]:
        if token not in self.known:
            raw = piece_bytes(self.tokenizer, token)
            self.known[token] = (raw.decode("utf-8", "replace"), tuple(raw))
        return self.known[token]

    def logprob(self, token: int, logprob: float, top: list[tuple[int, float]]) -> Logprob:
        alternatives = tuple(Logprob(i, *self.name(i), value) for i, value in top)
        return Logprob(token, *self.name(token), logprob, alternatives)


class Decoder:
    def __init__(self, model: Any, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.controller = Controller()  # learns across requests: plain step time, draft lengths
        config = getattr(model, "config", None)
        self.vocab_size = int(getattr(config, "vocab_size", 0) or len(tokenizer))  # the logits' width

    def stream(
        self,
        request_id: str,
        prompt: list[int],
        state: KVState,
        params: Sampling,
        cancelled: Callable[[], bool],
        t0: float,
        drafters: Sequence[Drafter] = (),
        context: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        known: torch.Tensor | None = None,
        thinking: bool = True,
    ) -> Iterator[Event | Warning | DecodeResult]:
        """One reply's events, then its :class:`DecodeResult`; ``state`` holds a strict prefix of ``prompt``,
        or all of it with ``known``, its last token's logits (see ``generate_steps``).

        ``tools`` (the enabled tools' schemas, when the reply has no format of its own): a tool call the
        model opens is written under the tools' schemas (``engine.runtime.grammar.ToolCalls``).

        ``thinking`` (a chat reply's default): text inside ``<think>...</think>`` goes out as ``Thinking`` events,
        apart from the answer's ``Token`` s (``engine.runtime.thinking``); False (a raw prompt): all is text."""
        cached = len(state)
        outside = [token for token, _ in params.logit_bias if token >= self.vocab_size]
        if outside:  # a ValueError: the reply fails saying so, before any model step
            raise ValueError(
                f"logit_bias names token {outside[0]}, outside this model's vocabulary of {self.vocab_size} ids."
            )
        # a format that cannot be used is refused here, before any model step (FormatError, a ValueError)
        grammar: Grammar | ToolCalls | None = None
        if params.format:
            grammar = compile_format(params.format, self.tokenizer, self.vocab_size, self.eos_ids)
        elif tools:
            try:
                grammar = compile_tool_calls(tools, self.tokenizer, self.vocab_size, self.eos_ids)
            except FormatError as exc:  # the calls are parsed and checked afterwards, as without a grammar
                yield Warning("tools", f"Tool calls are not held to their schemas in this reply: {exc}")
        text = StreamText(self.tokenizer, params.stop)
        split = ThinkingSplit(prompt_opens_thinking(self.tokenizer, prompt), enabled=thinking)
        meter = ReplyMeter(t0)
        steps = generate_steps(
            self.model,
            state,
            prompt,
            params,
            generator=sampling.make_generator(params.seed),
            controller=self.controller,
            drafters=drafters,
            context=context,
            grammar=grammar,
            known=known,
        )
        generated: list[int] = []
        pending: list[int] = []  # ids whose text is not final yet
        numbers: list[Logprob] = []  # with params.logprobs: pending's log probabilities
        names = _Names(self.tokenizer) if params.logprobs else None
        finish: str | None = None
        try:
            for item in steps:
                if isinstance(item, Prefilled):
                    meter.prefilled(item)
                    yield PrefillProgress(request_id, time.perf_counter() - t0, item.done, item.total, item.seconds)
                else:
                    meter.step(item)
                    for i, (token, source) in enumerate(item.provenance()):
                        if token in self.eos_ids:
                            finish = "stop"
                            break
                        generated.append(token)
                        pending.append(token)
                        if names is not None:
                            numbers.append(names.logprob(token, *item.logprobs[i]))
                        meter.token()
                        inside = split.inside
                        thought, delta = split.add(text.add([token]))
                        meter.split(inside, split, bool(delta))
                        if thought:
                            yield Thinking(request_id, time.perf_counter() - t0, thought, tuple(pending))
                            pending.clear()
                            numbers.clear()
                        if delta:
                            drafted, forced = source not in (None, FORCED), source == FORCED
                            now = time.perf_counter() - t0
                            yield Token(request_id, now, delta, tuple(pending), drafted, forced, tuple(numbers))
                            pending.clear()
                            numbers.clear()
                        if text.stopped or len(generated) >= params.max_tokens:
                            finish = "stop" if text.stopped else "length"
                            break
                        if params.stop_repeats and repeats(generated, params.stop_repeats):
                            finish = "repetition"
                            break
                    if finish:
                        break
                if cancelled():
                    finish = "cancelled"
                    break
        finally:
            steps.close()  # no model step runs after the reply is over
        thought, tail = split.add(text.flush())
        more, rest = split.flush()
        thought, tail = thought + more, tail + rest
        meter.split(False, split, bool(tail))
        if thought:
            yield Thinking(request_id, time.perf_counter() - t0, thought, tuple(pending))
            pending.clear()
            numbers.clear()  # a thought's tokens have no logprobs in the answer
        if tail or pending:
            yield Token(request_id, time.perf_counter() - t0, tail, tuple(pending), logprobs=tuple(numbers))
        if (
            params.format
            and grammar is not None
            and finish in ("length", "context", "repetition")
            and not grammar.complete
        ):
            yield Warning(
                "format",
                f"The reply ended ({finish}) before its format was complete: the output is incomplete. "
                "Raise max tokens, or ask for less.",
            )
        metrics = meter.metrics(len(prompt), cached, self.controller, bool(drafters))
        # the steps run out only when the model's context is full
        yield DecodeResult(split.answer, finish or "context", metrics, generated, split.thinking)

    def run(
        self,
        request_id: str,
        prompt: list[int],
        state: KVState,
        params: Sampling,
        emit: Callable[[Event | Warning], None],
        cancelled: Callable[[], bool],
        t0: float,
        drafters: Sequence[Drafter] = (),
        context: int | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> DecodeResult:
        """:meth:`stream`, with its events sent to ``emit``; returns the result."""
        for item in self.stream(request_id, prompt, state, params, cancelled, t0, drafters, context, tools):
            if isinstance(item, DecodeResult):
                return item
            emit(item)
        raise AssertionError("Decoder.stream ended without a result")
