"""Structured output benchmark: JSON by construction against JSON by asking nicely, on the bundled model.

Four schemas (a flat object, a nested object with enums, an array of objects, a tool call), two questions
each, every question carrying the schema in its text ("Reply only with JSON matching this schema: ...").
Three variants per question, interleaved round by round, on the weights a user gets (``--quant``, default
auto), greedy, speculation off (so the grammar is the only difference): ``free`` (no format: the model
is only asked), ``format`` (``Sampling.format`` set: masked sampling and jump-forward) and ``format, no
jump-forward`` (masking alone).  Per schema: the rate of
replies that parse and validate (``jsonschema``), the median total time and tokens/s, the share of reply
tokens the grammar forced, and the mask's cost per token (the grammar replayed over each constrained
reply, timed alone).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from engine.api import Sampling, reply_format
from engine.bench.common import Runner, median, table
from engine.runtime import grammar

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat object": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "country", "population"],
        "additionalProperties": False,
    },
    "nested, enums": {
        "type": "object",
        "properties": {
            "employee": {
                "type": "object",
                "properties": {
                    "full_name": {"type": "string"},
                    "department": {"enum": ["engineering", "marketing", "finance", "support"]},
                    "seniority": {"enum": ["junior", "senior", "principal"]},
                },
                "required": ["full_name", "department", "seniority"],
                "additionalProperties": False,
            },
            "remote_worker": {"type": "boolean"},
        },
        "required": ["employee", "remote_worker"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "minItems": 2,
        "maxItems": 4,
        "items": {
            "type": "object",
            "properties": {"ingredient_name": {"type": "string"}, "quantity_in_grams": {"type": "integer"}},
            "required": ["ingredient_name", "quantity_in_grams"],
            "additionalProperties": False,
        },
    },
    "tool call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather_forecast"},
            "arguments": {
                "type": "object",
                "properties": {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["location", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}
QUESTIONS: dict[str, tuple[str, str]] = {
    "flat object": ("Give me a city and its country.", "Which is the largest city in Japan?"),
    "nested, enums": ("Describe a new hire at a software company.", "Make up an accountant who works from home."),
    "array of objects": ("What goes into a pancake batter?", "List what I need for a tomato salad."),
    "tool call": ("What will the weather be in Lisbon tomorrow?", "Is it going to rain in Toronto this week?"),
}
VARIANTS = ("free", "format", "format, no jump-forward")


def _valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _mask_cost(runner: Runner, fmt: str, text: str) -> tuple[float, int]:
    """Seconds per token to mask and advance the grammar over ``text``'s tokens, and how many were timed."""
    model = runner.model
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    eos = frozenset(model.eos_ids)
    g = grammar.compile_format(fmt, model.tokenizer, runner.client.backend.decoder.vocab_size, eos)  # type: ignore[attr-defined]
    import torch

    row = torch.zeros(runner.client.backend.decoder.vocab_size)  # type: ignore[attr-defined]
    timed = 0
    began = time.perf_counter()
    for token in ids:
        g.masked(row)
        try:
            g.accept([token])
        except grammar.FormatError:
            break  # a re-tokenisation the grammar splits otherwise: the rest is not timed
        timed += 1
    return (time.perf_counter() - began) / max(1, timed), timed


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = max(1, args.runs // 2)
    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")  # the weights a user gets
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    costs: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for name, schema in SCHEMAS.items():
                fmt = reply_format("json_schema", schema)
                for question in QUESTIONS[name]:
                    content = f"{question}\nReply only with JSON matching this schema: {json.dumps(schema)}"
                    messages = [{"role": "user", "content": content}]
                    for variant in VARIANTS:
                        grammar.JUMP_FORWARD = variant != "format, no jump-forward"
                        sampling = Sampling(max_tokens=200, format="" if variant == "free" else fmt)
                        done = runner.client.ask(messages, sampling, speculative="off", answer_cache=False)
                        m = done.metrics
                        r = results.setdefault((name, variant), {"valid": [], "total": [], "tps": [], "forced": []})
                        r["valid"].append(1.0 if _valid(done.text, schema) else 0.0)
                        r["total"].append(m.total_s or 0.0)
                        r["tps"].append(m.tokens_per_s or 0.0)
                        r["forced"].append(m.forced / m.completion_tokens if m.completion_tokens else 0.0)
                        if variant == "format":
                            costs.setdefault(name, []).append(_mask_cost(runner, fmt, done.text)[0])
    finally:
        grammar.JUMP_FORWARD = True
        runner.close()
    rows = []
    for name in SCHEMAS:
        free, shaped, masked = (results[(name, v)] for v in VARIANTS)
        rows.append(
            {
                "schema": name,
                "valid, free": f"{sum(free['valid']) / len(free['valid']):.0%}",
                "valid, format": f"{sum(shaped['valid']) / len(shaped['valid']):.0%}",
                "total s, free": median(free["total"]),
                "total s, format": median(shaped["total"]),
                "total s, no jump-fwd": median(masked["total"]),
                "tok/s free": median(free["tps"]),
                "tok/s format": median(shaped["tps"]),
                "forced": f"{median(shaped['forced']):.0%}",
                "mask us/token": median(costs[name]) * 1e6,
            }
        )
    print(
        table(
            f"Structured output ({runner.loaded.info.quant}): greedy, speculation off, 2 questions per schema, "
            f"median of {rounds} rounds",
            rows,
        )
    )
    return {"rows": rows, "rounds": rounds}
