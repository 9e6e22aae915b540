"""Prefill while typing: TTFT after Send with the switch on and off, for messages typed and pasted at a
person's pace (``brisk bench typing [--text-file F] [--json]``).

Each message is replayed as a person writes it, against the local engine, and handed to the engine the way
the composer hands its draft over (``app.views.composer``; :func:`hand_overs`): ``PAUSE_S`` after typing
pauses, at most ``EVERY_S`` into typing that never pauses, at once after a paste.  Rows:

* short, medium and long (about 20, 300 and 1,500 tokens of the bundled model) and the file given: the
  first paragraph typed at 6 characters a second, the paragraphs between pasted at once, the last paragraph
  typed at 6 characters a second, then 1 s before Send.  Typing is replayed for at most ``TYPED_CHARS``
  characters at each end (a longer first or last paragraph is pasted up to there), so a run takes seconds;
* "steady 8 cps" and "steady 12 cps": ``STEADY`` typed whole at 8 and 12 characters a second with no pause,
  Enter one key's time after the last key (the issue 50 report: a steady typist's draft was never handed over
  before Send);
* "long paste": the long message pasted at once, Send ``PASTE_TO_SEND_S`` later.

With the switch off the same message is sent with no hint.  The prefix cache is emptied before each replay,
so neither variant reuses the other's prompt.  Per row: TTFT from Send on and off, the prompt tokens ready
at Send (``Metrics.typed_tokens``, "N of M"), the longest a one-line request in another chat waited in the
queue while a long message's hint ran (sent 50 ms after its paste: ``max_interference_s``), and whether the
greedy reply is the same.  ``ttft_short_s``: a one-line message, switch on.  ``--peer URL``: an
OpenAI-compatible server's TTFT for the same messages sent at once (what every other app does), as a last
column.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import Request, Sampling
from engine.bench.common import Runner, median, server_ttft, table

TYPING_CPS = 6.0  # characters a second
TYPED_CHARS = 36  # typed at each end at most (6 s each)
PAUSE_BEFORE_SEND_S = 1.0
PAUSE_S = 0.15  # the composer's hand-overs (app.views.composer: DRAFT_PAUSE_MS, DRAFT_MAX_WAIT_MS; a test keeps
EVERY_S: float | None = 0.3  # them equal): after a pause, and this often while keys keep coming (None: never)
PASTE_CHARS = 20  # a change that adds more characters than this is a paste, handed over at once
STEADY_CPS = (8.0, 12.0)
PASTE_TO_SEND_S = 4.5
SYSTEM = "You are a helpful assistant. Answer the question about the text the user gives."
PARAGRAPH = (
    "The harbour office opens at eight and closes at five on weekdays. Boats that arrive after closing "
    "tie up at the visitor pontoon and report in the next morning. Fuel is sold from the north quay "
    "until half past four, and the crane can lift up to twelve tonnes when booked a day ahead."
)
STEADY = (
    "I am sailing up the coast next week and want to stop at the harbour for two nights. When does the "
    "office open, where do boats that arrive late tie up, and can I buy fuel on a Sunday afternoon?"
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


def steady(text: str, cps: float) -> list[tuple[str, float]]:
    """``text`` typed a character every ``1 / cps`` seconds, no pause."""
    return [(text[: i + 1], 1 / cps) for i in range(len(text))]


def hand_overs(steps: list[tuple[str, float]], enter_s: float) -> list[tuple[float, str]]:
    """(seconds from the first step, draft) of each draft the composer hands over for these steps (each a
    draft after a wait), Send coming ``enter_s`` after the last: a paste at once; else ``PAUSE_S`` after the
    last key, or ``EVERY_S`` after the first key not handed over, whichever comes first (before Send)."""
    out: list[tuple[float, str]] = []
    now, length, draft = 0.0, 0, ""
    first: float | None = None  # the first key not handed over yet
    last = 0.0
    for i, (text, wait) in enumerate([*steps, ("", enter_s)]):
        now += wait
        if first is not None:
            due = last + PAUSE_S if EVERY_S is None else min(last + PAUSE_S, first + EVERY_S)
            if due < now:  # a timer fired before this step (or before Send)
                out.append((due, draft))
                first = None
        if i == len(steps):
            break
        if len(text) - length > PASTE_CHARS:
            out.append((now, text))
            first = None
        else:
            first = now if first is None else first
        draft, length, last = text, len(text), now
    return out


def _request(messages: list[dict[str, str]], conversation: str, max_tokens: int) -> Request:
    return Request(
        uuid.uuid4().hex,
        tuple(messages),
        Sampling(max_tokens=max_tokens),
        conversation_id=conversation,
        speculative="off",
        answer_cache=False,
    )


@dataclass(frozen=True)
class Message:
    text: str
    steps: list[tuple[str, float]]  # (draft after the step, seconds to wait before it)
    enter_s: float  # from the last step to Send


def messages_of(sizes: dict[str, list[str]]) -> dict[str, Message]:
    """The rows: each size typed and pasted, then ``STEADY`` typed steadily, then the long message pasted."""
    rows = {name: Message("\n\n".join(parts), keystrokes(parts), PAUSE_BEFORE_SEND_S) for name, parts in sizes.items()}
    for cps in STEADY_CPS:
        rows[f"steady {cps:g} cps"] = Message(STEADY, steady(STEADY, cps), 1 / cps)
    long = "\n\n".join(sizes["long"])
    rows["long paste"] = Message(long, [(long, 0.0)], PASTE_TO_SEND_S)
    return rows


def replay(runner: Runner, message: Message, hinted: bool, max_tokens: int, probe: bool = False) -> dict[str, Any]:
    """Type and send one message; TTFT from Send, tokens ready at Send, and a probe's queue wait."""
    engine = runner.client.backend
    engine.clear_prefix_cache()  # type: ignore[attr-defined]  # a message never seen: neither run reuses the other's
    conversation = uuid.uuid4().hex
    system = {"role": "system", "content": SYSTEM}
    waited: list[float] = []
    total = sum(wait for _draft, wait in message.steps) + message.enter_s
    began = time.perf_counter()
    if hinted:
        before = 0
        for at, draft in hand_overs(message.steps, message.enter_s):
            time.sleep(max(0.0, began + at - time.perf_counter()))
            engine.hint(_request([system, {"role": "user", "content": draft}], conversation, max_tokens))  # type: ignore[attr-defined]
            if probe and len(draft) - before > 100 and not waited:  # just pasted: a Send in another chat now
                time.sleep(0.05)
                hello = [{"role": "user", "content": "Hi"}]
                other = runner.client.ask(hello, Sampling(max_tokens=1), answer_cache=False)
                waited.append(other.metrics.queue_s or 0.0)
            before = len(draft)
    time.sleep(max(0.0, began + total - time.perf_counter()))
    done = runner.client.ask(
        [system, {"role": "user", "content": message.text}],
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
    messages = messages_of(sizes)
    rounds = max(1, args.runs // 2)
    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")
    results: dict[str, dict[str, list[Any]]] = {}
    probed = ("long", "long paste")
    try:
        runner.client.ask([{"role": "user", "content": "Hello"}], Sampling(max_tokens=4), answer_cache=False)  # warm
        for _ in range(rounds):
            for name, message in messages.items():
                r = results.setdefault(name, {"on": [], "off": [], "typed": [], "tokens": [], "same": [], "waited": []})
                on = replay(runner, message, True, 32, probe=name in probed)
                off = replay(runner, message, False, 32)
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
                "ready at Send": f"{int(median(r['typed'])):,} of {int(median(r['tokens'])):,}",
                "max wait of a Send s": max(r["waited"]) if r["waited"] else "-",
                "identical": "yes" if all(r["same"]) else "NO",
            }
        )
    peer = getattr(args, "peer", None)
    if peer:
        key = getattr(args, "api_key", None)
        for row in rows:
            parts = paragraphs_of(messages[str(row["message"])].text)
            ttft = peer_ttft(peer, getattr(args, "peer_model", None), key, parts, max(2, rounds))
            row["peer TTFT s"] = ttft
    every = f"every {EVERY_S * 1000:.0f} ms of typing" if EVERY_S else "no hand-over while keys keep coming"
    title = f"Prefill while typing ({runner.loaded.info.quant}; drafts handed over {every}), median of {rounds} rounds"
    print(table(title, rows))
    chosen = Path(text_file).name if text_file else "long"
    r = results[chosen]
    waited = [w for name in probed for w in results[name]["waited"]]
    summary = {
        "tokens": int(median(r["tokens"])),
        "ttft_on_s": median(r["on"]),
        "ttft_off_s": median(r["off"]),
        "ttft_short_s": median(results["short"]["on"]),
        "prefilled_before_send": int(median(r["typed"])),
        "max_interference_s": max(waited) if waited else None,
        "identical": all(r["same"]),
    }
    if getattr(args, "json", False):
        print(json.dumps(summary))
    return {"rows": rows, "summary": summary, "rounds": rounds}
