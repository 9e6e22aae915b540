"""A tiny randomly initialised Llama with a byte-level tokenizer and a ChatML template.

Built in the test session, saved as a normal Hugging Face folder, so tests go
through the same loading code as a user's model.  Fast (about 1 ms a step)
and exact.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.bench.tiny import CHATML, SPECIAL, make_tokenizer

__all__ = ["CHATML", "SPECIAL", "load_fp16", "load_q8", "make_tiny_model", "make_tokenizer"]


def make_tiny_model(path: Path, seed: int = 0, layers: int = 2, hidden: int = 64, four_bit: bool = False) -> Path:
    """``four_bit``: every weight matrix snapped to 16 levels a group of 32 inputs, each group's step and
    minimum in float16 (as a Q4_1 GGUF's), so q8-cpu keeps its layers in 4 bits, their steps in float16."""
    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy ties are impossible in practice
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else None
        if four_bit:
            for p in model.parameters():
                if p.dim() == 2:
                    groups = p.reshape(p.shape[0], -1, 32)
                    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
                    step = ((high - low) / 15).clamp(min=1e-4).half().float()  # a constant group stays itself
                    low = low.half().float()
                    levels = torch.round((groups - low) / step).clamp(0, 15)
                    p.copy_((levels * step + low).reshape(p.shape))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_fp16(path: Path | str) -> Any:
    """The model at ``path`` in float32, with its linears made fp16-cpu layers (fused), as the app loads it."""
    from transformers import AutoModelForCausalLM

    from engine import quant

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return quant.quantize_cpu(model, "fp16-cpu")


def load_q8(path: Path | str) -> Any:
    """The model at ``path`` in float32, with its linears made q8-cpu layers, as the app loads it."""
    from transformers import AutoModelForCausalLM

    from engine import quant

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return quant.quantize_cpu(model, "q8-cpu")


def assert_same_rows(a: torch.Tensor, b: torch.Tensor) -> None:
    """Logits (or keys) of the same rows computed two ways (together and alone, batched and not): equal up to
    float32 rounding and with the same greedy choices.  Bit for bit where the kernels sum in fixed lanes
    (the native step's own products); fbgemm's fp16 GEMM on an AVX2 CPU sums one row and several rows in
    different orders (measured: last-bit differences on an AMD EPYC), so no test asks for bits."""
    assert a.shape == b.shape
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-4), float((a - b).abs().max())
    if a.dim() >= 1 and a.shape[-1] > 1:
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def greedy_native_and_eager(model: Any, steps: int = 12) -> tuple[list[int], list[int]]:
    """Greedy tokens after a 20-token prompt, ``steps`` of them, through the native step and through the eager
    fast path (the native step set aside for those calls), each decoding its own continuation."""
    from engine.model import kv
    from engine.model.kv import KVState

    fast = kv.fast_forward(model)
    assert fast is not None and fast.native is not None
    ours, theirs = KVState(), KVState()
    prompt = list(range(5, 25))
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    mine, reference, token_ours, token_theirs = [], [], 7, 7
    for _ in range(steps):
        token_ours = int(kv.forward(model, ours, [token_ours], decode=True)[-1].argmax())
        keep, fast.native = fast.native, None
        try:
            token_theirs = int(kv.forward(model, theirs, [token_theirs], decode=True)[-1].argmax())
        finally:
            fast.native = keep
        mine.append(token_ours)
        reference.append(token_theirs)
    return mine, reference


def assert_rows_at_once_equal_alone(
    model: Any, same: Callable[[torch.Tensor, torch.Tensor], None] | None = None
) -> Any:
    """Five decode tokens in one call (a speculative step's verification) give the logits, keys and values that
    five one-token calls give: bit for bit by default (a step that sums in fixed lanes: q8-cpu, a GGUF), else as
    ``same`` asserts.  Returns the two states (together, alone) for further steps."""
    from engine.model import kv
    from engine.model.kv import KVState

    def bits(a: torch.Tensor, b: torch.Tensor) -> None:
        assert a.shape == b.shape and torch.equal(a, b)

    same = same or bits
    together, alone = KVState(), KVState()
    prompt, tokens = list(range(5, 30)), [7, 40, 3, 99, 12]
    kv.forward(model, together, prompt)
    kv.forward(model, alone, prompt)
    rows = kv.forward(model, together, tokens, all_logits=True, decode=True)
    same(rows, torch.stack([kv.forward(model, alone, [t], decode=True)[-1] for t in tokens]))
    for a, b in zip(together.cache.layers, alone.cache.layers, strict=True):
        same(a.keys, b.keys)
        same(a.values, b.values)
    return together, alone
