"""Quantization benchmark: every mode on the bundled model, side by side, in one run.

``python -m engine.bench.quant [out.json] [--runs N]`` prints one table row per variant
(fp32, bf16, and each quantization mode that is available here) with: load time the
first time (quantize and save) and from the cache, memory held by weights, TTFT for a
~200-token prompt, decode tokens/s (64 greedy tokens, our own loop: one forward a
token through ``engine.model.kv.forward``, the app's KV cache and fast path; fp32 with the
app's oneDNN-packed linears; also the best run, since other processes
on a small machine can stall a run), and next-token agreement with fp32
(teacher-forced argmax over ``AGREEMENT_TEXT``).  Timings are medians over ``runs``
after one warm-up; variants take turns within each run so that load from other
processes hits them alike.  It writes the rows as JSON.  Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from engine.bench.common import markdown_table, median, save

AGREEMENT_TEXT = (
    "The history of the bicycle is a story of many small improvements. The first machines, built in the early "
    "nineteenth century, had no pedals at all: riders sat on a wooden frame between two wheels and pushed "
    "themselves along the ground with their feet. Decades later, inventors in France attached pedals directly "
    "to the front wheel, which made the machine faster but also harder to control. To gain more speed, makers "
    "enlarged the front wheel until it was taller than a grown man, and these high wheelers became popular with "
    "young athletes who enjoyed the danger. Falls were common and often serious. The safety bicycle, which "
    "appeared in England in the 1880s, solved the problem with two wheels of equal size and a chain that drove "
    "the rear wheel. Soon afterwards, air-filled rubber tyres made the ride far more comfortable on rough roads. "
    "Within a few years, millions of people could travel farther than ever before without a horse. Women in "
    "particular found a new kind of freedom, and the bicycle changed the clothes they wore as well as the places "
    "they could go. Cycling clubs organised long tours through the countryside, and road surfaces improved "
    "because riders demanded better ones. Many of the skills learned in bicycle workshops, such as making light "
    "steel tubes and precise ball bearings, were later used to build the first cars and aeroplanes. Today the "
    "bicycle remains one of the most efficient ways to turn human energy into motion, and in many cities it is "
    "once again the quickest way to get from one side of town to the other.\n\n"
    "Water covers about seventy percent of the surface of the Earth, but most of it is salty ocean water that "
    "people cannot drink. Fresh water is found in rivers, lakes, glaciers and underground layers of rock and sand "
    "called aquifers. Farms use the largest share of it, mainly to grow crops in dry regions, while factories and "
    "homes use the rest. As cities grow and the climate changes, many places face shortages during long dry "
    "seasons. Engineers respond in several ways. Some build dams and reservoirs to store rain from wet months. "
    "Others recycle waste water so that it can be used again for parks and industry. In coastal countries, "
    "desalination plants remove salt from sea water, although this process needs a great deal of energy. Simple "
    "habits also help: fixing leaking pipes, watering gardens in the evening, and choosing plants that need little "
    "water can save a surprising amount over a year. Scientists measure rainfall, river flow and the level of "
    "underground water to plan how much can be taken without harming the environment. Good planning matters "
    "because water supports not only people but also the forests, wetlands and animals that depend on it."
)
# The fp32 model's own greedy replies to these, teacher-forced, give a second agreement
# measure: how often a variant would pick the same next token in the replies it would write.
REPLY_PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a bicycle chain does.",
)
REPLY_TOKENS = 96
DECODE_TOKENS = 64
# Variants timed without the native decode step (engine.quant.decode_step), to show what it adds;
# they share the model, load time and agreement of the variant named before the space.
EAGER = {"fp16-cpu eager": "fp16-cpu", "q8-cpu eager": "q8-cpu"}
PROMPT_TOKENS = 200
# (label, quantization mode, dtype of everything not quantized)
VARIANTS: tuple[tuple[str, str, torch.dtype], ...] = (
    ("fp32", "none", torch.float32),
    ("bf16", "none", torch.bfloat16),
    ("fp16-cpu", "fp16-cpu", torch.float32),
    ("fp16-cpu eager", "fp16-cpu", torch.float32),
    ("q8-cpu", "q8-cpu", torch.float32),
    ("q8-cpu eager", "q8-cpu", torch.float32),
    ("int8-cpu", "int8-cpu", torch.float32),
    ("int8-cpu/bf16", "int8-cpu", torch.bfloat16),
    ("int4-cpu", "int4-cpu", torch.float32),
    ("int4-cpu/bf16", "int4-cpu", torch.bfloat16),
    ("bnb-int8", "bnb-int8", torch.bfloat16),
    ("bnb-nf4", "bnb-nf4", torch.bfloat16),
    ("bnb-fp4", "bnb-fp4", torch.bfloat16),
)


@torch.inference_mode()
def next_tokens(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Teacher-forced argmax at every position of ``ids`` [1, n]."""
    return model(input_ids=ids.to(model.device)).logits[0].argmax(-1).cpu()


def agreement(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Share of positions where two argmax sequences agree."""
    return float((reference == other).float().mean())


def native_step(model: Any) -> bool:
    """Whether ``engine.model.kv.forward`` runs this model's decode steps in the native step."""
    from engine.model.kv import KVState, fast_forward, forward

    fast = fast_forward(model)
    if fast is None or fast.native is None:
        return False
    state = KVState()
    forward(model, state, [0, 1])
    return fast.native.rows(torch.tensor([[2]]), state.cache, False) is not None


@torch.inference_mode()
def time_generation(
    model: Any, prompt: torch.Tensor, new_tokens: int = DECODE_TOKENS, native: bool = True
) -> tuple[float, float]:
    """(TTFT seconds, decode tokens/s): prefill ``prompt`` then ``new_tokens`` greedy steps.

    Through ``engine.model.kv.forward``, as the app runs: its KV cache and, for Llama-family
    models, its lean forward (``engine.model.fastpath``), which calls the quantized layers as they
    are, and for fp16-cpu and q8-cpu the native decode step (``engine.quant.decode_step``) unless
    ``native`` is False.
    """
    from engine.model.kv import fast_forward

    fast = fast_forward(model)
    keep = fast.native if fast is not None else None
    if fast is not None and not native:
        fast.native = None
    try:
        return _time_generation(model, prompt, new_tokens)
    finally:
        if fast is not None:
            fast.native = keep


def _time_generation(model: Any, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    from engine.model.kv import KVState, forward

    state = KVState()
    start = time.perf_counter()
    token = int(forward(model, state, prompt[0].tolist())[-1].argmax())  # int(): the token is on the host
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        token = int(forward(model, state, [token], decode=True)[-1].argmax())
    return ttft, (new_tokens - 1) / (time.perf_counter() - start)


def long_prompt(tokenizer: Any, tokens: int = PROMPT_TOKENS) -> torch.Tensor:
    """A chat prompt of about ``tokens`` tokens (a passage and a question)."""
    words = AGREEMENT_TEXT.split()
    for n in range(20, len(words)):
        messages = [{"role": "user", "content": " ".join(words[:n]) + "\n\nSummarise the passage above."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        if len(ids) >= tokens:
            return torch.tensor([ids])
    raise ValueError("the benchmark text is too short for the prompt")


def load_variant(location: str, mode: str, dtype: torch.dtype) -> tuple[Any, float, float | None]:
    """(model, first load seconds, cached load seconds; None for mode none, which has no cache)."""
    from transformers import AutoModelForCausalLM

    from engine import quant

    if mode == "none":
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype).eval()
        return model, time.perf_counter() - start, None
    first = quant.load_quantized_model(location, mode, dtype, torch.device("cpu"))
    if first.cached:
        raise RuntimeError(f"{first.folder} existed before the benchmark; the first load was not measured")
    first_s = first.seconds
    del first
    again = quant.load_quantized_model(location, mode, dtype, torch.device("cpu"))
    if not again.cached:
        raise RuntimeError(f"the second {mode} load did not come from the cache {again.folder}")
    return again.model, first_s, again.seconds


def measure(runs: int = 3) -> list[dict[str, Any]]:
    """Benchmark every variant available here; a fresh data folder makes the first loads real."""
    from engine.bench.common import fresh_data_dir

    with fresh_data_dir():
        return _run(runs)


def _run(runs: int) -> list[dict[str, Any]]:
    from engine import quant
    from engine.api import ModelSpec
    from engine.model.loader import load_model
    from engine.model.packed import pack_linears
    from engine.model.source import wait_written
    from engine.runtime.memory import tune_malloc

    tune_malloc()  # as the engine does at start
    loaded = load_model(ModelSpec(dtype="float32", device="cpu"))  # converts the GGUF into this data folder
    location, tokenizer = loaded.source, loaded.tokenizer
    wait_written(location)  # a first load's converted copy is written behind it; this reads the copy
    text = torch.tensor([tokenizer(AGREEMENT_TEXT)["input_ids"]])
    with torch.inference_mode():
        top2 = loaded.model(input_ids=text).logits[0].float().topk(2, dim=-1).values
    near_ties = int(((top2[:, 0] - top2[:, 1]) < 0.1).sum())
    replies = fp32_replies(loaded.model, tokenizer)
    del loaded
    prompt = long_prompt(tokenizer)
    usable = quant.availability(torch.device("cpu"))
    rows: dict[str, dict[str, Any]] = {}
    models: dict[str, Any] = {}
    reference = None
    for label, mode, dtype in VARIANTS:
        row: dict[str, Any] = {"variant": label, "mode": mode, "dtype": str(dtype).removeprefix("torch.")}
        rows[label] = row
        if usable[mode] is not None:
            row["unavailable"] = usable[mode]
            continue
        if label in EAGER:
            if EAGER[label] in models:
                shared = rows[EAGER[label]]
                row.update({k: shared[k] for k in ("load_first_s", "load_cached_s", "weights_mb", "agreement")})
                row.update(reply_agreement=shared["reply_agreement"], native=False, ttft=[], tps=[])
                models[label] = models[EAGER[label]]
            continue
        model, first, cached = load_variant(location, mode, dtype)
        row["load_first_s"], row["load_cached_s"] = first, cached
        row["weights_mb"] = quant.weight_bytes(model) / 1e6
        tokens = next_tokens(model, text)
        reference = tokens if reference is None else reference
        row["agreement"] = agreement(reference, tokens)
        row["reply_agreement"] = reply_agreement(model, replies)
        if mode == "none" and dtype == torch.float32:
            pack_linears(model)  # timed as the app runs float32 (agreement above: transformers' own layers)
        row["ttft"], row["tps"] = [], []
        row["native"] = native_step(model)
        models[label] = model
    for label, model in models.items():  # warm-up: first calls allocate and pick kernels
        time_generation(model, prompt, 4, native=rows[label]["native"])
    for _ in range(runs):
        for label, model in models.items():
            ttft, tps = time_generation(model, prompt, native=rows[label]["native"])
            rows[label]["ttft"].append(ttft)
            rows[label]["tps"].append(tps)
    out = []
    for row in rows.values():
        if "ttft" in row:
            row["ttft_ms"] = 1000 * median(row.pop("ttft"))
            tps = row.pop("tps")
            row["decode_tok_s"], row["best_tok_s"] = median(tps), max(tps)
            row["prompt_tokens"] = prompt.shape[1]
            row["agreement_tokens"] = text.shape[1]
            row["fp32_near_ties"] = near_ties  # positions whose fp32 top-2 logits differ by < 0.1
        out.append(row)
    return out


def fp32_replies(model: Any, tokenizer: Any) -> list[tuple[torch.Tensor, int]]:
    """(prompt + greedy reply ids, prompt length) for each of REPLY_PROMPTS, from the fp32 model."""
    out = []
    for text in REPLY_PROMPTS:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = torch.tensor([tokenizer(rendered, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            full = model.generate(ids, max_new_tokens=REPLY_TOKENS, do_sample=False)
        out.append((full, ids.shape[1]))
    return out


@torch.inference_mode()
def reply_agreement(model: Any, replies: list[tuple[torch.Tensor, int]]) -> float:
    """Share of reply positions where ``model`` predicts the fp32 reply's next token."""
    same = total = 0
    for full, start in replies:
        predicted = next_tokens(model, full)[start - 1 : -1]
        target = full[0, start:]
        same += int((predicted == target).sum())
        total += target.numel()
    return same / total if total else float("nan")


def verdict(rows: list[dict[str, Any]]) -> str:
    """Does the fastest mode with agreement >= 97 % decode at least 2x faster than bf16?"""
    bf16 = next((r for r in rows if r["variant"] == "bf16" and "decode_tok_s" in r), None)
    timed = [r for r in rows if r["mode"] != "none" and "decode_tok_s" in r]
    if bf16 is None or not timed:
        return "Target: nothing to compare (bf16 or every quantized variant is missing)."
    good = [r for r in timed if r["agreement"] >= 0.97]
    fastest = max(good or timed, key=lambda r: r["decode_tok_s"])
    ratio = fastest["decode_tok_s"] / bf16["decode_tok_s"]
    about = (
        f"{fastest['variant']} at {fastest['decode_tok_s']:.1f} tok/s = {ratio:.2f}x bf16 "
        f"({bf16['decode_tok_s']:.1f} tok/s), agreement {100 * fastest['agreement']:.1f} %"
    )
    if not good:
        return (
            f"Target (>= 2x bf16 decode at >= 97 % agreement): NOT met: no quantized variant reached 97 % "
            f"(bf16 itself: {100 * bf16['agreement']:.1f} %). Fastest variant: {about}."
        )
    return f"Target (>= 2x bf16 decode at >= 97 % agreement): {'met' if ratio >= 2 else 'NOT met'}. Fastest: {about}."


def reply_verdict(rows: list[dict[str, Any]]) -> str:
    """The same target, judged by agreement on the fp32 model's own replies."""
    keyed = [{**r, "agreement": r["reply_agreement"]} for r in rows if "reply_agreement" in r]
    return "By reply agreement: " + verdict(keyed).removeprefix("Target (>= 2x bf16 decode at >= 97 % agreement): ")


COLUMNS = (
    ("variant", "variant", "{}"),
    ("load_first_s", "load first s", "{:.2f}"),
    ("load_cached_s", "load cached s", "{:.2f}"),
    ("weights_mb", "weights MB", "{:.0f}"),
    ("ttft_ms", "TTFT ms", "{:.0f}"),
    ("decode_tok_s", "decode tok/s", "{:.1f}"),
    ("best_tok_s", "best run tok/s", "{:.1f}"),
    ("agreement", "agreement", "{:.3f}"),
    ("reply_agreement", "reply agreement", "{:.3f}"),
    ("native", "native step", "{}"),
)


def table(rows: list[dict[str, Any]]) -> str:
    head = [title for _, title, _ in COLUMNS]
    body = []
    for r in rows:
        if "unavailable" in r:
            body.append([r["variant"], f"unavailable: {r['unavailable']}"] + [""] * (len(COLUMNS) - 2))
            continue
        body.append([fmt.format(r[key]) if r.get(key) is not None else "-" for key, _, fmt in COLUMNS])
    return markdown_table(head, body)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``brisk bench quant``."""
    rows = measure(args.runs)
    print(f"\n## Quantization on the bundled model (CPU, median of {args.runs} runs)\n")
    print(table(rows))
    print(verdict(rows))
    print(reply_verdict(rows))
    return {"rows": rows, "verdict": verdict(rows), "reply_verdict": reply_verdict(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=None, help="where to write the JSON (bench/results/quant.json)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.doctor import report

    rows = measure(args.runs)
    threads = torch.get_num_threads()
    print(f"\n## Quantization on the bundled model (CPU, {threads} threads, median of {args.runs} runs)\n")
    print(table(rows))
    timed = next((r for r in rows if "fp32_near_ties" in r), None)
    if timed:
        print(
            f"\nAgreement: teacher-forced argmax vs fp32 over {timed['agreement_tokens']} tokens; at "
            f"{timed['fp32_near_ties']} of them fp32's top two logits differ by < 0.1, so any rounding can flip them."
        )
    print(verdict(rows))
    print(reply_verdict(rows))
    data = {
        "scenario": "quant",
        "machine": report(),
        "runs": args.runs,
        "results": rows,
        "verdict": verdict(rows),
        "reply_verdict": reply_verdict(rows),
    }
    print(f"\nwrote {save('quant', data, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
