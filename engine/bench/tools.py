"""Tools benchmark: does the model call the calculator, with Brisk's own tool prompt and without?

``brisk bench tools`` (default: the bundled SmolLM2-135M, whose chat template has no tool section).
Twenty arithmetic questions, each asked with the ``calculator`` tool enabled, greedy, speculation off, the
answer cache off, in two variants interleaved question by question:

* ``tool prompt``: ``Request.tool_prompt`` on (the default): a template that ignores ``tools`` gets the
  schemas and a call format in its system message (``engine.tools.prompt``);
* ``template only``: off: the prompt is what the chat template makes of the ``tools`` argument (for the
  bundled model: nothing, as before).

Per variant: the share of replies that called the calculator, that called it with an expression giving
the right value, and whose final text (after the tool round) holds the right value; the prompt tokens of
the first round (the tool prompt's cost) and the median time of a whole reply.

A second table measures how a user's ``/calculator`` result reads to the model: the same questions with
the slash line, the result put in the user's message in today's wording (``engine.tools.run.result_text``)
and in the wording used before (``Tool calculator {...} returned:``), and how often the reply states the
value.  The model is small: the rates are what it does, not what a larger model would.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from engine.api import Done, Request, Sampling, Started, ToolCall
from engine.bench.common import Runner, median, table

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("What is 17 times 23?", "17*23"),
    ("What is 844 plus 379?", "844+379"),
    ("What is 1000 minus 387?", "1000-387"),
    ("What is 144 divided by 12?", "144/12"),
    ("What is 2 to the power of 10?", "2**10"),
    ("What is the square root of 729?", "sqrt(729)"),
    ("How much is 58 * 47?", "58*47"),
    ("Calculate 3.5 * 4.2.", "3.5*4.2"),
    ("What is 15% of 240?", "0.15*240"),
    ("What is 12345 + 67890?", "12345+67890"),
    ("What is 99 squared?", "99**2"),
    ("What is 7 factorial divided by 5?", "5040/5"),
    ("What do I get if I multiply 256 by 16?", "256*16"),
    ("What is 81 divided by 9, plus 6?", "81/9+6"),
    ("What is (45 + 55) * 3?", "(45+55)*3"),
    ("Compute 987 - 123 - 45.", "987-123-45"),
    ("What is 6 cubed?", "6**3"),
    ("What is 1024 divided by 32?", "1024/32"),
    ("What is 31 times 31?", "31*31"),
    ("How much is 4500 divided by 25?", "4500/25"),
)
VARIANTS = ("tool prompt", "template only")
SLASH_VARIANTS = ("result wording now", "result wording before")
MAX_TOKENS = 64


def _expected(expression: str) -> str:
    """The calculator's own answer for ``expression`` (the value a correct call gives)."""
    from engine.tools.calculator import calculator_tool

    return str(calculator_tool().fn({"expression": expression}))


def _number_in(value: str, text: str) -> bool:
    """Whether ``text`` states ``value`` (``12.0`` also as ``12``; digits grouped with commas too)."""
    forms = {value}
    if value.endswith(".0"):
        forms.add(value[:-2])
    for form in list(forms):
        if form.isdigit() and len(form) > 3:
            forms.add(f"{int(form):,}")
    return any(f in text for f in forms)


def _ask(runner: Runner, messages: list[dict[str, Any]], **fields: Any) -> tuple[list[Any], Done]:
    request = Request(
        id=uuid.uuid4().hex,
        messages=tuple(messages),
        sampling=Sampling(max_tokens=MAX_TOKENS),
        speculative="off",
        answer_cache=False,
        **fields,
    )
    events = list(runner.client.stream(request))
    last = events[-1]
    assert isinstance(last, Done), f"the reply failed: {last!r}"
    return events, last


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model.tool_template import template_renders_tools

    runner = Runner(args.model, args.dtype, quant=args.quant or "auto")  # the weights a user gets
    results: dict[str, dict[str, list[float]]] = {v: {} for v in (*VARIANTS, *SLASH_VARIANTS)}
    samples: dict[str, list[str]] = {v: [] for v in VARIANTS}
    try:
        renders = template_renders_tools(runner.model.tokenizer)
        for question, expression in QUESTIONS:
            value = _expected(expression)
            for variant in VARIANTS:
                events, done = _ask(
                    runner,
                    [{"role": "user", "content": question}],
                    tools=("calculator",),
                    tool_prompt=variant == "tool prompt",
                )
                calls = [e for e in events if isinstance(e, ToolCall) and e.name == "calculator"]
                started = next(e for e in events if isinstance(e, Started))
                r = results[variant]
                r.setdefault("called", []).append(1.0 if calls else 0.0)
                r.setdefault("right call", []).append(1.0 if any(c.ok and c.result == value for c in calls) else 0.0)
                r.setdefault("right answer", []).append(1.0 if _number_in(value, done.text) else 0.0)
                r.setdefault("prompt", []).append(float(started.prompt_tokens))
                r.setdefault("total", []).append(done.metrics.total_s or 0.0)
                samples[variant].append(done.text[:160])
            for variant in SLASH_VARIANTS:
                if variant == "result wording now":
                    messages = [{"role": "user", "content": f"{question}\n/calculator {expression}"}]
                    _events, done = _ask(runner, messages, tools=("calculator",))
                else:  # the same message as the slash line left it before, in the earlier wording
                    args_json = json.dumps({"expression": expression})
                    content = f"{question}\n\nTool calculator {args_json} returned:\n{value}"
                    _events, done = _ask(runner, [{"role": "user", "content": content}])
                results[variant].setdefault("right answer", []).append(1.0 if _number_in(value, done.text) else 0.0)
    finally:
        runner.close()
    n = len(QUESTIONS)
    rows = []
    for variant in VARIANTS:
        r = results[variant]
        rows.append(
            {
                "variant": variant,
                "called calculator": f"{sum(r['called']):.0f}/{n}",
                "right call": f"{sum(r['right call']):.0f}/{n}",
                "right answer": f"{sum(r['right answer']):.0f}/{n}",
                "prompt tokens (median)": int(median(r["prompt"])),
                "total s (median)": median(r["total"]),
            }
        )
    name = runner.loaded.model_name
    print(
        table(
            f"Calculator calls on {name} ({runner.loaded.info.quant}; template renders tools: {renders}): "
            f"{n} questions, greedy, {MAX_TOKENS} tokens a round, speculation off",
            rows,
        )
    )
    slash_rows = [
        {"slash result": v, "reply states the value": f"{sum(results[v]['right answer']):.0f}/{n}"}
        for v in SLASH_VARIANTS
    ]
    print(table(f"/calculator results in the user's message, {name}: the same {n} questions", slash_rows))
    return {"rows": rows, "slash_rows": slash_rows, "template_renders_tools": renders, "samples": samples}
