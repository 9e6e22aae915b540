"""Prefix-cache benchmark: TTFT with the cache off (cold) and on (warm).

1. A system prompt of about 1,200 tokens and several different questions:
   cold TTFT (cache off) against warm TTFT (cache on, after one request has
   seeded it), median of ``--runs`` rounds.
2. A 10-turn conversation run twice, cache on and off: TTFT of every turn,
   with the prompt tokens computed, so growth can be checked against the new
   tokens' prefill.

Both run with speculative decoding off (``SPECULATIVE``): they measure the prompt, not decode.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.bench.common import Runner, median, table

SPECULATIVE = "off"  # these measure prefill and TTFT; decode is plain
TOPICS = [
    "returns",
    "shipping",
    "warranty",
    "payments",
    "accounts",
    "privacy",
    "gift cards",
    "repairs",
    "subscriptions",
    "accessibility",
]
QUESTIONS = [
    "How long do I have to return a jacket?",
    "Do you ship to Canada?",
    "Is water damage covered by the warranty?",
    "Can I pay with a gift card and a credit card together?",
    "How do I delete my account?",
    "Can I repair my bike in a store?",
]


def long_system_prompt(target_tokens: int, tokenizer: Any) -> str:
    parts = ["You are the support assistant of Northwind Outfitters. Follow the policy below exactly."]
    i = 0
    while len(tokenizer("\n".join(parts))["input_ids"]) < target_tokens:
        topic = TOPICS[i % len(TOPICS)]
        parts.append(
            f"Policy {i + 1} ({topic}): customers asking about {topic} must be told the rule number {i + 1}, "
            f"that requests are answered within {i % 5 + 1} business days, and that the {topic} desk is open "
            f"from {8 + i % 3}:00 to {17 + i % 4}:00 on weekdays. Never promise exceptions for {topic}."
        )
        i += 1
    return "\n".join(parts)


def shared_system_prompt(runner: Runner, runs: int) -> tuple[list[dict[str, Any]], int]:
    system = long_system_prompt(1200, runner.model.tokenizer)
    cold: list[float] = []
    warm: list[float] = []
    reused: list[int] = []
    prompt_tokens = 0
    runner.ask(
        [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}],
        max_tokens=4,
        speculative=SPECULATIVE,
    )
    for round_ in range(runs):
        for q in QUESTIONS:
            question = q if round_ == 0 else f"{q} (ticket {round_})"  # every warm question is new
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            c = runner.ask(messages, max_tokens=4, prefix_cache=False, speculative=SPECULATIVE)
            w = runner.ask(messages, max_tokens=4, conversation_id=f"bench-{q}-{round_}", speculative=SPECULATIVE)
            cold.append(_seconds(c.metrics.ttft_s))
            warm.append(_seconds(w.metrics.ttft_s))
            reused.append(w.metrics.cached_tokens)
            prompt_tokens = w.metrics.prompt_tokens
    rows = [
        {"cache": "off (cold)", "ttft_ms (median)": 1000 * median(cold), "prompt tokens": prompt_tokens, "reused": 0},
        {
            "cache": "on (warm)",
            "ttft_ms (median)": 1000 * median(warm),
            "prompt tokens": prompt_tokens,
            "reused": int(median([float(r) for r in reused])),
        },
    ]
    rows[1]["speed-up"] = median(cold) / median(warm)
    rows[0]["speed-up"] = 1.0
    return rows, prompt_tokens


TURNS = [
    "Hi! I'm planning a trip to Portugal.",
    "What should I see in Lisbon?",
    "How many days would you spend there?",
    "What about Porto?",
    "Is it easy to travel by train between them?",
    "What food should I try?",
    "Any tips for saving money?",
    "What is the weather like in May?",
    "Should I rent a car?",
    "Thanks! Can you summarise the plan in three lines?",
]


def ten_turns(runner: Runner, cache: bool) -> list[dict[str, Any]]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a friendly travel assistant."}]
    rows = []
    conversation = f"turns-{cache}"
    for i, text in enumerate(TURNS, 1):
        messages.append({"role": "user", "content": text})
        done = runner.ask(
            messages, max_tokens=48, prefix_cache=cache, conversation_id=conversation, speculative=SPECULATIVE
        )
        messages.append({"role": "assistant", "content": done.text})
        m = done.metrics
        rows.append(
            {
                "turn": i,
                "prompt": m.prompt_tokens,
                "computed": m.computed_tokens,
                "ttft_ms": 1000 * _seconds(m.ttft_s),
                "prefill_ms": 1000 * _seconds(m.prefill_s),
            }
        )
    return rows


def _seconds(value: float | None) -> float:
    """A measured time, or NaN where the reply had none (no token), so medians stay honest."""
    return float("nan") if value is None else value


def run(args: argparse.Namespace) -> dict[str, Any]:
    runner = Runner(args.model, "float32")
    try:
        shared, _ = shared_system_prompt(runner, max(1, args.runs // 2))
        print(
            table(f"Shared ~1,200-token system prompt, different questions (TTFT, speculative {SPECULATIVE})", shared)
        )
        on = ten_turns(runner, True)
        off = ten_turns(runner, False)
    finally:
        runner.close()
    turns = [
        {
            "turn": a["turn"],
            "prompt tokens": a["prompt"],
            "computed (cache on)": a["computed"],
            "ttft_ms cache on": a["ttft_ms"],
            "computed (cache off)": b["computed"],
            "ttft_ms cache off": b["ttft_ms"],
        }
        for a, b in zip(on, off, strict=True)
    ]
    print(table(f"10-turn conversation, TTFT per turn (speculative {SPECULATIVE})", turns))
    per_token = [r["prefill_ms"] / r["computed"] for r in off if r["computed"]]
    print(f"\ncold prefill cost: {median(per_token):.2f} ms/token (median over the cache-off turns)")
    return {
        "shared_system_prompt": shared,
        "ten_turns": turns,
        "cold_prefill_ms_per_token": median(per_token),
        "speculative": SPECULATIVE,
    }
