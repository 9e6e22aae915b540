"""Where a q8-cpu decode step's time goes, for two or more versions of the native step, interleaved.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/python -m engine.bench.step_phases A.cpp B.cpp
[--rounds 10] [--tokens 96]``, each file a version of ``engine/quant/native_step.cpp`` (``HEAD`` stands for
the committed one; ``git show REV:engine/quant/native_step.cpp > old.cpp`` gives an older one).  Each is
copied with a timer around every phase of ``Stepper::forward_batch`` (norms, q/k/v, rotary and KV writes,
attention, o and residual, gate/up, SiLU, down and residual, the head), built with the flags the app
uses, and the bundled model answers the same open prompt through each in turn (the order alternating
each round, speculation and the answer cache off).  Prints the median tok/s and the median ms a step of
each phase per version, whether every version gave the same words, and writes
``bench/results/step_phases.json``.

A version whose q8 parts only take float32 steps (before 7fd94f9) is given float32 copies of float16
ones, so it reads the bytes it always read.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from engine.bench.common import markdown_table, median, save, spread

ROOT = Path(__file__).resolve().parents[2]

PHASES = [
    "embed",
    "norms",
    "qkv",
    "rope+kv",
    "attention",
    "o+residual",
    "gate/up",
    "silu",
    "down+residual",
    "final norm",
    "head",
    "rest",
]
PROMPTS = [
    "Write a short story about a fox.",
    "Explain photosynthesis to a child.",
    "Give me tips for a job interview.",
    "Describe a busy market in the morning.",
    "What are the causes of inflation?",
    "Write a poem about rain.",
]
# (text, replacement): a timer between phases (TICK(k) adds the time since the last tick to phase k)
TIMERS = [
    (
        "namespace {\n\nconstexpr int LANES = 16;",
        "#include <chrono>\nnamespace {\ndouble T_[16];\ninline double now_() {\n"
        "  return std::chrono::duration<double, std::milli>(\n"
        "      std::chrono::steady_clock::now().time_since_epoch()).count();\n}\n"
        "#define TICK(k) do { double t__ = now_(); T_[k] += t__ - t0__; t0__ = t__; } while (0)\n\n"
        "constexpr int LANES = 16;",
    ),
    (
        "    at::Tensor h = at::empty({n, width}, embedding.options());",
        "    double t0__ = now_();\n    at::Tensor h = at::empty({n, width}, embedding.options());",
    ),
    (
        "    std::vector<int64_t> caps(seqs), bstrides(seqs), begins(seqs);\n",
        "    std::vector<int64_t> caps(seqs), bstrides(seqs), begins(seqs);\n    TICK(0);\n",
    ),
    ("      at::Tensor qkv = linear(x, 4 * i);", "      TICK(1);\n      at::Tensor qkv = linear(x, 4 * i);"),
    ("      TORCH_CHECK(qkv.is_contiguous()", "      TICK(2);\n      TORCH_CHECK(qkv.is_contiguous()"),
    (
        "      // One head's attention over L positions",
        "      TICK(3);\n      // One head's attention over L positions",
    ),
    (
        "      residual(hp, linear(attended, 4 * i + 1)",
        "      TICK(4);\n      residual(hp, linear(attended, 4 * i + 1)",
    ),
    ("      rms_rows(hp, norms_[2 * i + 1]", "      TICK(5);\n      rms_rows(hp, norms_[2 * i + 1]"),
    (
        "      at::Tensor gate_up = linear(x, 4 * i + 2);",
        "      TICK(1);\n      at::Tensor gate_up = linear(x, 4 * i + 2);",
    ),
    ("      TORCH_CHECK(gate_up.is_contiguous()", "      TICK(6);\n      TORCH_CHECK(gate_up.is_contiguous()"),
    ("      residual(hp, linear(mid, 4 * i + 3)", "      TICK(7);\n      residual(hp, linear(mid, 4 * i + 3)"),
    (
        "    }\n    const int64_t rows = static_cast<int64_t>(kept.size());",
        "      TICK(8);\n    }\n    const int64_t rows = static_cast<int64_t>(kept.size());",
    ),
    (
        "    at::Tensor logits = linear(y, projections() - 1);",
        "    TICK(9);\n    at::Tensor logits = linear(y, projections() - 1);\n    TICK(10);",
    ),
    ("    return logits;\n  }\n\n private:", "    TICK(11);\n    T_[12] += 1;\n    return logits;\n  }\n\n private:"),
    (
        '  m.def("q8_stepper"',
        '  m.def("timings", []() {\n    std::vector<double> v(T_, T_ + 16);\n    std::fill(T_, T_ + 16, 0.0);\n'
        '    return v;\n  });\n  m.def("q8_stepper"',
    ),
]
# older versions: float32 steps only; give them float32 copies
WIDEN = [
    (
        "t->scalar_type() == at::kFloat && t->device().is_cpu() &&\n                      t->size(0) == w.size(0)",
        "t->device().is_cpu() &&\n                      t->size(0) == w.size(0)",
    ),
    (
        "    parts.push_back({w, d, m, b, in, bits});",
        "    parts.push_back({w, d.to(at::kFloat).contiguous(), m.to(at::kFloat).contiguous(), b, in, bits});",
    ),
    (
        "at::Tensor out = at::empty({starts.back(), width}, parts[0].d.options());",
        "at::Tensor out = at::empty({starts.back(), width}, parts[0].w.options().dtype(at::kFloat));",
    ),
]


def timed_source(text: str) -> str:
    """``text`` with the timers in (and float32 copies of float16 steps where it takes float32 only)."""
    if "bool half;" not in text:
        for old, new in WIDEN:
            if text.count(old) == 1:
                text = text.replace(old, new)
    for old, new in TIMERS:
        if text.count(old) != 1:
            raise SystemExit(f"this version of the step has no unique place for a timer: {old[:60]!r}")
        text = text.replace(old, new)
    return text


def build(name: str, text: str, folder: Path) -> object:
    from torch.utils.cpp_extension import load

    from engine.quant.native import FLAGS

    source = folder / f"{name}.cpp"
    source.write_text(timed_source(text))
    return load(name=name, sources=[str(source)], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="native_step.cpp files to compare (HEAD: the committed one)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    texts = {}
    for i, version in enumerate(args.versions):
        if version == "HEAD":
            text = subprocess.run(
                ["git", "show", "HEAD:engine/quant/native_step.cpp"],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        else:
            text = Path(version).read_text()
        texts[f"{i}:{Path(version).stem}"] = text
    with tempfile.TemporaryDirectory() as tmp:
        modules = {label: build(f"brisk_phases_{i}", text, Path(tmp)) for i, (label, text) in enumerate(texts.items())}
    import engine.quant.decode_step as decode_step
    import engine.quant.native as native
    from engine.api import AnswerCacheSettings, ModelSpec, Sampling
    from engine.client import Client, local_backend

    current: list[object] = [None]
    native.module = lambda wait=False: current[0]  # type: ignore[assignment]
    client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
    client.load(ModelSpec(source="", dtype="auto", quant="q8-cpu"))
    results: dict[str, dict[str, list]] = {label: {"tok_s": [], "phases": []} for label in modules}
    same = True
    for r in range(args.rounds):
        order = list(modules) if r % 2 == 0 else list(reversed(list(modules)))
        words = set()
        for label in order:
            current[0] = modules[label]
            for obj in gc.get_objects():  # the step is made again from this version
                if isinstance(obj, decode_step.NativeDecode):
                    obj._native = None
            modules[label].timings()  # type: ignore[attr-defined]
            done = client.ask(
                [{"role": "user", "content": PROMPTS[r % len(PROMPTS)]}],
                Sampling(max_tokens=args.tokens),
                conversation_id=uuid.uuid4().hex,
                answer_cache=False,
                speculative="off",
            )
            t = modules[label].timings()  # type: ignore[attr-defined]
            steps = t[12] or 1
            results[label]["tok_s"].append(done.metrics.tokens_per_s)
            results[label]["phases"].append([v / steps for v in t[:12]])
            words.add(done.text)
        same = same and len(words) == 1
    client.close()
    summary = {}
    print(f"\n{args.rounds} rounds, {args.tokens} tokens, q8-cpu, speculation off; medians, ms a step\n")
    body = [[phase, *(f"{median(p[j] for p in results[label]['phases']):.2f}" for label in modules)]
            for j, phase in enumerate(PHASES)]  # fmt: skip
    for label in modules:
        totals = [sum(p) for p in results[label]["phases"]]
        tok = results[label]["tok_s"]
        summary[label] = {
            "step_ms": median(totals),
            "tok_s": median(tok),
            "tok_s_range": [min(tok), max(tok)],
            "tok_s_runs": tok,
            "phases_ms": results[label]["phases"],
        }
    body.append(["whole step", *(f"{summary[k]['step_ms']:.2f}" for k in modules)])
    body.append(["tok/s", *(spread(results[k]["tok_s"], "{:.1f}") for k in modules)])
    print(markdown_table(["phase", *modules], body))
    print(f"\nthe same words from every version in every round: {same}")
    data = {"rounds": args.rounds, "tokens": args.tokens, "same_words": same, "versions": summary}
    print(f"wrote {save('step_phases', data)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
