"""``brisk bench versus --peer URL``: Brisk as installed against a peer server on the same model, side by side.

What a user who runs llama.cpp today compares, measured by the same client code
at the client, greedy, interleaved prompt by prompt (each prompt on every column
before the next) so drift hits each column alike:

* decode tok/s on **open prompts** of many kinds (``OPEN``: a story, an
  explanation for a child, interview tips, a description, an email, a recipe, a
  comparison, a how-to, a poem, a list of ideas), none chosen because it drafts
  well, and on **grounded prompts** (``GROUNDED``: rewrite, code edit, summary,
  extraction from a given text), each reported as the median and the range;
* TTFT on a long (~1,900-token) system prompt: cold (no cache holds it) and
  warm (a new chat with the same system prompt and another question);
* **the first question of a new process**: ``brisk ask`` run as a user runs it
  (a new process on the data folder in use, answer cache on, ``quant`` and the
  speculative source as installed), a question it has never seen, TTFT and
  decode from its ``--json`` metrics; the peer's row is its answer to the same
  question (its process is already running, as a server's is).  The two local
  columns take turns going first, round by round (the first new process after a
  round's engines closed was the as-installed one in every round, and its TTFT
  was 35-50 ms above speculation off's in three sittings on two CPUs, while
  ``brisk ask`` alone, alternating, measured no difference).
* with ``--draft-model FILE``: a column with that draft model (speculative
  ``draft``, in a process of its own) and its acceptance on open and grounded
  prompts (the seed's headline case: the 0.5B Qwen2.5-Coder drafting for the 1.5B).

Columns:

- ``brisk (as installed)``: the local engine as ``make run`` starts it: the
  ``auto`` quantization mode (measured at first load, see ``brisk doctor``;
  ``--quant`` picks another) and the settings' speculative source (``auto``);
- ``brisk (speculation off)``: the same engine with speculative decoding off;
- with ``--also-quant MODE``: another engine in that mode, speculation off (to
  compare weight modes in the same sitting), in a child process
  (:mod:`engine.bench.child`: an idle engine in the same process slows the
  measured one by about a third);
- the peer (``--peer URL``, for example llama-cpp-python's or llama.cpp's
  server on the same GGUF), sent ``repeat_penalty`` 1.0 so that it decodes
  plain greedy as Brisk does (llama-cpp-python's server defaults to 1.1).

Each round starts new local engines, so the ``answers`` draft source never
drafts from the previous round's reply to the same prompt: every prompt is
new to the engine, as a new question is to a user.  Without ``--peer`` the
peer column is left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import uuid
from pathlib import Path
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec, Sampling
from engine.bench.child import ChildEngine
from engine.bench.common import LONG_SYSTEM, PEER_PROMPTS, ask_in_new_process, median, table
from engine.bench.speculative import ARTICLE, CODE
from engine.client import Client, local_backend
from engine.storage.settings import Settings

OPEN = {
    "story": "Write a short story about a fox who learns to sail.",
    "explain to a child": "Explain to a ten-year-old how a rainbow forms.",
    "interview tips": "Give me some tips for a job interview at a bakery.",
    "description": "Describe a busy train station early in the morning.",
    "email": "Write an email to my landlord asking to fix the heating.",
    "recipe": "How do I make a simple tomato soup?",
    "comparison": "What are the pros and cons of cycling to work?",
    "how-to": "How do I change a flat tyre on a bicycle?",
    "poem": "Write a poem about autumn leaves.",
    "ideas": "Suggest some names for a small bookshop.",
}
GROUNDED = {
    "rewrite": f"Rewrite the following text with British spelling, keeping everything else the same:\n\n{ARTICLE}",
    "code edit": f"Rename the function total_price to order_total in this code and return the full code:\n\n{CODE}",
    "summary": f"Summarise this text in three sentences:\n\n{ARTICLE}",
    "extract": f"List every number that appears in this text, one per line, with what it counts:\n\n{ARTICLE}",
}
FIRST = [  # new questions for the first-question rows, one per column and round, each with a fresh nonce
    "What should I pack for a weekend of camping in the mountains?",
    "Why do cats purr?",
    "How can I keep basil alive on a windowsill?",
    "What is a good way to start learning to draw?",
    "Why does bread go stale?",
    "How do bees make honey?",
    "What makes a good cup of tea?",
    "How do I stop my glasses from fogging up?",
    "Why do leaves change colour in autumn?",
]


def items() -> list[tuple[str, str, str | int]]:
    """One round's measurements, in order: (kind, name, what): decode prompts, then TTFT questions."""
    decode: list[tuple[str, str, str | int]] = [
        (kind, name, prompt)
        for kind, prompts in (("open", OPEN), ("grounded", GROUNDED))
        for name, prompt in prompts.items()
    ]
    return decode + [("ttft", f"ttft {i}", i) for i in range(len(PEER_PROMPTS))]


def measure_item(
    client: Client, speculative: str, item: tuple[str, str, str | int], max_tokens: int
) -> dict[str, list[float]]:
    """One measurement on one column: a decode prompt's tok/s (and a draft model's acceptance), or one TTFT
    question cold and warm."""
    kind, name, what = item
    out: dict[str, list[float]] = {}
    if kind != "ttft":
        done = client.ask(
            [{"role": "user", "content": str(what)}],
            Sampling(max_tokens=max_tokens),
            conversation_id=uuid.uuid4().hex,
            speculative=speculative,
            answer_cache=False,
        )
        if done.metrics.tokens_per_s:
            out[kind] = [done.metrics.tokens_per_s]
            out[f"{kind}: {name}"] = [done.metrics.tokens_per_s]
        if speculative == "draft":  # how much was drafted (the source pauses while drafting does not pay), and kept
            out[f"{kind} drafted"] = [float(done.metrics.drafted or 0)]
            if done.metrics.acceptance is not None:
                out[f"{kind} acceptance"] = [100 * done.metrics.acceptance]
        return out
    i = int(what)
    system = f"[session {uuid.uuid4().hex[:12]}] {LONG_SYSTEM}"
    # cold: a system prompt no cache holds; warm: a new chat with that system prompt and another question
    follow_up = PEER_PROMPTS[(i + 1) % len(PEER_PROMPTS)]
    for key, question in (("ttft_cold_ms", PEER_PROMPTS[i]), ("ttft_warm_ms", follow_up)):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        done = client.ask(
            messages,
            Sampling(max_tokens=16),
            conversation_id=uuid.uuid4().hex,
            speculative=speculative,
            answer_cache=False,
        )
        if done.metrics.ttft_s is not None:
            out[key] = [1000 * done.metrics.ttft_s]
    return out


def first_question(question: str, args: argparse.Namespace, max_tokens: int, speculative: str | None) -> dict[str, Any]:
    """``brisk ask QUESTION --json`` in a new process, as installed (answer cache on): its Done metrics."""
    flags = ["--max-tokens", str(max_tokens)]
    for flag in ("model", "dtype", "quant"):
        if getattr(args, flag, None):
            flags += [f"--{flag}", str(getattr(args, flag))]
    if speculative:
        flags += ["--speculative", speculative]
    return ask_in_new_process(question, flags).done()


def measure_first(
    round_number: int, args: argparse.Namespace, max_tokens: int, sides: list[tuple[str, Client | None, str]]
) -> dict[str, dict[str, list[float]]]:
    """The first-question row for each column: a new ``brisk ask`` process, or the peer's reply.

    Each column gets its own question (an answer the column before kept must not serve it) that no
    earlier run asked: a nonce in brackets at its end."""
    out: dict[str, dict[str, list[float]]] = {}
    for i, (label, client, speculative) in enumerate(sides):
        question = f"{FIRST[(round_number * len(sides) + i) % len(FIRST)]} [{uuid.uuid4().hex[:6]}]"
        if client is None:  # a local column: a new process
            metrics = first_question(question, args, max_tokens, None if speculative == "as installed" else speculative)
            ttft, speed = metrics.get("ttft_s"), metrics.get("tokens_per_s")
        else:
            done = client.ask(
                [{"role": "user", "content": question}],
                Sampling(max_tokens=max_tokens),
                conversation_id=uuid.uuid4().hex,
                speculative="off",
                answer_cache=False,
            )
            ttft, speed = done.metrics.ttft_s, done.metrics.tokens_per_s
        row = out.setdefault(label, {})
        if ttft is not None:
            row["first_ttft_ms"] = [1000 * float(ttft)]
        if speed:
            row["first_tok_s"] = [float(speed)]
    return out


def peer_client(args: argparse.Namespace) -> Client | None:
    """The ``--peer`` server's client (plain greedy there too), or None without one; LoadError says why not."""
    if not getattr(args, "peer", None):
        return None
    from engine.bench import connect_peer

    return connect_peer(args)


def spread(values: list[float]) -> str:
    """'median (min-max)' of ``values``, or '-' when there are none."""
    if not values:
        return "-"
    return f"{median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = max(1, args.runs)
    max_tokens = max(1, getattr(args, "max_tokens", None) or 200)
    source = Settings().speculative  # what a user who never opens Settings gets
    also = getattr(args, "also_quant", None)
    columns: dict[str, dict[str, list[float]]] = {}
    peer = peer_client(args)
    peer_label = ""
    info: dict[str, Any] = {}
    installed, off = f"brisk (as installed: {source})", "brisk (speculation off)"
    extra = f"brisk ({also}, speculation off)" if also else ""
    draft = getattr(args, "draft_model", "") or ""
    drafted = f"brisk (draft: {Path(draft).name})" if draft else ""
    try:
        if peer is not None and peer.loaded is not None:
            peer_label = f"peer ({Path(peer.loaded.model_name).name})"  # a server may name its model by path
        for round_number in range(rounds):
            # the first question of a new process, before this round's engines take the memory
            firsts: list[tuple[str, Client | None, str]] = [(installed, None, "as installed"), (off, None, "off")]
            if round_number % 2:  # the local columns take turns going first after the last round's engines closed
                firsts.reverse()
            if peer is not None:
                firsts.append((peer_label, peer, "off"))
            first = measure_first(round_number, args, max_tokens, firsts)
            for label, values in first.items():
                merge(columns.setdefault(label, {}), values)
            # new engines each round: no reply of an earlier round can serve as a draft
            engines: list[Client | ChildEngine] = []
            try:
                local = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
                engines.append(local)
                spec = ModelSpec(
                    source=getattr(args, "model", None) or "",
                    dtype=getattr(args, "dtype", None) or "auto",
                    quant=getattr(args, "quant", None) or "auto",
                )
                loaded = local.load(spec)
                info = {"model": loaded.model_name, "dtype": loaded.dtype, "quant": loaded.info.quant}
                sides: list[tuple[str, Client, str]] = [(installed, local, source), (off, local, "off")]
                if also:  # in a process of its own: an idle engine beside the one measured slows it (bench.child)
                    other = ChildEngine()
                    engines.append(other)
                    other.load(ModelSpec(source=spec.source, dtype="auto", quant=also))
                    sides.append((extra, other, "off"))  # type: ignore[arg-type]  # a Client's ask, load, close
                if draft:  # the draft model's column, in a process of its own too
                    drafting = ChildEngine()
                    engines.append(drafting)
                    drafting.load(dataclasses.replace(spec, draft=draft))  # the draft as it is (a GGUF on its blocks)
                    sides.append((drafted, drafting, "draft"))  # type: ignore[arg-type]
                if peer is not None:
                    sides.append((peer_label, peer, "off"))
                # interleaved item by item, so that a machine whose speed drifts slows each column alike
                for item in items():
                    for label, client, speculative in sides:
                        merge(columns.setdefault(label, {}), measure_item(client, speculative, item, max_tokens))
            finally:
                for engine in engines:
                    engine.close()
    finally:
        if peer is not None:
            peer.close()
    measures = [
        ("decode tok/s, open prompts", "open"),
        ("decode tok/s, grounded prompts", "grounded"),
        ("first question of a new process: TTFT ms", "first_ttft_ms"),
        ("first question of a new process: decode tok/s", "first_tok_s"),
        ("TTFT cold, ~1,900-token system prompt, ms", "ttft_cold_ms"),
        ("TTFT warm: new chat, same system prompt, ms", "ttft_warm_ms"),
        *([("draft acceptance %, open prompts", "open acceptance"),
           ("draft acceptance %, grounded prompts", "grounded acceptance"),
           ("tokens drafted a reply, open prompts", "open drafted"),
           ("tokens drafted a reply, grounded prompts", "grounded drafted")] if draft else []),
    ]  # fmt: skip
    order = [installed, off, *([extra] if extra else []), *([drafted] if drafted else []),
             *([peer_label] if peer_label else [])]  # fmt: skip
    rows = [
        {"measure": name, **{col: spread(columns.get(col, {}).get(key, [])) for col in order}} for name, key in measures
    ]
    title = f"Brisk as installed ({info.get('quant', '?')}) and " + (peer_label or "no peer (give --peer URL)")
    print(table(f"{title}: greedy, up to {max_tokens} new tokens, {rounds} round(s); median (min-max)", rows))
    kinds = [f"{kind}: {name}" for kind, prompts in (("open", OPEN), ("grounded", GROUNDED)) for name in prompts]
    per_prompt = [{"prompt": k, **{col: spread(columns.get(col, {}).get(k, [])) for col in order}} for k in kinds]
    print(table("Decode tok/s per prompt, median (min-max)", per_prompt))
    ratios = {}
    if peer_label:
        for key in ("open", "grounded", "first_tok_s"):
            theirs = median(columns.get(peer_label, {}).get(key, []))
            ratios[key] = {
                col: median(columns.get(col, {}).get(key, [])) / theirs for col in order if col != peer_label
            }
    return {
        "local": info,
        "peer": peer_label or None,
        "rows": rows,
        "per_prompt": per_prompt,
        "ratios_to_peer": ratios,
        "samples": columns,
    }


def merge(into: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for key, values in more.items():
        into.setdefault(key, []).extend(values)
