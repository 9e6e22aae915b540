"""``brisk bench versus --peer URL``: Brisk as installed against a peer server on the same model, side by side.

What a user who runs llama.cpp today compares: decode speed on an open
prompt (stories) and on a grounded one (rewrite or extract from a given
text), and TTFT on a long (~1,900-token) system prompt: cold (no cache holds it) and
warm (a new chat with the same system prompt and another question).  Three
columns, measured by the same client code at the client, greedy, interleaved
prompt by prompt (each prompt on every column before the next) so drift hits
each alike:

- ``brisk (defaults)``: the local engine as ``make run`` starts it: the
  ``auto`` quantization mode (measured at first load, see ``brisk doctor``;
  ``--quant`` picks another) and the settings' speculative source (``auto``);
- ``brisk (speculation off)``: the same engine with speculative decoding off,
  so the table shows what each part is worth;
- the peer (``--peer URL``, for example llama-cpp-python's or llama.cpp's
  server on the same GGUF), sent ``repeat_penalty`` 1.0 so that it decodes
  plain greedy as Brisk does (llama-cpp-python's server defaults to 1.1).

Each round starts a new local engine, so the ``answers`` draft source never
drafts from the previous round's reply to the same prompt: every prompt is
new to the engine, as a new question is to a user.  Without ``--peer`` the
peer column is left out.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec, Sampling
from engine.bench.common import LONG_SYSTEM, PEER_PROMPTS, median, table
from engine.bench.speculative import ARTICLE, CODE
from engine.client import Client, local_backend
from engine.storage.settings import Settings

OPEN = {
    "story (fox)": "Write a short story about a fox who learns to sail.",
    "story (robot)": "Write a short story about a robot who paints the sea.",
}
GROUNDED = {
    "rewrite": f"Rewrite the following text with British spelling, keeping everything else the same:\n\n{ARTICLE}",
    "code edit": f"Rename the function total_price to order_total in this code and return the full code:\n\n{CODE}",
}


def items() -> list[tuple[str, str | int]]:
    """One round's measurements, in order: each decode prompt, then each TTFT question (cold, then warm)."""
    decode: list[tuple[str, str | int]] = [
        (k, p) for k, ps in (("open", OPEN), ("grounded", GROUNDED)) for p in ps.values()
    ]
    return decode + [("ttft", i) for i in range(len(PEER_PROMPTS))]


def measure_item(
    client: Client, speculative: str, item: tuple[str, str | int], max_tokens: int
) -> dict[str, list[float]]:
    """One measurement on one column: a decode prompt's tok/s, or one TTFT question cold and warm."""
    kind, what = item
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


def peer_client(args: argparse.Namespace) -> Client | None:
    """The ``--peer`` server's client (plain greedy there too), or None without one; LoadError says why not."""
    if not getattr(args, "peer", None):
        return None
    from engine.bench import connect_peer

    return connect_peer(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = max(1, args.runs)
    max_tokens = max(1, getattr(args, "max_tokens", None) or 200)
    source = Settings().speculative  # what a user who never opens Settings gets
    columns: dict[str, dict[str, list[float]]] = {}
    peer = peer_client(args)
    peer_label = ""
    info: dict[str, Any] = {}
    try:
        if peer is not None and peer.loaded is not None:
            peer_label = f"peer ({Path(peer.loaded.model_name).name})"  # a server may name its model by path
        for _ in range(rounds):
            # a new engine each round: no reply of an earlier round can serve as a draft
            with Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False))) as local:
                spec = ModelSpec(
                    source=getattr(args, "model", None) or "",
                    dtype=getattr(args, "dtype", None) or "auto",
                    quant=getattr(args, "quant", None) or "auto",
                )
                loaded = local.load(spec)
                info = {"model": loaded.model_name, "dtype": loaded.dtype, "quant": loaded.info.quant}
                sides: list[tuple[str, Client, str]] = [
                    (f"brisk (defaults: {source})", local, source),
                    ("brisk (speculation off)", local, "off"),
                ]
                if peer is not None:
                    sides.append((peer_label, peer, "off"))
                # interleaved item by item, so that a machine whose speed drifts slows each column alike
                for item in items():
                    for label, client, speculative in sides:
                        merge(columns.setdefault(label, {}), measure_item(client, speculative, item, max_tokens))
    finally:
        if peer is not None:
            peer.close()
    measures = [
        ("decode tok/s, open prompts (median)", "open"),
        ("decode tok/s, grounded prompts (median)", "grounded"),
        ("TTFT cold, ~1,900-token system prompt, ms (median)", "ttft_cold_ms"),
        ("TTFT warm: new chat, same system prompt, ms (median)", "ttft_warm_ms"),
    ]
    rows = [
        {"measure": name, **{col: median(data.get(key, [])) for col, data in columns.items()}} for name, key in measures
    ]
    title = f"Brisk as installed ({info.get('quant', '?')}) and " + (peer_label or "no peer (give --peer URL)")
    print(table(f"{title}: greedy, up to {max_tokens} new tokens, {rounds} round(s)", rows))
    return {"local": info, "peer": peer_label or None, "rows": rows, "samples": columns}


def merge(into: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for key, values in more.items():
        into.setdefault(key, []).extend(values)
