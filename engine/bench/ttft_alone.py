"""Cold and warm TTFT of one engine at a time: Brisk in a weight mode, or a peer server, nothing else running.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/python -m engine.bench.ttft_alone q8-cpu fp16-cpu
--peer http://127.0.0.1:8089/v1 [--rounds 3]``.  For each column in turn, ``rounds`` new system prompts
(``engine.bench.common.LONG_SYSTEM`` with a nonce, about 1,900 tokens): the first question is the cold
TTFT, a second question in a new chat the warm one.  ``brisk bench versus`` measures the same rows
interleaved with decoding and other engines alive beside them; this measures each engine alone.
Prints a table and writes ``bench/results/ttft_alone.json``.
"""

from __future__ import annotations

import argparse
import uuid

from engine.api import AnswerCacheSettings, ModelSpec, Sampling
from engine.bench.common import LONG_SYSTEM, PEER_PROMPTS, markdown_table, save, server_ttft, spread
from engine.client import Client, local_backend


def questions(rounds: int) -> list[tuple[str, list[dict[str, str]]]]:
    """(row, messages) in order: each round a new system prompt, asked cold, then warm in a new chat."""
    out = []
    for i in range(rounds):
        system = f"[session {uuid.uuid4().hex[:12]}] {LONG_SYSTEM}"
        for j, row in enumerate(("cold", "warm")):
            question = PEER_PROMPTS[(i + j) % len(PEER_PROMPTS)]
            out.append((row, [{"role": "system", "content": system}, {"role": "user", "content": question}]))
    return out


def brisk(mode: str, rounds: int) -> dict[str, list[float]]:
    client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
    try:
        client.load(ModelSpec(quant=mode))
        out: dict[str, list[float]] = {"cold": [], "warm": []}
        for row, messages in questions(rounds):
            sampling = Sampling(max_tokens=8)
            done = client.ask(
                messages, sampling, conversation_id=uuid.uuid4().hex, speculative="off", answer_cache=False
            )
            out[row].append(1000 * (done.metrics.ttft_s or 0.0))
        return out
    finally:
        client.close()


def peer(url: str, rounds: int) -> dict[str, list[float]]:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="none")
    out: dict[str, list[float]] = {"cold": [], "warm": []}
    for row, messages in questions(rounds):
        out[row].append(1000 * (server_ttft(client, "peer", messages) or 0.0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", nargs="*", default=["auto"])
    parser.add_argument("--peer", default="")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    columns = {f"brisk {m}": brisk(m, args.rounds) for m in args.modes}
    if args.peer:
        columns["peer"] = peer(args.peer, args.rounds)
    head = ["column", "TTFT cold ms, median (min-max)", "TTFT warm ms, median (min-max)"]
    print(markdown_table(head, [[name, spread(v["cold"]), spread(v["warm"])] for name, v in columns.items()]))
    print(f"wrote {save('ttft_alone', columns)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
