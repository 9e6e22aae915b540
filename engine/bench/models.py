"""``brisk bench models``: each architecture on Brisk's paths against transformers' forward, and the library's scan.

For each architecture the fast path takes (Llama, Qwen2 with q/k/v biases, Qwen3,
Mistral, Phi-3, Gemma 2, Gemma 3 text) a small random model of that family
(``SHAPE``: 4 layers, hidden 256, seeded, its weights sharpened so greedy
choices are not ties) is saved as a Hugging Face folder with a byte-level
tokenizer and loaded as a user's model would be:

* load time through the engine in fp16-cpu on an empty data folder (first: the
  quantized copy is made and saved) and again (later: read from the cache);
* decode tokens/s of 64 greedy tokens after a 48-token prompt: transformers'
  own forward on its own cache (float32), Brisk's lean forward (float32) and
  Brisk in fp16-cpu (the native step where it takes the layout), interleaved
  round by round, median and range over ``--runs``;
* agreement: teacher-forced, each path's greedy choice at every position of
  transformers' own continuation (float32 paths must agree at every position;
  fp16-cpu rounds weights, so a near-tie may flip).

The library row times ``engine.library.scan.scan`` over 200 model folders of
a user's (100 GGUF files, 100 Hugging Face folders with safetensors, config
and tokenizer), first (every header read) and again (remembered).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.bench.common import fresh_data_dir, spread, table

SHAPE: dict[str, Any] = {"vocab_size": 259, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8}
SHAPE |= {"max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
LAYERS = 4
PROMPT, NEW = 48, 64
LIBRARY_SIZE = 200


def _configs() -> dict[str, Callable[[], Any]]:
    import transformers as t

    return {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2)),
        "qwen2 (q/k/v bias)": lambda: t.Qwen2ForCausalLM(
            t.Qwen2Config(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2)
        ),
        "qwen3 (q/k norms)": lambda: t.Qwen3ForCausalLM(
            t.Qwen3Config(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2, head_dim=32)
        ),
        "mistral (window 32)": lambda: t.MistralForCausalLM(
            t.MistralConfig(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2, sliding_window=32)
        ),
        "phi3 (fused)": lambda: t.Phi3ForCausalLM(
            t.Phi3Config(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2)
        ),
        "gemma2": lambda: t.Gemma2ForCausalLM(
            t.Gemma2Config(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2, head_dim=32, sliding_window=32)
        ),
        "gemma3 text": lambda: t.Gemma3ForCausalLM(
            t.Gemma3TextConfig(**SHAPE, num_hidden_layers=LAYERS, num_key_value_heads=2, head_dim=32, sliding_window=32)
        ),
    }


def build(name: str, folder: Path) -> Any:
    """The random model ``name`` (seed 0, sharpened), saved in ``folder`` with the byte-level tokenizer."""
    import torch

    from engine.bench.tiny import make_tokenizer, sharpen

    torch.manual_seed(0)
    model = sharpen(_configs()[name]().eval())
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return model


def _reference(model: Any, prompt: list[int]) -> tuple[list[int], float]:
    """transformers' greedy continuation (its forward, its cache) and its decode tokens/s."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1).logits
        out = [int(logits[0, -1].argmax())]
        began = time.perf_counter()
        for _ in range(NEW - 1):
            x = torch.tensor([[out[-1]]])
            logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits
            out.append(int(logits[0, -1].argmax()))
        seconds = time.perf_counter() - began
    return out, (NEW - 1) / seconds


def _ours(model: Any, prompt: list[int], reference: list[int]) -> tuple[float, float]:
    """Brisk's path for ``model`` (engine.model.kv.forward): decode tokens/s of its own greedy continuation, and
    teacher-forced agreement with ``reference``."""
    import torch

    from engine.model import kv

    with torch.inference_mode():
        state = kv.KVState()
        token = int(kv.forward(model, state, prompt)[-1].argmax())
        began = time.perf_counter()
        for _ in range(NEW - 1):
            token = int(kv.forward(model, state, [token], decode=True)[-1].argmax())
        speed = (NEW - 1) / (time.perf_counter() - began)
        forced = kv.KVState()
        if not reference:
            return speed, 0.0
        hits = int(int(kv.forward(model, forced, prompt)[-1].argmax()) == reference[0])
        for i in range(1, NEW):
            hits += int(int(kv.forward(model, forced, [reference[i - 1]], decode=True)[-1].argmax()) == reference[i])
    return speed, hits / NEW


def _load_times(folder: Path) -> tuple[float, float, str]:
    """(first, later) load seconds of ``folder`` in fp16-cpu on an empty data folder, and the fast path said."""
    from engine.api import AnswerCacheSettings, ModelSpec
    from engine.client import Client, local_backend

    times = []
    said = ""
    with fresh_data_dir():
        for _ in range(2):
            client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
            try:
                began = time.perf_counter()
                loaded = client.load(ModelSpec(source=str(folder), quant="fp16-cpu"))
                times.append(time.perf_counter() - began)
                said = loaded.info.fast_path
            finally:
                client.close()
    return times[0], times[1], said


def measure_architectures(runs: int) -> list[dict[str, Any]]:
    import copy

    import torch

    from engine import quant
    from engine.model import kv
    from engine.model.support import support
    from engine.quant import native

    native.module(wait=True)
    rows = []
    prompt = [(7 * i + 3) % (SHAPE["vocab_size"] - 3) + 3 for i in range(PROMPT)]
    for name in _configs():
        with tempfile.TemporaryDirectory(prefix="brisk-bench-models-") as tmp:
            model = build(name, Path(tmp))
            first, later, said = _load_times(Path(tmp))
        eager = copy.deepcopy(model)
        fp16 = quant.quantize_cpu(copy.deepcopy(model), "fp16-cpu")
        speeds: dict[str, list[float]] = {"transformers": [], "lean": [], "fp16": []}
        agree: dict[str, float] = {}
        _reference(model, prompt)  # a round not counted: first calls allocate and warm caches
        for candidate in (eager, fp16):
            _ours(candidate, prompt, [])
        for _ in range(runs):  # interleaved, round by round
            reference, speed = _reference(model, prompt)
            speeds["transformers"].append(speed)
            for key, candidate in (("lean", eager), ("fp16", fp16)):
                tok_s, agreement = _ours(candidate, prompt, reference)
                speeds[key].append(tok_s)
                agree[key] = agreement
        verdict = support(model.config.to_dict())
        fast = kv.fast_forward(fp16)
        rows.append(
            {
                "architecture": name,
                "fast path": "yes" if verdict.fast_path else "no",
                "native step": "yes" if fast is not None and fast.native is not None and verdict.native_step else "no",
                "load first s": round(first, 2),
                "load later s": round(later, 2),
                "transformers tok/s": spread(speeds["transformers"]),
                "lean fp32 tok/s": spread(speeds["lean"]),
                "fp16-cpu tok/s": spread(speeds["fp16"]),
                "agree fp32": f"{agree['lean']:.0%}",
                "agree fp16": f"{agree['fp16']:.0%}",
                "said": said,
                "threads": torch.get_num_threads(),
            }
        )
        print(f"  {name}: done", flush=True)
    return rows


def _user_library(root: Path, tiny: Path) -> None:
    """``LIBRARY_SIZE`` model folders under ``root``: half GGUF files, half Hugging Face folders (hard links)."""
    import os
    import shutil

    from engine.bench.tiny import write_gguf

    for i in range(LIBRARY_SIZE // 2):
        tokens = [f"t{i}-{j}" for j in range(2000)]
        write_gguf(root / f"publisher-{i % 10}" / f"model-{i}-GGUF" / f"model-{i}-Q4_K_M.gguf", "qwen2", tokens)
        folder = root / f"org-{i % 10}" / f"model-{i}"
        folder.mkdir(parents=True)
        for file in tiny.iterdir():
            try:
                os.link(file, folder / file.name)
            except OSError:
                shutil.copyfile(file, folder / file.name)


def measure_scan() -> dict[str, Any]:
    import os

    from engine.library.scan import scan

    with tempfile.TemporaryDirectory(prefix="brisk-bench-library-") as tmp, fresh_data_dir():
        root = Path(tmp)
        build("llama", root / "tiny")
        _user_library(root / "models", root / "tiny")
        saved = {k: os.environ.get(k) for k in ("HOME", "HF_HUB_CACHE")}
        os.environ["HOME"] = str(root / "home")
        os.environ["HF_HUB_CACHE"] = str(root / "home" / "hub")
        try:
            first = scan([str(root / "models")])
            again = scan([str(root / "models")])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return {
        "models": len(first.entries),
        "first scan ms": round(first.seconds * 1000, 1),
        "headers read": first.described,
        "again ms": round(again.seconds * 1000, 1),
        "headers read again": again.described,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``brisk bench models``."""
    from engine.model.support import Support

    runs = max(1, int(getattr(args, "runs", 3) or 3))
    rows = measure_architectures(runs)
    shown = [{k: v for k, v in row.items() if k not in ("said", "threads")} for row in rows]
    print(table(f"Architectures on Brisk's paths (random {LAYERS}-layer models, hidden 256; median of {runs})", shown))
    for row in rows:
        if row["said"] != Support(fast_path=True, native_step=True, reason="").sentence:
            print(f"  {row['architecture']}: {row['said']}")
    scanned = measure_scan()
    print(table(f"The model library's scan of {LIBRARY_SIZE} model folders", [scanned]))
    return {"architectures": rows, "scan": scanned, "runs": runs, "prompt_tokens": PROMPT, "new_tokens": NEW}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench/results/models.json")
    args = parser.parse_args(argv)
    result = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0
