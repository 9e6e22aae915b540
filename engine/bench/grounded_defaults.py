"""Grounded replies under the window's default sampling: faithful to the text, and how well prompt lookup drafts.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/python -m engine.bench.grounded_defaults [ROUNDS]``
(3 unless given); prints a table and writes ``bench/results/grounded_defaults.json`` (with every reply).  One
engine on the bundled model (its mode as installed, ``quant="auto"``), the answer cache off.  Each prompt is
asked under the window's defaults (greedy, repetition penalty 1.1, the loop stop) and plain greedy (penalty 1),
each with speculation off and with prompt lookup, interleaved round by round.  Per row: tokens/s (median and
range), lookup's drafted and accepted tokens, whether the reply equals speculation off's, and whether it
keeps the text's facts (each of ``FACTS`` appears).  The prompts rewrite or question a held-out text given in
the prompt: a paragraph to put in the present tense, an article to respell, a document attached as the window
sends it (``engine.documents.render.with_documents``).  The repetition penalty decides how much of the text a
reply may repeat (``engine.runtime.sampling.recent``: the reply's last 64 tokens), so this is its measure.
"""

from __future__ import annotations

import sys
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec, Sampling
from engine.bench.common import median, save, table
from engine.bench.speculative import ARTICLE
from engine.client import Client, local_backend
from engine.documents import render

LIGHTHOUSE = (
    "The lighthouse on Skerry Point was built in 1873 by the Northern Lighthouse Board. Its tower was made of "
    "granite from the quarry at Furnace, and its lamp burned paraffin until 1921, when it was changed to "
    "electricity. Three keepers lived in the cottages beside the tower, and they took turns to watch the light "
    "through the night. The last keeper left in 1989, when the light was automated."
)
HANDBOOK = (
    "Office handbook. The office opens at 8:30 and closes at 17:00 on weekdays. Visitors sign in at the front "
    "desk and wear a green badge. Expenses under 50 euros need no receipt; larger ones need a receipt and the "
    "approval of a team lead. Holiday requests go to the HR portal at least two weeks ahead. The fire assembly "
    "point is the car park behind building B."
)
PROMPTS: dict[str, tuple[list[dict[str, str]], tuple[str, ...]]] = {
    "rewrite: present tense": (
        [{"role": "user", "content": f"Rewrite this paragraph in the present tense:\n\n{LIGHTHOUSE}"}],
        ("1873", "granite", "1921"),
    ),
    "rewrite: British spelling": (
        [
            {
                "role": "user",
                "content": f"Rewrite the following text with British spelling, keeping everything "
                f"else the same:\n\n{ARTICLE}",
            }
        ],
        ("2.4 million", "six", "fifteenth of May"),
    ),  # fmt: skip
    "document question": (
        render.with_documents(
            [{"role": "user", "content": "What does the handbook say about expenses and holiday requests?"}],
            [render.Whole("handbook", "handbook.pdf", HANDBOOK)],
            [],
        ),
        ("50 euros", "receipt", "two weeks"),
    ),
}
DEFAULTS = Sampling(repetition_penalty=1.1, stop_repeats=3)  # the window's (engine.storage.settings)
VARIANTS = {"defaults (penalty 1.1)": DEFAULTS, "penalty 1.0": Sampling(stop_repeats=3)}
MAX_TOKENS = 128


def run(rounds: int = 3) -> dict[str, Any]:
    client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)), timeout=600)
    loaded = client.load(ModelSpec(source="", quant="auto"))
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        for _ in range(rounds):
            for name, (messages, _facts) in PROMPTS.items():
                for variant, sampling in VARIANTS.items():
                    for source in ("off", "lookup"):
                        params = Sampling(**{**sampling.__dict__, "max_tokens": MAX_TOKENS})
                        done = client.ask(messages, params, speculative=source, prefix_cache=True)
                        m = done.metrics
                        runs.setdefault((name, variant, source), []).append(
                            {
                                "text": done.text,
                                "tps": m.tokens_per_s or 0.0,
                                "drafted": m.drafted,
                                "accepted": m.accepted,
                                "tokens": m.completion_tokens,
                            }  # fmt: skip
                        )
    finally:
        client.close()
    rows = []
    for (name, variant, source), replies in runs.items():
        tps = [r["tps"] for r in replies]
        reference = runs[(name, variant, "off")][0]["text"]
        facts = PROMPTS[name][1]
        rows.append(
            {
                "prompt": name,
                "sampling": variant,
                "source": source,
                "tok/s": f"{median(tps):.0f} ({min(tps):.0f}-{max(tps):.0f})",
                "accepted/drafted": f"{sum(r['accepted'] for r in replies)}/{sum(r['drafted'] for r in replies)}",
                "identical": "yes" if all(r["text"] == reference for r in replies) else "NO",
                "facts kept": f"{sum(f in replies[0]['text'] for f in facts)}/{len(facts)}",
            }
        )
    print(f"{loaded.model_name}, {loaded.info.quant}, {MAX_TOKENS} new tokens, {rounds} rounds")
    print(table("Grounded replies under the default sampling", rows))
    return {"rows": rows, "replies": {" | ".join(k): v for k, v in runs.items()}}


if __name__ == "__main__":
    print(f"\nwrote {save('grounded_defaults', run(int(sys.argv[1]) if len(sys.argv) > 1 else 3))}")
