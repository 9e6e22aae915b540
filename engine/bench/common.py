"""What the benchmarks share: one Markdown table, one median (and percentile, and spread), one cold question
in a new process, a fresh data folder, one synchronous engine, the peer.

Every benchmark prints its tables with :func:`markdown_table` (or :func:`table`, from dict rows), takes its
medians with :func:`median`, its percentiles with :func:`percentile` (linear interpolation, numpy's
default) and writes "median (min-max)" cells with :func:`spread`.  :func:`ask_in_new_process` is the one
"first question of a new process": ``brisk ask QUESTION --json`` (``python -m app.cli``, what the installed
``brisk`` runs) on the data folder in use or a given one, timed from launch; :func:`run_python` runs a
snippet in a new interpreter (an import or load time).  This module imports only the standard library and
``engine.api``/``engine.client`` (which import no torch), so a script run in a scratch environment
(``python -m engine.bench.server_frameworks``) can use it too.

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
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


def median(values: Iterable[float]) -> float:
    """The median; NaN for no values (a row that measured nothing shows ``nan``, not a crash)."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated linearly between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ttfts(results: dict[str, list[Done]]) -> dict[str, list[float]]:
    """Each row's replies' TTFTs in seconds (replies without one left out)."""
    return {name: [d.metrics.ttft_s for d in done if d.metrics.ttft_s is not None] for name, done in results.items()}


def spread(values: Iterable[float | None], fmt: str = "{:,.0f}") -> str:
    """``median (min-max)`` of the values that are not None, each written with ``fmt``; ``-`` for none."""
    good = [v for v in values if v is not None]
    if not good:
        return "-"
    return f"{fmt.format(median(good))} ({fmt.format(min(good))}-{fmt.format(max(good))})"


BRISK = [sys.executable, "-m", "app.cli"]  # what the installed ``brisk`` runs (app.cli:main)


@dataclass(frozen=True)
class ColdAsk:
    """One ``brisk ask --json`` in a new process, timed at this end from launch."""

    metrics: dict[str, Any]  # the done event's metrics; empty when no done event came
    first_token_s: float | None  # launch to the first token event read here
    total_s: float  # launch to the process's exit
    peak_rss_bytes: int  # the child's own peak resident memory
    returncode: int
    stderr: str = field(repr=False)

    def done(self) -> dict[str, Any]:
        """The done event's metrics; RuntimeError with the end of stderr when the ask failed."""
        if not self.metrics:
            raise RuntimeError(f"brisk ask failed ({self.returncode}): {self.stderr.strip()[-500:]}")
        return self.metrics


def ask_in_new_process(
    question: str, flags: Sequence[str] = (), *, data_dir: str | Path | None = None, timeout_s: float = 600
) -> ColdAsk:
    """``brisk ask QUESTION --json FLAGS`` in a new process, offline, on ``data_dir`` (default: the one in use).

    The one cold-question harness of the benchmarks: what a user's first question in a new process costs,
    imports and load included.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if data_dir is not None:
        env["BRISK_DATA_DIR"] = str(data_dir)
    metrics: dict[str, Any] = {}
    first: float | None = None
    with tempfile.TemporaryFile(mode="w+") as errors:
        began = time.perf_counter()
        proc = subprocess.Popen(
            [*BRISK, "ask", question, "--json", *flags], stdout=subprocess.PIPE, stderr=errors, text=True, env=env
        )
        killer = threading.Timer(timeout_s, proc.kill)
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                if event.get("type") == "token" and first is None:
                    first = time.perf_counter() - began
                elif event.get("type") == "done":
                    metrics = dict(event["metrics"])
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KB on Linux)
            total = time.perf_counter() - began
        finally:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        stderr = errors.read()
    return ColdAsk(metrics, first, total, usage.ru_maxrss * 1024, proc.returncode, stderr)


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
    """Send ``process`` ``sig`` (SIGTERM; SIGINT stops a pytest as Ctrl+C does, its report written) and wait
    ``grace`` seconds for it to end, then kill it."""
    process.send_signal(sig)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_python(code: str, env: dict[str, str] | None = None, cwd: str | Path | None = None) -> str:
    """Run ``code`` in a new interpreter (this one's executable) and return what it printed."""
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=merged, cwd=cwd
    ).stdout


RESULTS = Path("bench/results")  # where benchmarks write their JSON, from the folder they run in (the root)


def save(name: str, data: Any, out: str | Path | None = None) -> Path:
    """Write a benchmark's JSON to ``out`` (default ``bench/results/NAME.json``); the path written."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


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
