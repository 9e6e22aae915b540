"""A/B compare: replay one request under several configurations and measure each.  No Qt, no torch.

A :class:`Config` is what a user can switch for a request: the prefix cache
(on/off), the speculative source (``SOURCES``), the quantization mode
(``QUANT_MODES``; a change reloads the model), streaming (on/off) and prefill while typing (on: before
each measured run the message is handed to the engine as a draft and prefilled, as if it had been typed;
it shows in a cold comparison, where nothing else holds the prompt).
``parse_config("quant=fp16-cpu,stream=off", base)`` reads the command line's
form and raises :class:`ConfigError` naming the choices.

``compare(client, spec, messages, configs, ...)`` replays the same greedy
request (same seed, answer cache off) under each configuration in turn, on one
:class:`~engine.client.Client`, and returns one :class:`Result` each: medians
over ``runs`` measured runs, and whether the text is identical to the first
configuration's.  Times come from the events' own ``t`` (seconds since
submission): ``ttft_s`` is when the user first sees output, the first token's
``t`` when streaming and the ``Done``'s ``t`` when not (the reply then arrives
at once at the end); ``total_s`` is the ``Done``'s ``t``; ``tpot_s``,
``tokens_per_s``, ``acceptance`` and ``cached_tokens`` are the engine's
``Metrics``.

Warm (the default): one unmeasured warm-up run per configuration, then the
measured runs repeat the request in the same conversation, so the prefix cache
(when on) holds its prompt.  Cold: the same warm-up (one-time costs such as
kernel set-up are not counted), then before every measured run the prefix
cache is emptied and a new conversation begins, so the whole prompt is
computed.  The speculative ``answers`` source remembers earlier replies in
both modes.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.api import QUANT_MODES, SOURCES, Done, Error, ModelSpec, Request, Sampling, Token
from engine.client import Client, RequestError

SWITCHES: dict[str, tuple[str, ...]] = {
    "prefix_cache": ("on", "off"),
    "speculative": SOURCES,
    "quant": QUANT_MODES,
    "stream": ("on", "off"),
    "typing": ("on", "off"),
}


class ConfigError(ValueError):
    """A configuration that cannot be read; the message lists the choices."""


@dataclass(frozen=True)
class Config:
    prefix_cache: bool = True
    speculative: str = "off"
    quant: str = "none"
    stream: bool = True
    typing: bool = False  # prefill while typing: the message is prefilled before each run is sent (as typed)

    def to_dict(self) -> dict[str, str]:
        return {
            "prefix_cache": "on" if self.prefix_cache else "off",
            "speculative": self.speculative,
            "quant": self.quant,
            "stream": "on" if self.stream else "off",
            "typing": "on" if self.typing else "off",
        }

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items())


def parse_config(text: str, base: Config) -> Config:
    """``KEY=VALUE[,KEY=VALUE...]`` applied to ``base``; ConfigError says what is wrong and what is allowed."""
    values = base.to_dict()
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(f"--config {text!r}: expected KEY=VALUE, with keys {', '.join(SWITCHES)}")
        if key not in SWITCHES:
            raise ConfigError(f"--config {text!r}: unknown key {key!r}; keys are {', '.join(SWITCHES)}")
        if value not in SWITCHES[key]:
            raise ConfigError(f"--config {text!r}: {key} must be one of {', '.join(SWITCHES[key])}, not {value!r}")
        values[key] = value
    return Config(
        prefix_cache=values["prefix_cache"] == "on",
        speculative=values["speculative"],
        quant=values["quant"],
        stream=values["stream"] == "on",
        typing=values["typing"] == "on",
    )


@dataclass(frozen=True)
class Run:
    """One measured replay."""

    ttft_s: float | None
    total_s: float
    tpot_s: float | None
    tokens_per_s: float | None
    acceptance: float | None
    cached_tokens: int
    text: str


@dataclass(frozen=True)
class Result:
    """One configuration's medians over its runs."""

    config: Config
    ttft_s: float | None
    tpot_s: float | None
    total_s: float | None
    tokens_per_s: float | None
    acceptance: float | None
    cached_tokens: int
    identical: bool  # the text equals the first configuration's
    text: str
    runs: int

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "compare",
            "config": self.config.to_dict(),
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
            "acceptance": self.acceptance,
            "cached_tokens": self.cached_tokens,
            "identical": self.identical,
            "text": self.text,
            "runs": self.runs,
        }


def replay(client: Client, request: Request, stream: bool) -> Run:
    """Send ``request`` and measure it as a user would see it (``stream`` off: all text at the end)."""
    first: float | None = None
    for event in client.stream(request):
        if isinstance(event, Token) and first is None:
            first = event.t
        elif isinstance(event, Error):
            raise RequestError(event)
        elif isinstance(event, Done):
            m = event.metrics
            return Run(
                ttft_s=(first if first is not None else m.ttft_s) if stream else event.t,
                total_s=event.t,
                tpot_s=m.tpot_s,
                tokens_per_s=m.tokens_per_s,
                acceptance=m.acceptance,
                cached_tokens=m.cached_tokens,
                text=event.text,
            )
    raise RuntimeError("the request's events ended without Done or Error")  # Client.stream never does this


def clear_prefix_cache(client: Client) -> None:
    """Empty the local engine's prefix cache (in order with requests) and restore its budget."""
    backend: Any = client.backend
    budget = getattr(getattr(backend, "options", None), "prefix_cache_bytes", None)
    if not hasattr(backend, "set_prefix_budget") or budget is None:
        raise ValueError("This engine cannot empty its prompt cache, so a cold comparison is not possible here.")
    backend.set_prefix_budget(0)
    backend.set_prefix_budget(budget)


def compare(
    client: Client,
    spec: ModelSpec,
    messages: Sequence[dict[str, str]],
    configs: Sequence[Config],
    *,
    max_tokens: int = 64,
    seed: int = 0,
    runs: int = 3,
    cold: bool = False,
    progress: Callable[[str], None] | None = None,
    in_use: str = "",
    documents: Sequence[str] = (),
) -> list[Result]:
    """Replay ``messages`` under each configuration; ``client`` holds ``spec`` loaded (reloaded as ``quant`` asks).

    ``in_use``: the mode the loaded model runs, where ``spec.quant`` does not say it (``auto``): a
    configuration of that mode needs no reload.  ``documents``: the chat's attached documents (each replay
    reads them as the chat's own request did).  Raises LoadError when a quantization mode cannot be loaded
    and RequestError when a reply fails.
    """
    if runs < 1:
        raise ValueError("runs must be 1 or more")
    sampling = Sampling(temperature=0.0, seed=seed, max_tokens=max_tokens)
    loaded_quant = in_use or spec.quant
    results: list[Result] = []
    for number, config in enumerate(configs, start=1):
        say = progress or (lambda _text: None)
        if config.quant != loaded_quant:
            say(f"loading the model with quant={config.quant}")
            client.load(replace(spec, quant=config.quant))
            loaded_quant = config.quant
        conversation = uuid.uuid4().hex

        def request(conversation: str, config: Config = config) -> Request:
            return Request(
                id=uuid.uuid4().hex,
                messages=tuple(messages),
                sampling=sampling,
                conversation_id=conversation,
                prefix_cache=config.prefix_cache,
                speculative=config.speculative,
                answer_cache=False,
                documents=tuple(documents),
            )

        say(f"configuration {number} of {len(configs)} ({config.label()}): warm-up")
        replay(client, request(conversation), config.stream)
        measured = []
        for i in range(runs):
            say(f"configuration {number} of {len(configs)}: run {i + 1} of {runs}")
            if cold:
                clear_prefix_cache(client)
                conversation = uuid.uuid4().hex
            if config.typing:  # as if the message had been typed: prefilled before Send (a local engine only)
                client.prefill_draft(request(conversation))
            measured.append(replay(client, request(conversation), config.stream))
        results.append(summarise(config, measured, results[0].text if results else None))
    return results


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(config: Config, runs: Sequence[Run], first_text: str | None) -> Result:
    text = runs[0].text
    return Result(
        config=config,
        ttft_s=_median([r.ttft_s for r in runs]),
        tpot_s=_median([r.tpot_s for r in runs]),
        total_s=_median([r.total_s for r in runs]),
        tokens_per_s=_median([r.tokens_per_s for r in runs]),
        acceptance=_median([r.acceptance for r in runs]),
        cached_tokens=int(statistics.median(r.cached_tokens for r in runs)),
        identical=first_text is None or text == first_text,
        text=text,
        runs=len(runs),
    )


HEADER = ("configuration", "TTFT s", "TPOT ms", "total s", "tok/s", "acceptance", "reused", "identical")


def rows(results: Sequence[Result]) -> list[tuple[str, ...]]:
    """The table's body as text (the CLI's Markdown, a CSV export), one row per configuration."""

    def num(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
        return "-" if value is None else f"{value * scale:.{digits}f}"

    return [
        (
            r.config.label(),
            num(r.ttft_s),
            num(r.tpot_s, 1000.0, 1),
            num(r.total_s),
            num(r.tokens_per_s, digits=1),
            num(r.acceptance, 100.0, 0) + (" %" if r.acceptance is not None else ""),
            str(r.cached_tokens),
            "yes" if r.identical else "no",
        )
        for r in results
    ]


def markdown(results: Sequence[Result]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines)
