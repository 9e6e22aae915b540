"""``brisk bench project``: a new chat in an open project starts warm, from its prefilled prefix.

A project (``engine.storage.Store.create_project``) has a system prompt and an
attached document (a few hundred tokens each, :data:`SYSTEM` and :func:`document`,
attached through the real document index in a fresh data folder).  Each round,
in an order that alternates (so the machine's drift spreads over both rows), the
first reply of a new chat to the same question with that prompt and document:

* **in the open project (warm)**: opening the project hints its new chat's prompt
  to the engine, as the window does (``app.window.projects``: the prompt with
  :data:`WARM_DRAFT` as a stand-in first message, through ``Engine.hint``); the
  engine prefills it while idle (the time it took is the "prefilled in" column,
  measured from the hint until the engine has no hint work left), then the
  question is sent at once (pasted: no typing prefill of its own);
* **outside it (cold)**: the same messages and document with the prefix cache off,
  every prompt token computed.

Each round's system prompt starts with its own tag, so no round reuses another's
prefix.  TTFT is the engine's (``Metrics.ttft_s``, submission to first token);
cells are "median (min-max)" over ``--runs`` rounds.  The warm reply is checked
token for token against the cold one (greedy: the cache must change nothing).
Speculative decoding and the answer cache are off: this measures the prompt.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from engine.api import Done, Request, Sampling
from engine.bench.common import Runner, fresh_data_dir, markdown_table, median, spread, ttfts

SPECULATIVE = "off"
ASK_TOKENS = 8  # the measured replies: TTFT is what counts
WARM_DRAFT = "Hello"  # the stand-in first message of a project's warm hint (app.window.projects.WARM_DRAFT)
SYSTEM = (
    "You are the planning assistant of a small travel agency. Answer in a few plain sentences, suggest "
    "concrete places and trains, and say when something depends on the season or on the budget. Use the "
    "attached price list for every price you give, and say so when a price is not in it. Never invent "
    "opening hours; tell the traveller to check them. Prefer trains and buses to planes and cars, and keep "
    "each day's travel under four hours. Families with children get one rest day in every four."
)
QUESTION = "We have five days in May and like the sea. Where should we go first?"
ROWS = ("warm", "cold")
LABELS = {"warm": "new chat in the open project (prefilled)", "cold": "new chat outside it, same prompt (cold)"}
FIELDS = ("prompt_tokens", "cached_tokens", "typed_tokens", "computed_tokens", "prefill_s", "ttft_s")


TOWNS = ("Lisbon", "Porto", "Coimbra", "Faro", "Lagos", "Sintra", "Evora", "Braga", "Aveiro", "Tavira")


def document() -> str:
    """The project's attached document: a price list of a few hundred tokens (a line a town of ``TOWNS``)."""
    lines = [
        f"- {town}: double room {60 + 7 * i} EUR a night, train from Lisbon {9 + 3 * i} EUR, "
        f"ferry or bus day trip {12 + i} EUR, museum pass {15 + 2 * i} EUR."
        for i, town in enumerate(TOWNS)
    ]
    return "# Price list, May\n\n" + "\n".join(lines) + "\n"


def wait_for_hints(runner: Runner, limit_s: float = 120.0) -> float:
    """Seconds until the engine has taken the hints queued and prefilled all they ask (polled every 5 ms)."""
    engine = runner.client.backend
    began = time.perf_counter()

    def turn() -> None:
        reached = threading.Event()
        engine.call(lambda _engine: reached.set())  # type: ignore[attr-defined]
        if not reached.wait(limit_s):
            raise RuntimeError("the engine did not get to the end of its queue")

    turn()
    while engine.hints.pending():  # type: ignore[attr-defined]
        if time.perf_counter() - began > limit_s:
            raise RuntimeError("the project's prefill did not finish")
        time.sleep(0.005)
    turn()
    return time.perf_counter() - began


def settle_measurement(runner: Runner, limit_s: float = 600.0) -> None:
    """Wait while a first start's weight-mode measurement runs in the background (it would share the CPU)."""
    engine = runner.client.backend
    began = time.monotonic()
    while getattr(engine, "measuring", None) is not None and time.monotonic() - began < limit_s:
        time.sleep(0.5)


def one_round(runner: Runner, doc: tuple[str, ...], n: int) -> tuple[dict[str, Done], float]:
    """Both rows once, in the order of round ``n``; (their replies, the warm row's prefill seconds)."""
    system = {"role": "system", "content": f"[Project {n + 1:03d}] {SYSTEM}"}
    messages = [system, {"role": "user", "content": QUESTION}]
    prefilled = float("nan")

    def warm() -> Done:
        nonlocal prefilled
        hint = Request(
            uuid.uuid4().hex,
            (system, {"role": "user", "content": WARM_DRAFT}),
            Sampling(max_tokens=ASK_TOKENS),
            conversation_id=f"draft-{uuid.uuid4().hex}",
            answer_cache=False,
            speculative=SPECULATIVE,
            documents=doc,
        )
        runner.client.backend.hint(hint)  # type: ignore[attr-defined]
        prefilled = wait_for_hints(runner)
        return runner.ask(
            messages, ASK_TOKENS, speculative=SPECULATIVE, conversation_id=uuid.uuid4().hex, documents=doc
        )

    def cold() -> Done:
        kw: dict[str, Any] = {"conversation_id": f"cold-{n}", "prefix_cache": False, "documents": doc}
        return runner.ask(messages, ASK_TOKENS, speculative=SPECULATIVE, **kw)

    asks = {"warm": warm, "cold": cold}
    order = ROWS if n % 2 == 0 else ROWS[::-1]
    return {name: asks[name]() for name in order}, prefilled


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.documents.library import DocumentLibrary

    rounds = max(1, args.runs)
    results: dict[str, list[Done]] = {name: [] for name in ROWS}
    prefills: list[float] = []
    # loaded on the data folder in use (its weight-mode record: no background measurement competes), then the
    # document indexed, and its KV kept, in a fresh one
    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")
    try:
        settle_measurement(runner)
        with fresh_data_dir(), tempfile.TemporaryDirectory(prefix="brisk-bench-project-") as folder:
            path = Path(folder) / "prices.md"
            path.write_text(document(), encoding="utf-8")
            attached = DocumentLibrary(embed=lambda texts: None).attach([path])  # a whole document: no embedding
            if not attached or not attached[0].ok:
                raise RuntimeError(f"could not attach the document: {attached}")
            doc = (attached[0].doc_id,)
            runner.ask([{"role": "user", "content": "Hello"}], 4, speculative=SPECULATIVE, prefix_cache=False)  # warm
            for n in range(rounds):
                done, prefilled = one_round(runner, doc, n)
                prefills.append(prefilled)
                for name, reply in done.items():
                    results[name].append(reply)
    finally:
        runner.close()
    return report(results, prefills, runner.loaded.info.quant, rounds)


def report(results: dict[str, list[Done]], prefills: list[float], quant: str, rounds: int) -> dict[str, Any]:
    ttft = ttfts(results)
    body = []
    for name in ROWS:
        m = [d.metrics for d in results[name]]
        body.append(
            [
                LABELS[name],
                spread([x.prompt_tokens for x in m]),
                spread([x.document_tokens for x in m]),
                spread([x.cached_tokens for x in m]),
                spread([x.typed_tokens for x in m]),
                spread([x.computed_tokens for x in m]),
                spread([1000 * p for p in prefills]) if name == "warm" else "-",
                spread([1000 * t for t in ttft[name]]),
            ]
        )
    head = [
        "first reply of",
        "prompt tokens",
        "document tokens",
        "reused",
        "of them prefilled",
        "computed",
        "prefilled in ms",
        "TTFT ms",
    ]
    same = all(w.text == c.text for w, c in zip(results["warm"], results["cold"], strict=True))
    speedup = median(ttft["cold"]) / max(1e-9, median(ttft["warm"]))
    print(f"\n## A new chat in an open project against one outside it ({quant}, {rounds} rounds interleaved)\n")
    print(markdown_table(head, body))
    print(f"\ncold / warm TTFT: {speedup:.1f}x; warm replies identical to cold: {'yes' if same else 'NO'}")
    return {
        "rows": {name: [{k: getattr(d.metrics, k) for k in FIELDS} for d in results[name]] for name in ROWS},
        "prefilled_s": prefills,
        "cold_over_warm": speedup,
        "identical": same,
        "rounds": rounds,
    }
