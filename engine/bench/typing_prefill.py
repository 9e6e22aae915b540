"""Prefill while typing: TTFT after Send with the switch on and off, for messages typed and pasted at a
person's pace (``brisk bench typing [--text-file F] [--json]``).

Each message is replayed as a person writes it, against the local engine, making the calls the composer
makes (one hint per pause, a pause being longer than the composer's 150 ms): its first paragraph typed at
6 characters a second, the paragraphs between pasted at once, its last paragraph typed at 6 characters a
second, then 1 s before Send.  Typing is replayed for at most ``TYPED_CHARS`` characters at each end (a
longer first or last paragraph is pasted up to there), so a run takes seconds, not minutes.  Sizes: short,
medium and long (about 20, 300 and 1,500 tokens of the bundled model) and the file given.  With the switch
off the same message is sent with no hint.  The prefix cache is emptied before each replay, so neither
variant reuses the other's prompt.  Per size: TTFT from Send on and off, the prompt tokens
prefilled before Send (``Metrics.typed_tokens``), the longest a one-line request in another chat waited in
the queue while the long message's hint ran (``max_interference_s``), and whether the greedy reply is the
same.  ``ttft_short_s``: a one-line message, switch on.  ``--peer URL``: an OpenAI-compatible server's
TTFT for the same messages sent at once (what every other app does), as a last column.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

from engine.api import Request, Sampling
from engine.bench.common import Runner, median, server_ttft, table

TYPING_CPS = 6.0  # characters a second
TYPED_CHARS = 36  # typed at each end at most (6 s each)
PAUSE_BEFORE_SEND_S = 1.0
SYSTEM = "You are a helpful assistant. Answer the question about the text the user gives."
PARAGRAPH = (
    "The harbour office opens at eight and closes at five on weekdays. Boats that arrive after closing "
    "tie up at the visitor pontoon and report in the next morning. Fuel is sold from the north quay "
    "until half past four, and the crane can lift up to twelve tonnes when booked a day ahead."
)
SIZES = {
    "short": ["What time does the harbour office open?"],
    "medium": [
        "Here are the harbour rules:",
        PARAGRAPH,
        PARAGRAPH.replace("eight", "seven"),
        PARAGRAPH.replace("twelve", "ten"),
        "When can I buy fuel?",
    ],
    "long": [
        "Here are the harbour rules, all of them:",
        *[PARAGRAPH.replace("eight", str(i % 9 + 1)) for i in range(22)],
        "Summarise them in three sentences.",
    ],
}


def paragraphs_of(text: str) -> list[str]:
    parts = [p.strip() for p in text.split("\n\n") if p.strip()]
    return parts or [text]


def keystrokes(parts: list[str]) -> list[tuple[str, float]]:
    """(draft after the step, seconds to wait before it): typed characters, pastes, typed characters."""
    first, last = parts[0], parts[-1] if len(parts) > 1 else ""
    middle = "\n\n".join(parts[1:-1]) if len(parts) > 2 else ""
    steps: list[tuple[str, float]] = []
    head = first[: len(first) - TYPED_CHARS] if len(first) > TYPED_CHARS else ""
    if head:
        steps.append((head, 0.0))  # a long first paragraph: pasted up to its last TYPED_CHARS characters
    for i in range(len(head), len(first)):
        steps.append((first[: i + 1], 1 / TYPING_CPS))
    text = first
    if middle:
        text = f"{text}\n\n{middle}"
        steps.append((text, 1 / TYPING_CPS))  # pasted at once
    if last:
        prefix = f"{text}\n\n"
        cut = max(0, len(last) - TYPED_CHARS)
        if cut:
            steps.append((prefix + last[:cut], 1 / TYPING_CPS))
        for i in range(cut, len(last)):
            steps.append((prefix + last[: i + 1], 1 / TYPING_CPS))
    return steps


def _request(messages: list[dict[str, str]], conversation: str, max_tokens: int) -> Request:
    return Request(
        uuid.uuid4().hex,
        tuple(messages),
        Sampling(max_tokens=max_tokens),
        conversation_id=conversation,
        speculative="off",
        answer_cache=False,
    )


def replay(runner: Runner, parts: list[str], hinted: bool, max_tokens: int, probe: bool = False) -> dict[str, Any]:
    """Type and send one message; TTFT from Send, tokens prefilled before it, and a probe's queue wait."""
    engine = runner.client.backend
    engine.clear_prefix_cache()  # type: ignore[attr-defined]  # a message never seen: neither run reuses the other's
    conversation = uuid.uuid4().hex
    system = {"role": "system", "content": SYSTEM}
    waited: list[float] = []
    text = "\n\n".join(parts)
    if hinted:
        before = 0
        for draft, pause in keystrokes(parts):
            time.sleep(pause)
            request = _request([system, {"role": "user", "content": draft}], conversation, max_tokens)
            engine.hint(request)  # type: ignore[attr-defined]
            if probe and len(draft) - before > 100 and not waited:  # just pasted: a Send in another chat now
                time.sleep(0.05)
                hello = [{"role": "user", "content": "Hi"}]
                other = runner.client.ask(hello, Sampling(max_tokens=1), answer_cache=False)
                waited.append(other.metrics.queue_s or 0.0)
            before = len(draft)
        time.sleep(PAUSE_BEFORE_SEND_S)
    done = runner.client.ask(
        [system, {"role": "user", "content": text}],
        Sampling(max_tokens=max_tokens),
        conversation_id=conversation,
        speculative="off",
        answer_cache=False,
    )
    m = done.metrics
    return {
        "ttft": m.ttft_s or 0.0,
        "typed": m.typed_tokens,
        "tokens": m.prompt_tokens,
        "text": done.text,
        "waited": waited,
    }


def peer_ttft(url: str, model: str | None, api_key: str | None, parts: list[str], runs: int) -> float:
    """A server's TTFT for the message sent at once (a new nonce first in the system prompt: nothing reused)."""
    from openai import OpenAI

    client: Any = OpenAI(base_url=url, api_key=api_key or "none")  # plain dicts and chunks, read loosely
    model = model or client.models.list().data[0].id
    times = []
    for _ in range(runs):
        messages = [
            {"role": "system", "content": f"[{uuid.uuid4().hex[:8]}] {SYSTEM}"},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
        first = server_ttft(client, model, messages)
        times.append(first or float("nan"))
    return median(times)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(SIZES)
    text_file = getattr(args, "text_file", None)
    if text_file:
        sizes[Path(text_file).name] = paragraphs_of(Path(text_file).read_text(encoding="utf-8"))
    rounds = max(1, args.runs // 2)
    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")
    results: dict[str, dict[str, list[Any]]] = {}
    try:
        runner.client.ask([{"role": "user", "content": "Hello"}], Sampling(max_tokens=4), answer_cache=False)  # warm
        for _ in range(rounds):
            for name, parts in sizes.items():
                r = results.setdefault(name, {"on": [], "off": [], "typed": [], "tokens": [], "same": [], "waited": []})
                on = replay(runner, parts, True, 32, probe=name == "long")
                off = replay(runner, parts, False, 32)
                r["on"].append(on["ttft"])
                r["off"].append(off["ttft"])
                r["typed"].append(on["typed"])
                r["tokens"].append(on["tokens"])
                r["same"].append(on["text"] == off["text"])
                r["waited"].extend(on["waited"])
    finally:
        runner.close()
    rows = []
    for name, r in results.items():
        rows.append(
            {
                "message": name,
                "prompt tokens": int(median(r["tokens"])),
                "TTFT on s": median(r["on"]),
                "TTFT off s": median(r["off"]),
                "off / on": median(r["off"]) / max(1e-9, median(r["on"])),
                "prefilled before Send": int(median(r["typed"])),
                "max wait of a Send s": max(r["waited"]) if r["waited"] else "-",
                "identical": "yes" if all(r["same"]) else "NO",
            }
        )
    peer = getattr(args, "peer", None)
    if peer:
        key = getattr(args, "api_key", None)
        for row in rows:
            parts = sizes[str(row["message"])]
            ttft = peer_ttft(peer, getattr(args, "peer_model", None), key, parts, max(2, rounds))
            row["peer TTFT s"] = ttft
    print(table(f"Prefill while typing ({runner.loaded.info.quant}), median of {rounds} rounds", rows))
    chosen = Path(text_file).name if text_file else "long"
    r = results[chosen]
    summary = {
        "tokens": int(median(r["tokens"])),
        "ttft_on_s": median(r["on"]),
        "ttft_off_s": median(r["off"]),
        "ttft_short_s": median(results["short"]["on"]),
        "prefilled_before_send": int(median(r["typed"])),
        "max_interference_s": max(results["long"]["waited"]) if results["long"]["waited"] else None,
        "identical": all(r["same"]),
    }
    if getattr(args, "json", False):
        print(json.dumps(summary))
    return {"rows": rows, "summary": summary, "rounds": rounds}
