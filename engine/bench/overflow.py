"""``brisk bench overflow``: the reply after a chat outgrows the context starts from the cached prefix.

The model's context is set to ``--context`` tokens (default ``CONTEXT``; the
bundled model's own is 8,192, too long to fill in a benchmark's time) and a
chat with a long system prompt (the first ``SYSTEM_WORDS`` words of
``LONG_SYSTEM``, about 600 tokens, as an attached document makes one) grows one greedy question-and-reply turn at a
time until its prompt no longer fits.  The chat's policy is the default,
``drop-middle`` (``engine.runtime.prompt``): the system prompt and the newest
turns stay, the middle turns go, at cuts that stay put while the chat grows.
Each round is a new chat (its own conversation id and questions); in it, as
the chat has them:

* **before**: the last reply whose prompt still fits (a follow-up: the
  conversation's own cache entry holds all but the new question);
* **first after a truncation**: the next reply, whose prompt drops the middle
  turns, sent at once (on even rounds): the system prompt comes from the
  cache, the kept turns are computed;
* **first after, typed** (on odd rounds): the same, with the question handed
  to the engine as the window's prefill while typing does
  (``Engine.hint``, ``engine.runtime.hints``) for as long as typing it takes
  at ``TYPING_CPS`` characters a second, then sent: the kept turns are
  prefilled while it is typed;
* **next after**: one more turn, at the same cut: warm again;
* **same prompt, cold**: the first-after prompt with the prefix cache off
  (every token computed), run before the next-after reply on odd rounds and
  after it on even ones, so drift spreads over both.

TTFT is the engine's (``Metrics.ttft_s``, submission to first token); cells are
"median (min-max)" over ``--runs`` rounds.  The first reply after a truncation
is checked token for token against its cold run (greedy: the cache changes
nothing).  Speculative decoding and the answer cache are off: this measures
the prompt.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from engine.api import Done, Request, Sampling
from engine.bench.common import LONG_SYSTEM, Runner, fresh_data_dir, markdown_table, median, spread, ttfts

SPECULATIVE = "off"
CONTEXT = 1536  # tokens: the system prompt plus about 18 turns fill it
SYSTEM_WORDS = 360  # of LONG_SYSTEM: about 600 tokens
SYSTEM = " ".join(LONG_SYSTEM.split()[:SYSTEM_WORDS])
REPLY_TOKENS = 16  # every reply of the chat (the prompt budget depends on it, so the measured ones too)
MAX_TURNS = 200  # a chat that never overflows (a context far larger than its turns) stops here
TYPING_CPS = 8  # characters a second: the question is typed in about 8 s
ROWS = ("before", "first-after", "typed-after", "next-after", "cold")
LABELS = {
    "before": "last reply that fits (follow-up)",
    "first-after": "first reply after the truncation, sent at once",
    "typed-after": "first reply after the truncation, typed",
    "next-after": "next reply, same cut",
    "cold": "first-after prompt, prefix cache off",
}
TOPICS = ("the packing list", "the ferry times", "the museum passes", "the hiking route", "the rain gear")


def question(round_no: int, turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return f"Day {turn} of trip {round_no + 1}: what should I know about {topic}? Answer in one sentence."


def one_round(runner: Runner, n: int) -> dict[str, Done]:
    """One new chat grown past the context; each row's reply once (the cold one before or after the chat)."""
    conversation = f"overflow-bench-{n}"
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    out: dict[str, Done] = {}
    done: Done | None = None
    for turn in range(1, MAX_TURNS + 1):
        messages.append({"role": "user", "content": question(n, turn)})
        asked = list(messages)
        if n % 2 and not fits(runner, messages):  # the truncating question, typed: prefilled meanwhile
            type_in(runner, asked, conversation)
        done = runner.ask(asked, REPLY_TOKENS, speculative=SPECULATIVE, conversation_id=conversation)
        messages.append({"role": "assistant", "content": done.text})
        if done.metrics.truncated:
            break
        out["before"] = done
    if done is None or not done.metrics.truncated or "before" not in out:
        raise RuntimeError(f"the chat never outgrew a {runner.model.context_length}-token context; lower --context")
    out["typed-after" if n % 2 else "first-after"] = done
    dropped = done.metrics.dropped
    kept = [messages[0], *asked[1 + dropped[1] :]]  # what the first-after prompt holds
    messages.append({"role": "user", "content": question(n, turn + 1)})
    order = ("cold", "next-after") if n % 2 else ("next-after", "cold")
    for name in order:
        if name == "cold":
            cold = runner.ask(kept, REPLY_TOKENS, speculative=SPECULATIVE, conversation_id=f"c{n}", prefix_cache=False)
            out["cold"] = cold
        else:
            out[name] = runner.ask(messages, REPLY_TOKENS, speculative=SPECULATIVE, conversation_id=conversation)
    return {name: out[name] for name in ROWS if name in out}


def fits(runner: Runner, messages: list[dict[str, str]]) -> bool:
    """Whether the chat's prompt fits the context as the engine will render it (nothing dropped)."""
    from engine.runtime.prompt import build_prompt

    model = runner.model
    return not build_prompt(model.tokenizer, messages, model.context_length, REPLY_TOKENS).truncated


def type_in(runner: Runner, messages: list[dict[str, str]], conversation: str) -> None:
    """Hand the engine the draft as the window does while it is typed, then wait as long as typing it takes."""
    draft = messages[-1]["content"]
    request = Request(
        id=uuid.uuid4().hex,
        messages=tuple(messages),
        sampling=Sampling(max_tokens=REPLY_TOKENS),
        conversation_id=conversation,
        speculative=SPECULATIVE,
        answer_cache=False,
    )
    runner.client.backend.hint(request)  # type: ignore[attr-defined]
    time.sleep(len(draft) / TYPING_CPS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = max(1, args.runs)
    context = getattr(args, "context", None) or CONTEXT
    chats: list[dict[str, Done]] = []
    with fresh_data_dir():  # no saved prefixes from another run, none written to the user's folder
        runner = Runner(args.model, args.dtype, quant=args.quant or "auto")
        try:
            if context > runner.model.context_length:
                raise SystemExit(f"--context {context} is more than the model's {runner.model.context_length}")
            runner.model.context_length = context  # the engine fits prompts to this (a smaller window)
            runner.ask([{"role": "user", "content": "Hello"}], 4, speculative=SPECULATIVE, prefix_cache=False)  # warm
            chats = [one_round(runner, n) for n in range(rounds)]
        finally:
            runner.close()
    return report(chats, runner.loaded.info.quant, context)


def report(chats: list[dict[str, Done]], quant: str, context: int) -> dict[str, Any]:
    results = {name: [chat[name] for chat in chats if name in chat] for name in ROWS}
    ttft = ttfts(results)
    before = median(ttft["before"])
    body = []
    for name in ROWS:
        m = [d.metrics for d in results[name]]
        body.append(
            [
                LABELS[name],
                spread([x.prompt_tokens for x in m]),
                spread([x.cached_tokens for x in m]),
                spread([x.typed_tokens for x in m]),
                spread([x.computed_tokens for x in m]),
                spread([1000 * t for t in ttft[name]]),
                f"{median(ttft[name]) / before:.2f}x" if before > 0 else "-",
            ]
        )
    head = ["reply", "prompt tokens", "reused", "of them typed", "computed", "TTFT ms", "vs before"]
    firsts = [chat.get("first-after") or chat["typed-after"] for chat in chats]
    same = all(first.text == chat["cold"].text for first, chat in zip(firsts, chats, strict=True))
    dropped = [d.metrics.dropped for d in firsts]
    title = f"The reply after a truncation ({quant}, context {context:,}, {len(chats)} chats, one a round)"
    print(f"\n## {title}\n")
    print(markdown_table(head, body))
    after, typed = median(ttft["first-after"]), median(ttft["typed-after"])
    print(
        f"\nfirst after / before: {after / before:.2f}x (typed: {typed / before:.2f}x); "
        f"cold / first after: {median(ttft['cold']) / after:.1f}x; "
        f"turns dropped: {', '.join(f'{a}-{b}' for a, b in dropped)}; "
        f"first-after replies identical to cold: {'yes' if same else 'NO'}"
    )
    keys = ("prompt_tokens", "cached_tokens", "typed_tokens", "computed_tokens", "ttft_s", "dropped")
    return {
        "context": context,
        "rounds": [{name: {k: getattr(d.metrics, k) for k in keys} for name, d in chat.items()} for chat in chats],
        "identical": same,
    }
