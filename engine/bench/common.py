"""What the benchmarks share: Markdown tables, medians, a fresh data folder, one synchronous engine, the peer.

The peer (``brisk bench SCENARIO --peer URL``): an OpenAI-compatible server
measured beside the local engine by the same code, through the same
:class:`Client` (:func:`latency_profile`): TTFT cold (the prompt begins with
a new nonce, so no cache holds it beyond the chat template's first tokens),
TTFT warm (the same prompt again at once, so a prompt cache can reuse it) and
decode tokens/s, all measured at the client from submission (the answer cache
is off for these requests).  Only the numbers both sides can give are compared.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from engine.api import AnswerCacheSettings, Done, ModelSpec, Sampling
from engine.client import Client, local_backend


def table(title: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{title}: no rows"
    cols = list(rows[0])
    body = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    return f"\n## {title}\n\n" + markdown_table(cols, body)


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table with columns padded to their widest cell."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in body]
    return "\n".join(lines)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Runner:
    """One local engine, driven synchronously through the shared client.

    The answer cache is off: these benchmarks repeat questions on purpose and measure the model.
    Each ``ask`` names its speculative source, so a table says which decode it measured.
    """

    def __init__(self, model: str | None, dtype: str | None = None, draft: str = "", quant: str = "none") -> None:
        self.client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
        self.loaded = self.client.load(ModelSpec(source=model or "", dtype=dtype or "auto", draft=draft, quant=quant))
        self.model = self.client.backend.loaded  # type: ignore[attr-defined]  # the engine's LoadedModel
        assert self.model is not None

    def ask(self, messages: list[dict[str, str]], max_tokens: int = 64, *, speculative: str, **kw: Any) -> Done:
        """One greedy reply; every scenario names its speculative source (the CLI's default is ``auto``)."""
        return self.client.ask(messages, Sampling(max_tokens=max_tokens), speculative=speculative, **kw)

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def fresh_data_dir() -> Iterator[str]:
    """Point BRISK_DATA_DIR at an empty temporary folder for the block, so first loads are real."""
    previous = os.environ.get("BRISK_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="brisk-bench-") as fresh:
        os.environ["BRISK_DATA_DIR"] = fresh
        try:
            yield fresh
        finally:
            if previous is None:
                os.environ.pop("BRISK_DATA_DIR", None)
            else:
                os.environ["BRISK_DATA_DIR"] = previous


LONG_SYSTEM = " ".join(
    f"Policy {i + 1}: requests about topic {i + 1} are answered within {i % 5 + 1} business days, "
    f"the desk is open from {8 + i % 3}:00 to {17 + i % 4}:00 on weekdays, and no exceptions are promised."
    for i in range(40)
)  # about 1,900 tokens with the chat template: the peer comparisons' long shared system prompt
PEER_EXTRA = {"repeat_penalty": 1.0}  # plain greedy on llama.cpp's servers too (llama-cpp-python defaults to 1.1)

PEER_PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "List three tips for learning a new language.",
]


def latency_profile(
    client: Client, system: str, runs: int, max_tokens: int = 64, speculative: str = "off"
) -> dict[str, Any]:
    """TTFT cold and warm (ms) and decode tok/s, medians over ``runs`` rounds of ``PEER_PROMPTS``.

    ``speculative`` is the local engine's source (a server ignores it and decodes its own way).
    """
    cold: list[float] = []
    warm: list[float] = []
    speed: list[float] = []
    sampling = Sampling(max_tokens=max_tokens)
    for _ in range(runs):
        for prompt in PEER_PROMPTS:
            nonce = uuid.uuid4().hex[:12]
            messages = [
                {"role": "system", "content": f"[session {nonce}] {system}"},
                {"role": "user", "content": prompt},
            ]
            conversation = uuid.uuid4().hex
            for times in (cold, warm):
                done = client.ask(
                    messages, sampling, conversation_id=conversation, answer_cache=False, speculative=speculative
                )
                if done.metrics.ttft_s is not None:
                    times.append(1000 * done.metrics.ttft_s)
                if done.metrics.tokens_per_s:
                    speed.append(done.metrics.tokens_per_s)
    return {
        "ttft_cold_ms": median(cold),
        "ttft_warm_ms": median(warm),
        "decode_tok_s": median(speed),
        "samples": len(cold),
    }


def peer_rows(local: dict[str, Any], peer: dict[str, Any], peer_label: str) -> list[dict[str, Any]]:
    """The comparison as table rows: one per measure, the local engine and the peer as columns."""
    measures = [
        ("TTFT cold, ms (median)", "ttft_cold_ms"),
        ("TTFT warm, ms (median)", "ttft_warm_ms"),
        ("decode tok/s (median)", "decode_tok_s"),
        ("samples", "samples"),
    ]
    return [{"measure": name, "brisk (local)": local[key], peer_label: peer[key]} for name, key in measures]


def server_ttft(client: Any, model: str, messages: list[dict[str, str]], max_tokens: int = 8) -> float | None:
    """Seconds to the first text of a greedy streamed chat completion from an OpenAI-compatible server
    (``client``: an ``openai.OpenAI``); None when none came."""
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - began
    return first
