"""``brisk bench branch``: a branch's first reply starts warm from its parent's cached prompt.

A parent chat of ``TURNS`` question-and-reply turns is built once, greedy, in a
history file of its own (a temporary folder) through :class:`~engine.storage.Store`,
as the window keeps it.  Then, each round, in an order that rotates (so the
machine's drift spreads over every row), the first reply of each chat below to
the same one-line question, so only the history before it differs (numbered at
its start, so no round reuses the previous round's line):

* **follow-up**: the one-line question at the end of the parent (what any chat's
  next turn costs: only the new line is computed);
* **branch**: a chat branched after reply ``BRANCH_AFTER``
  (``Store.branch_conversation``); its history is the parent's, token for
  token, so the prefix cache serves it from the parent's entry;
* **new chat, same history (cold)**: the branch's very messages with the
  prefix cache off: every prompt token computed;
* **keep last 2 turns**: a tail fork (``Store.keep_last_turns``): only the
  system prompt is shared with the parent (the turns kept sit at other
  positions), so it is cold past the system prompt.

Each round's branch and tail fork are dropped from the prefix cache after the
round, so every round measures a first fork (its only warm source the parent,
as for a user's first branch), not one warmed by the previous round's twin.

TTFT is the engine's (``Metrics.ttft_s``, submission to first token); cells are
"median (min-max)" over ``--runs`` rounds.  The target (issue 52): a branch's first
reply within 1.5x a one-line follow-up.  Each branch's reply is checked token for
token against the cold one (greedy: the cache must change nothing).  Speculative
decoding is off and the answer cache is off: this measures the prompt.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from engine.api import Done
from engine.bench.common import Runner, markdown_table, median, spread, ttfts
from engine.runtime.serving import conversation_key
from engine.storage import Store

SPECULATIVE = "off"
REPLY_TOKENS = 48  # each reply of the parent
ASK_TOKENS = 4  # the measured replies: TTFT is what counts
TARGET = 1.5  # a branch's first reply within this many times a one-line follow-up
SYSTEM = (
    "You are a friendly travel assistant. Answer in a few plain sentences, suggest concrete places, and say "
    "when something depends on the season or on the traveller's budget."
)
TURNS = [
    "Hi! I'm planning a trip to Portugal in May.",
    "What should I see in Lisbon?",
    "How many days would you spend there?",
    "What about Porto?",
    "Is it easy to travel by train between them?",
    "What food should I try?",
    "Any tips for saving money?",
    "Should I rent a car for the Algarve?",
]
BRANCH_AFTER = 6  # the branch is made after this reply (of len(TURNS))
FIELDS = ("prompt_tokens", "cached_tokens", "computed_tokens", "lookup_s", "prefill_s", "ttft_s")
ROWS = ("follow-up", "branch", "cold", "tail")
LABELS = {
    "follow-up": "one-line follow-up in the parent",
    "branch": f"branch after reply {BRANCH_AFTER}, first reply",
    "cold": "new chat, same history (cold)",
    "tail": "keep last 2 turns, first reply",
}


def history(store: Store, conversation_id: str) -> list[dict[str, str]]:
    """What the window sends before a new turn: the system prompt, then the stored turns with text."""
    conversation = store.get_conversation(conversation_id)
    kept = [m for m in store.messages(conversation_id) if m.role in ("user", "assistant") and m.content]
    return [{"role": "system", "content": conversation.system_prompt}] + [
        {"role": m.role, "content": m.content} for m in kept
    ]


def build_parent(runner: Runner, store: Store) -> tuple[str, int]:
    """The parent chat, each reply greedy and stored; (its id, the id of reply ``BRANCH_AFTER``)."""
    parent = store.create_conversation("Portugal trip", system_prompt=SYSTEM)
    replies = []
    for text in TURNS:
        store.add_message(parent, "user", text)
        done = runner.ask(history(store, parent), REPLY_TOKENS, speculative=SPECULATIVE, conversation_id=parent)
        replies.append(store.add_message(parent, "assistant", done.text, metrics=done.metrics.to_dict()))
    return parent, replies[BRANCH_AFTER - 1]


def one_round(runner: Runner, store: Store, parent: str, after: int, n: int) -> dict[str, Done]:
    """Each row's reply once, in the order of round ``n`` (rotated)."""
    line = f"({n + 1}) Is Sintra far from there?"  # every row asks it: only the history before it differs
    branch = store.branch_conversation(parent, after)
    store.add_message(branch, "user", line)
    tail = store.keep_last_turns(parent, 2)
    store.add_message(tail, "user", line)
    asks: dict[str, tuple[list[dict[str, str]], dict[str, Any]]] = {
        "follow-up": ([*history(store, parent), {"role": "user", "content": line}], {"conversation_id": parent}),
        "branch": (history(store, branch), {"conversation_id": branch}),
        "cold": (history(store, branch), {"conversation_id": f"cold-{n}", "prefix_cache": False}),
        "tail": (history(store, tail), {"conversation_id": tail}),
    }
    order = ROWS[n % len(ROWS) :] + ROWS[: n % len(ROWS)]
    done = {name: runner.ask(asks[name][0], ASK_TOKENS, speculative=SPECULATIVE, **asks[name][1]) for name in order}
    forget(runner, [branch, tail])
    return done


def forget(runner: Runner, conversation_ids: list[str]) -> None:
    """Drop these chats' prefix-cache entries (on the engine thread, before the next request)."""
    keys = [conversation_key(c) for c in conversation_ids]

    def drop(engine: Any) -> None:
        for key in keys:
            if engine.prefix_cache is not None:
                engine.prefix_cache.entries.pop(key, None)

    runner.client.backend.call(drop)  # type: ignore[attr-defined]  # the local Engine


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = max(1, args.runs)
    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")
    results: dict[str, list[Done]] = {name: [] for name in ROWS}
    try:
        runner.ask([{"role": "user", "content": "Hello"}], 4, speculative=SPECULATIVE, prefix_cache=False)  # warm
        with tempfile.TemporaryDirectory(prefix="brisk-bench-branch-") as folder, Store(Path(folder) / "h.db") as store:
            parent, after = build_parent(runner, store)
            for n in range(rounds):
                for name, done in one_round(runner, store, parent, after, n).items():
                    results[name].append(done)
    finally:
        runner.close()
    return report(results, runner.loaded.info.quant, rounds)


def report(results: dict[str, list[Done]], quant: str, rounds: int) -> dict[str, Any]:
    ttft = ttfts(results)
    follow = median(ttft["follow-up"])
    body = []
    for name in ROWS:
        m = [d.metrics for d in results[name]]
        body.append(
            [
                LABELS[name],
                spread([x.prompt_tokens for x in m]),
                spread([x.cached_tokens for x in m]),
                spread([x.computed_tokens for x in m]),
                spread([1000 * x.lookup_s for x in m if x.lookup_s is not None]),
                spread([1000 * x.prefill_s for x in m if x.prefill_s is not None]),
                spread([1000 * t for t in ttft[name]]),
                f"{median(ttft[name]) / follow:.2f}x" if follow > 0 else "-",
            ]
        )
    head = [
        "first reply of",
        "prompt tokens",
        "reused",
        "computed",
        "lookup ms",
        "prefill ms",
        "TTFT ms",
        "vs follow-up",
    ]
    same = all(b.text == c.text for b, c in zip(results["branch"], results["cold"], strict=True))
    ratio = median(ttft["branch"]) / follow if follow > 0 else float("nan")
    cold_ratio = median(ttft["cold"]) / max(1e-9, median(ttft["branch"]))
    print(f"\n## A branch's first reply against a cold chat and a follow-up ({quant}, {rounds} rounds interleaved)\n")
    print(markdown_table(head, body))
    verdict = "met" if ratio <= TARGET else "missed"
    print(
        f"\nbranch / follow-up: {ratio:.2f}x (target <= {TARGET}x: {verdict}); cold / branch: {cold_ratio:.1f}x; "
        f"branch replies identical to cold: {'yes' if same else 'NO'}"
    )
    return {
        "rows": {name: [{k: getattr(d.metrics, k) for k in FIELDS} for d in results[name]] for name in ROWS},
        "branch_over_follow_up": ratio,
        "cold_over_branch": cold_ratio,
        "target": TARGET,
        "identical": same,
        "rounds": rounds,
    }
