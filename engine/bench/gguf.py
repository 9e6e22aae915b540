"""``brisk bench gguf --model FILE``: a GGUF file run on its own blocks, measured as a user meets it.

Each run is a new ``brisk ask`` process on an empty data folder (the first start) and again on
that folder (a later start), timed from the process's launch: the first token's time, the whole
reply, the process's peak RSS (its own ``ru_maxrss``, from ``wait4``) and the bytes the data folder holds
afterwards.  Then, in one process, warm greedy replies on held-out prompts, interleaved: decode
tok/s as installed (speculation ``auto``) and with speculation off, and a new prompt of about 700
tokens' prefill tok/s (no earlier round's prefix to reuse); ``--draft-model`` adds a row with that
draft.  Medians with ranges.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from engine.bench.common import Runner, ask_in_new_process, markdown_table, spread

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in three sentences.",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
    "Rename the variable x to total in: def f(x):\n    x = x + 1\n    return x * x",
]
LONG = " ".join(f"Item {i}: the parcel to room {i % 17} weighs {i * 3 % 50} kg." for i in range(40))


def _ask(model: str, data: str, max_tokens: int) -> dict[str, Any]:
    """One ``brisk ask`` in a new process: seconds from launch to its first token and to its end, peak RSS."""
    flags = ["--model", model, "--max-tokens", str(max_tokens), "--no-answer-cache"]
    cold = ask_in_new_process(PROMPTS[0], flags, data_dir=data)
    written = sum(p.stat().st_size for p in Path(data).rglob("*") if p.is_file())
    return {"first": cold.first_token_s, "total": cold.total_s, "rss": cold.peak_rss_bytes, "written": written,
            "rc": cold.returncode}  # fmt: skip


def _speeds(model: str, draft: str, runs: int, max_tokens: int) -> list[list[str]]:
    from engine.api import Sampling

    runner = Runner(model, quant="auto", draft=draft)
    modes = ["auto", "off"] + (["draft"] if draft else [])
    got: dict[str, list[float]] = {m: [] for m in modes}
    accepted: list[float] = []
    prefill: list[float] = []
    try:
        runner.ask([{"role": "user", "content": "hi"}], 8, speculative="off")  # warm
        for r in range(runs):
            for i, prompt in enumerate(PROMPTS):
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # take turns going first
                    done = runner.ask([{"role": "user", "content": f"{prompt} ({r}.{i})"}], max_tokens,
                                      speculative=mode)  # fmt: skip
                    got[mode].append(done.metrics.tokens_per_s or 0.0)
                    if mode == "draft":
                        accepted.append(done.metrics.acceptance or 0.0)
            done = runner.client.ask([{"role": "user", "content": f"({r}) {LONG}"}], Sampling(max_tokens=1),
                                     speculative="off")  # fmt: skip
            prefill.append(done.metrics.computed_tokens / (done.metrics.prefill_s or float("nan")))
    finally:
        runner.close()
    rows = [[f"decode tok/s, speculation {m}", spread(v, "{:.1f}")] for m, v in got.items()]
    if accepted:
        rows.append(["draft acceptance", spread(accepted, "{:.2f}")])
    rows.append([f"prefill tok/s ({int(done.metrics.computed_tokens)} tokens)", spread(prefill, "{:.1f}")])
    return rows


def run(args: Any) -> dict[str, Any]:
    model = str(Path(args.model).expanduser()) if args.model else ""
    if not model.lower().endswith(".gguf"):
        print("brisk bench gguf measures a .gguf file: give --model FILE.gguf")
        return {}
    runs = max(1, int(args.runs or 3))
    starts: dict[str, list[dict[str, Any]]] = {"first start (empty data folder)": [], "later start": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="brisk-bench-gguf-") as data:
            starts["first start (empty data folder)"].append(_ask(model, data, 16))
            starts["later start"].append(_ask(model, data, 16))
    body = []
    for name, results in starts.items():
        body.append([f"{name}: launch to first token, s", spread([r["first"] for r in results], "{:.2f}")])
        body.append([f"{name}: peak RSS, MB", spread([r["rss"] / 2**20 for r in results], "{:.0f}")])
    body.append(
        ["written to the data folder, KB", spread([r["written"] / 1024 for r in starts["later start"]], "{:.1f}")]
    )
    body += _speeds(model, getattr(args, "draft_model", "") or "", runs, int(args.max_tokens or 128))
    size = Path(model).stat().st_size
    print(f"\n## {Path(model).name} ({size / 2**20:,.0f} MB), {runs} runs\n")
    print(markdown_table(["measure", "median (range)"], body))
    return {"model": model, "rows": body, "starts": starts}
