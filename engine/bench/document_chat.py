"""Chat with documents: TTFT of the first and the second question about a 3,000-token document, in a new
chat and after a restart, beside a short message; then indexing and retrieval on a folder of notes
(``brisk bench documents [--runs N] [--peer URL]``).

Each round attaches a new copy of the document (its first line names the round, so no cache holds it), then,
on one engine, as a user meets it: a short message in a new chat (no document: the baseline), the first
question about the document in a new chat (its KV computed and saved), a second question in another new chat
(the document's KV reused from memory); then, as the window sends them, a short message and another question
about the document each typed in a new chat (prefilled while typed: ``engine.bench.typing_prefill``'s
keystrokes, a hint each, Send a second after the last; and again with Send 50 ms after the last key, before
the composer's pause sends its hint); then a new process (``brisk ask --attach`` on the same data folder) asks
a question not yet asked about that document (the KV read from disk) and another new process asks a short
message (the baseline a new process gets); then, per round, a new engine on the same data folder (a restart of
the window, in this process) gets a short message and a question about the round's document, both typed in
new chats (the document's KV read from disk while the question is typed, as the window does). No message is
sent twice in a run (a repeat would reuse an earlier chat's KV beyond what the row measures). TTFT is
``Metrics.ttft_s``:
from the request's submission, the model already loaded. ``--peer URL``: an OpenAI-compatible server
(llama.cpp's with ``cache_prompt``) gets the same rendered prompts (the document whole in the system message,
as Brisk renders it): the short message, the first question and the second; a server keeps no KV across
restarts, so it has no restart row.

Then ``engine.documents.corpus``: a folder of 1,000 generated Markdown notes indexed (conversion, chunks,
BM25, vectors), the retrieval latency over its question set, and the hit rate (the note that holds the
answer among the passages) for words alone, vectors alone and both.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec, Sampling
from engine.bench.common import ask_in_new_process, fresh_data_dir, median, spread, table
from engine.client import Client, local_backend

SYSTEM = "You are a helpful assistant."
MAX_TOKENS = 16
QUESTIONS = [
    ("When does the north workshop open on Saturdays?", "How many days ahead must the crane be booked?"),
    ("Who signs off on a safety drill?", "What colour are the visitor badges?"),
    ("How long are backups kept?", "Which room holds the spare keys?"),
    ("What is the late fee for a returned tool?", "Where do deliveries arrive after six?"),
    ("Who can approve overtime?", "How often is the fire alarm tested?"),
]
# Short messages, none sent twice in a run (a repeat would reuse an earlier chat's KV and flatter the baseline):
# one list per row, as many as rounds
SHORT = ["Say hello in French.", "Name a primary colour.", "What is two plus three?", "Give me a synonym for big.",
         "Name a planet near the sun."]  # fmt: skip
TYPED_SHORT = ["Name a large ocean.", "What is ten minus four?", "Say goodbye in Spanish.", "Name a kind of tree.",
               "Spell the word cat."]  # fmt: skip
AT_ONCE_SHORT = ["Name a farm animal.", "What is six times two?", "Say thank you in German.", "Name a winter sport.",
                 "Give me an antonym for fast."]  # fmt: skip
NEW_PROCESS_SHORT = ["Name a river in Africa.", "What is nine plus one?", "Say good night in Italian.",
                     "Name a musical instrument.", "Give me a synonym for small."]  # fmt: skip
RESTART_TYPED_SHORT = ["Name a desert.", "What is eight minus five?", "Say yes in Japanese.", "Name a kind of bird.",
                       "Give me a word that rhymes with moon."]  # fmt: skip
SECTIONS = [
    ("Opening hours", "The north workshop opens at {h} on weekdays and at {s} on Saturdays; it is closed on Sundays "
     "and public holidays. The south workshop keeps the same hours but closes an hour earlier in winter."),
    ("Bookings", "The crane must be booked {d} days ahead through the front desk. The lathe and the paint booth "
     "can be booked a day ahead. Bookings that are not used within thirty minutes are released."),
    ("Safety", "Every safety drill is signed off by the {role}. Visitor badges are {colour} and must be worn "
     "at all times. The fire alarm is tested every {n} weeks on a Monday morning."),
    ("Records", "Backups of the booking system are kept for {k} days. Spare keys are held in room {room}, "
     "and the key log is checked every Friday."),
    ("Tools", "A tool returned late costs {fee} euros a day. Damaged tools are reported on the blue form, "
     "and deliveries that arrive after six go to the {place}."),
    ("Staff", "Overtime is approved by the shift lead or the site manager. New staff shadow a colleague for "
     "two weeks before they work alone, and every team meets on Tuesday at nine."),
]  # fmt: skip


def handbook(round_no: int, target_chars: int = 12_000) -> str:
    """A made-up site handbook of about 3,000 tokens; its first line names the round (a new document)."""
    values = {"h": "7:30", "s": "9:00", "d": 3, "role": "site manager", "colour": "orange", "n": 6, "k": 90,
              "room": "B12", "fee": 4, "place": "loading bay"}  # fmt: skip
    parts = [f"# Site handbook, edition {round_no + 1} ({uuid.uuid4().hex[:8]})"]
    number = 0
    while sum(len(p) for p in parts) < target_chars:
        title, text = SECTIONS[number % len(SECTIONS)]
        parts.append(f"## {number + 1}. {title}\n\n{text.format(**values)} This rule was last reviewed in "
                     f"year {2010 + number % 15}, item {number * 7 % 31}.")  # fmt: skip
        number += 1
    return "\n\n".join(parts) + "\n"


def _ask(
    client: Client, messages: list[dict[str, str]], documents: tuple[str, ...] = (), conversation: str = ""
) -> dict[str, Any]:
    """One greedy reply in a new chat (``conversation``: in that one); its TTFT and where it went."""
    done = client.ask(
        messages,
        Sampling(max_tokens=MAX_TOKENS),
        conversation_id=conversation or uuid.uuid4().hex,
        answer_cache=False,
        speculative="off",
        documents=documents,
    )
    m = done.metrics
    spans = {s.name: round(1000 * s.seconds, 2) for s in m.spans}
    return {"ttft_ms": 1000 * (m.ttft_s or 0.0), "document_tokens": m.document_tokens,
            "document_reused": m.document_reused, "prompt_tokens": m.prompt_tokens, "computed": m.computed_tokens,
            "typed": m.typed_tokens, "cache_bytes": m.cache_bytes, "spans_ms": spans}  # fmt: skip


def _typed(
    client: Client, system: list[dict[str, str]], question: str, documents: tuple[str, ...], at_once: bool = False
) -> dict[str, Any]:
    """``question`` typed in a new chat as the window's composer sends it (a hint a keystroke, at 6 characters a
    second, ``engine.bench.typing_prefill``), then Send after a second; the reply's TTFT from Send.  ``at_once``:
    Send 50 ms after the last keystroke, before the composer's 150 ms pause has sent that keystroke's hint
    (the engine's guess is the text without its last character)."""
    import time

    from engine.api import Request
    from engine.bench.typing_prefill import PAUSE_BEFORE_SEND_S, keystrokes

    conversation = uuid.uuid4().hex
    steps = keystrokes([question])
    for draft, pause in steps[:-1] if at_once else steps:
        time.sleep(pause)
        messages = (*system, {"role": "user", "content": draft})
        sampling = Sampling(max_tokens=MAX_TOKENS)
        client.backend.hint(Request(uuid.uuid4().hex, messages, sampling, conversation_id=conversation,  # type: ignore[attr-defined]
                                    answer_cache=False, documents=documents))  # fmt: skip
    time.sleep(steps[-1][1] + 0.05 if at_once else PAUSE_BEFORE_SEND_S)
    return _ask(client, [*system, {"role": "user", "content": question}], documents, conversation)


def _child_ask(question: str, args: argparse.Namespace, attach: Path | None) -> dict[str, Any]:
    """``brisk ask`` in a new process on the data folder in use; its Done's metrics."""
    flags = ["--max-tokens", str(MAX_TOKENS), "--no-answer-cache", "--speculative", "off", "--system", SYSTEM]
    if args.model:
        flags += ["--model", args.model]
    flags += ["--quant", args.quant or "auto"]
    if attach is not None:
        flags += ["--attach", str(attach)]
    m = ask_in_new_process(question, flags).done()
    return {"ttft_ms": 1000 * (m.get("ttft_s") or 0.0), "document_tokens": m.get("document_tokens", 0),
            "document_reused": m.get("document_reused", 0)}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.documents import render
    from engine.documents.library import DocumentLibrary

    rounds = max(1, min(args.runs, len(QUESTIONS)))
    peer: Client | None = None
    if getattr(args, "peer", None):
        from engine.bench import connect_peer

        peer = connect_peer(args)
    keys = (
        "short",
        "first",
        "second",
        "typed_short",
        "typed_second",
        "typed_short_at_once",
        "typed_second_at_once",
        "restart",
        "new_short",
        "restart_typed_short",
        "restart_typed",
    )
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    peer_rows: dict[str, list[dict[str, Any]]] = {k: [] for k in ("short", "first", "second")}
    with fresh_data_dir() as data, tempfile.TemporaryDirectory(prefix="brisk-docs-") as folder:
        library = DocumentLibrary()
        spec = ModelSpec(source=args.model or "", dtype=args.dtype or "auto", quant=args.quant or "auto")
        client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
        try:
            loaded = client.load(spec)
            mode = loaded.info.quant
            system = [{"role": "system", "content": SYSTEM}]
            _ask(client, [*system, {"role": "user", "content": "Hello!"}])  # the engine's own first request
            doc_ids: list[tuple[str, ...]] = []
            for r in range(rounds):
                path = Path(folder) / f"handbook-{r + 1}.md"
                path.write_text(handbook(r), encoding="utf-8")
                attached = library.attach([path])
                if not attached or not attached[0].ok:
                    raise RuntimeError(f"could not attach the document: {attached}")
                doc = (attached[0].doc_id,)
                doc_ids.append(doc)
                first_q, second_q = QUESTIONS[r]
                rows["short"].append(_ask(client, [*system, {"role": "user", "content": SHORT[r]}]))
                rows["first"].append(_ask(client, [*system, {"role": "user", "content": first_q}], doc))
                rows["second"].append(_ask(client, [*system, {"role": "user", "content": second_q}], doc))
                # as the window meets them: typed, each prefilled while it is written (new chats again)
                rows["typed_short"].append(_typed(client, system, TYPED_SHORT[r], ()))
                rows["typed_second"].append(_typed(client, system, QUESTIONS[(r + 1) % len(QUESTIONS)][1], doc))
                # Enter pressed right after the last character: the guess misses it, the end is computed
                at_once_q = f"{QUESTIONS[(r + 2) % len(QUESTIONS)][1]} Be brief."
                rows["typed_short_at_once"].append(_typed(client, system, AT_ONCE_SHORT[r], (), True))
                rows["typed_second_at_once"].append(_typed(client, system, at_once_q, doc, True))
                if peer is not None:
                    whole = [render.Whole(doc[0], path.name, path.read_text(encoding="utf-8"))]
                    for key, question, docs in (("short", SHORT[r], []), ("first", first_q, whole),
                                                ("second", second_q, whole)):  # fmt: skip
                        messages = render.with_documents([*system, {"role": "user", "content": question}], docs, [])
                        peer_rows[key].append(_ask(peer, messages))
        finally:
            client.close()
        for r in range(rounds):  # new processes on the same data folder: the KV comes from disk
            path = Path(folder) / f"handbook-{r + 1}.md"
            unasked = QUESTIONS[(r + 3) % len(QUESTIONS)][0]  # not yet asked about this document
            rows["restart"].append(_child_ask(unasked, args, path))
            rows["new_short"].append(_child_ask(NEW_PROCESS_SHORT[r], args, None))
        for r in range(rounds):  # the window restarted: a new engine, the document's KV on disk, questions typed
            again = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
            try:
                again.load(spec)
                short_q = RESTART_TYPED_SHORT[r]
                rows["restart_typed_short"].append(_typed(again, system, short_q, ()))
                rows["restart_typed"].append(_typed(again, system, QUESTIONS[(r + 4) % len(QUESTIONS)][0], doc_ids[r]))
            finally:
                again.close()
        del data
    corpus = _corpus()
    result = _summary(rows, peer_rows, peer is not None)
    result["mode"] = mode
    result["corpus"] = corpus
    print(
        f"\nmode: {mode}; the second question's time, median ms: "
        + ", ".join(
            f"{name} {median([x['spans_ms'].get(name, 0.0) for x in rows['second']]):.1f}"
            for name in ("prompt", "cache lookup", "prefill", "first token")
        )
    )
    if peer is not None:
        peer.close()
    return result


def _spread(values: list[float]) -> str:
    """Median (min-max); tenths where the values are a few milliseconds (the typed rows' ratios are of those)."""
    return spread(values, "{:.1f}" if values and max(values) < 10 else "{:.0f}")


def _summary(rows: dict[str, list[dict[str, Any]]], peer_rows: dict[str, list[dict[str, Any]]], peer: bool) -> dict:
    labels = {
        "short": "short message, no document (same engine)",
        "first": "first question about the document (new chat)",
        "second": "second question, another new chat",
        "typed_short": "short message typed in a new chat (prefilled while typed, as the window does)",
        "typed_second": "another question typed in a new chat (prefilled while typed)",
        "typed_short_at_once": "short message typed, Send 50 ms after the last key (before its hint)",
        "typed_second_at_once": "another question typed, Send 50 ms after the last key (before its hint)",
        "restart": "a question after a restart (new process)",
        "new_short": "short message in a new process",
        "restart_typed_short": "short message typed after a restart (new engine)",
        "restart_typed": "a question typed after a restart (new engine, the KV read while typed)",
    }
    out_rows = []
    for key, label in labels.items():
        row = {"measure": f"TTFT ms: {label}", "brisk": _spread([x["ttft_ms"] for x in rows[key]])}
        reused = [x["document_reused"] for x in rows[key] if x.get("document_tokens")]
        tokens = [x["document_tokens"] for x in rows[key] if x.get("document_tokens")]
        row["document tokens reused"] = f"{median(reused):.0f} of {median(tokens):.0f}" if tokens else "-"
        if peer:
            row["peer"] = _spread([x["ttft_ms"] for x in peer_rows.get(key, [])]) if key in peer_rows else "-"
        out_rows.append(row)
    print(table("Questions about a 3,000-token document: TTFT, median (min-max)", out_rows))

    def over(row: str, base: str) -> float | None:  # one row's median TTFT over another's
        top, bottom = (median([x["ttft_ms"] for x in rows[k]]) if rows[k] else 0.0 for k in (row, base))
        return top / bottom if bottom else None

    ratios = {
        "second_over_short": over("second", "short"),
        "restart_over_new_process_short": over("restart", "new_short"),
        "typed_second_over_typed_short": over("typed_second", "typed_short"),
        "restart_typed_over_restart_typed_short": over("restart_typed", "restart_typed_short"),
        "typed_at_once_second_over_short": over("typed_second_at_once", "typed_short_at_once"),
    }
    print(
        f"\nsecond question / short message: {ratios['second_over_short'] or 0:.2f}x; typed, as the window sends them: "
        f"{ratios['typed_second_over_typed_short'] or 0:.2f}x; after a restart / a new process's short message: "
        f"{ratios['restart_over_new_process_short'] or 0:.2f}x; typed after a restart: "
        f"{ratios['restart_typed_over_restart_typed_short'] or 0:.2f}x; typed, Send at once: "
        f"{ratios['typed_at_once_second_over_short'] or 0:.2f}x (target: at most 1.5x)"
    )
    return {"rows": rows, "peer": peer_rows if peer else None, "table": out_rows, "ratios": ratios}


def _corpus() -> dict[str, Any]:
    """Indexing and retrieval on 1,000 generated notes (``engine.documents.corpus``)."""
    import engine.documents.corpus as corpus
    from engine.answer_cache.embed import shared_embedder

    with tempfile.TemporaryDirectory(prefix="brisk-corpus-") as folder, fresh_data_dir():
        embedder = shared_embedder()
        embedder.wait(120)
        found: dict[str, Any] = corpus.measure_folder(Path(folder), 1000, embedder)
    print(f"\n## Indexing and retrieval: 1,000 Markdown notes\n\n{found.get('table', '')}")
    return found
