"""Speculative decoding benchmark: decode speed and acceptance per draft source.

Grounded replies (rewrite or extract from a given text, edit a given piece of
code) and open-ended chat, each run greedily with speculation off and with
each source, in one run and interleaved, so drift hits every variant alike.
A row says whether the output is identical to plain greedy decode.

``answers`` drafts from earlier replies: the first, plain round has answered
each prompt once, as a user asking again (or something close) would find.
``draft`` needs ``--draft-model``; without one it is reported as skipped.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.bench.common import Runner, median, table

ARTICLE = (
    "The city council met on Tuesday to discuss the new cycling plan. The plan adds forty kilometres of "
    "protected bike lanes over three years, starting with the river road in March. Council member Ana Ruiz "
    "said the first phase will cost 2.4 million euros, paid mostly by a regional grant. Shop owners on the "
    "river road asked for loading zones, and the council agreed to add six of them. Construction will close "
    "one lane at a time, so traffic can keep moving. A public meeting about the second phase is set for the "
    "fifteenth of May at the central library, and residents can send comments by email until the end of April. "
    "The council will publish a map of all planned lanes on its website next week."
)
CODE = """def total_price(items):
    total = 0
    for item in items:
        if item["qty"] > 0:
            total = total + item["price"] * item["qty"]
    return total


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
"""
CLASS = """class Cart:
    def __init__(self):
        self.items = []

    def add(self, name, price, qty=1):
        self.items.append({"name": name, "price": price, "qty": qty})

    def total_price(self):
        total = 0
        for item in self.items:
            total += item["price"] * item["qty"]
        return total

    def clear(self):
        self.items = []
"""
GROUNDED = {
    "rewrite": f"Rewrite the following text with British spelling, keeping everything else the same:\n\n{ARTICLE}",
    "extract": f"Copy every sentence from this text that mentions money or a date:\n\n{ARTICLE}",
    "code edit (functions)": (
        f"Rename the function total_price to order_total in this code and return the full code:\n\n{CODE}"
    ),
    "code edit (class)": (
        f"In this Python class, rename total_price to order_total. Return the complete class.\n\n```python\n{CLASS}```"
    ),
}
OPEN = {
    "story": "Write a short story about a fox who learns to sail.",
    "advice": "What are some good habits for staying focused while studying?",
}


Tally = dict[tuple[str, str], dict[str, list[float]]]


def interleaved(
    runner: Runner, prompts: dict[str, str], sources: Any, rounds: int, max_tokens: int
) -> tuple[Tally, dict[tuple[str, str], bool]]:
    """Each prompt under each source, round after round (so drift hits every variant alike): per (prompt,
    source) the tokens/s, drafted and accepted counts, and whether every reply equals plain greedy's ("off")."""
    results: Tally = {}
    reference: dict[str, str] = {}
    identical: dict[tuple[str, str], bool] = {}
    for _ in range(rounds):
        for name, text in prompts.items():
            messages = [{"role": "user", "content": text}]
            for source in sources:
                done = runner.ask(messages, max_tokens=max_tokens, speculative=source, prefix_cache=True)
                m = done.metrics
                r = results.setdefault((name, source), {"tps": [], "drafted": [], "accepted": []})
                r["tps"].append(m.tokens_per_s or 0.0)
                r["drafted"].append(m.drafted)
                r["accepted"].append(m.accepted)
                if source == "off":
                    reference.setdefault(name, done.text)
                identical[(name, source)] = identical.get((name, source), True) and done.text == reference[name]
    return results, identical


def run(args: argparse.Namespace) -> dict[str, Any]:
    has_draft = bool(getattr(args, "draft_model", ""))
    sources = ["off", "lookup", "answers", "auto"] + (["draft"] if has_draft else [])
    prompts = {**{f"grounded: {k}": v for k, v in GROUNDED.items()}, **{f"open: {k}": v for k, v in OPEN.items()}}
    only = getattr(args, "only", "")
    chosen = {name: text for name, text in prompts.items() if only in name}
    if not chosen:
        raise SystemExit(f"no speculative prompt name contains {only!r}; names: {', '.join(prompts)}")
    prompts = chosen
    runner = Runner(args.model, "float32", getattr(args, "draft_model", ""))
    rounds = max(1, args.runs // 2)
    try:
        results, identical = interleaved(runner, prompts, sources, rounds, 160)
    finally:
        runner.close()
    rows = []
    for (name, source), r in results.items():
        base = median(results[(name, "off")]["tps"])
        drafted, accepted = sum(r["drafted"]), sum(r["accepted"])
        rows.append(
            {
                "scenario": name,
                "source": source,
                "tok/s (median)": median(r["tps"]),
                "vs off": median(r["tps"]) / base,
                "acceptance": f"{accepted / drafted:.0%}" if drafted else "-",
                "drafted": drafted,
                "identical": "yes" if identical[(name, source)] else "NO",
            }
        )
    print(table(f"Speculative decoding, greedy, 160 new tokens, median of {rounds} rounds", rows))
    if not has_draft:
        print("\ndraft model: skipped (pass --draft-model PATH with a smaller model of the same family)")
    pair = family_pair(rounds, prompts)
    return {"rows": rows, "family_pair": pair}


PAIR_LAYERS, PAIR_DRAFT_LAYERS, PAIR_LATER_SCALE = 8, 2, 0.25


def family_pair(rounds: int, prompts: dict[str, str]) -> list[dict[str, Any]]:
    """A draft model and its target of one family, as the model library pairs them (the same tokenizer,
    fewer parameters): a random 8-layer Llama (hidden 512) whose layers after the second write a quarter of
    their output into the residual stream, and as its draft its own first two layers (the embedding and head
    shared), saved as two model folders.  Random weights predict no language, so this measures the mechanism
    (loading the pair, drafting, verifying, what it costs and gains at this acceptance), not a trained pair's
    acceptance.  Greedy output must be identical to the target alone."""
    import tempfile
    from pathlib import Path

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.bench.tiny import make_tokenizer

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="brisk-bench-pair-") as tmp:
        tokenizer = make_tokenizer()
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1024,
                             num_hidden_layers=PAIR_LAYERS, num_attention_heads=8, num_key_value_heads=2,
                             max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                             tie_word_embeddings=True)  # fmt: skip
        torch.manual_seed(0)
        target = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            for p in target.parameters():
                p.mul_(4.0) if p.dim() > 1 else None
            for layer in target.model.layers[PAIR_DRAFT_LAYERS:]:
                layer.self_attn.o_proj.weight.mul_(PAIR_LATER_SCALE)
                layer.mlp.down_proj.weight.mul_(PAIR_LATER_SCALE)
        paths = {"target": Path(tmp) / "target", "draft": Path(tmp) / "draft"}
        target.save_pretrained(paths["target"])
        target.model.layers = target.model.layers[:PAIR_DRAFT_LAYERS]
        target.config.num_hidden_layers = PAIR_DRAFT_LAYERS
        target.save_pretrained(paths["draft"])
        for path in paths.values():
            tokenizer.save_pretrained(path)
        runner = Runner(str(paths["target"]), "float32", str(paths["draft"]))
        try:
            results, identical = interleaved(runner, prompts, ("off", "draft"), rounds, 96)
        finally:
            runner.close()
    for (name, source), r in results.items():
        if source == "off":
            continue
        base = median(results[(name, "off")]["tps"])
        drafted, accepted = sum(r["drafted"]), sum(r["accepted"])
        rows.append(
            {
                "scenario": name,
                "off tok/s": median(results[(name, "off")]["tps"]),
                "draft tok/s": median(r["tps"]),
                "speed-up": median(r["tps"]) / base if base else 0.0,
                "acceptance": f"{accepted / drafted:.0%}" if drafted else "-",
                "identical": "yes" if identical[(name, source)] else "NO",
            }
        )
    title = (f"A draft pair of one family (random {PAIR_LAYERS}-layer Llama, its first {PAIR_DRAFT_LAYERS} layers "
             f"as draft; float32, greedy, 96 new tokens, median of {rounds} rounds)")  # fmt: skip
    print(table(title, rows))
    return rows
