"""The lean forward (engine.model.fastpath) computes exactly what transformers' forward computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.model import kv
from engine.model.fastpath import FastForward
from engine.model.kv import KVState


def _compare(model: torch.nn.Module, ids: list[int], split: int) -> None:
    """Prefill, a chunk on top of the cache, then single steps: logits bit for bit, cache alike."""
    fast = FastForward.for_model(model)
    assert fast is not None
    ours, theirs = KVState(), KVState()
    x = torch.tensor([ids])
    with torch.inference_mode():
        pieces = [(0, split, 0), (split, split + 5, 0)] + [(j, j + 1, 1) for j in range(split + 5, len(ids))]
        for begin, end, keep in pieces:
            a = fast(x[:, begin:end], ours.cache, keep)
            b = model(input_ids=x[:, begin:end], cache=theirs.cache, use_cache=True, logits_to_keep=keep).logits
            assert torch.equal(a, b), f"logits differ at tokens {begin}:{end} (max {float((a - b).abs().max())})"
        assert ours.cache.get_seq_length() == theirs.cache.get_seq_length() == len(ids)
        for la, lb in zip(ours.cache.layers, theirs.cache.layers, strict=True):
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_fast_forward_equals_transformers_on_tiny_llama(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    _compare(model, list(range(3, 60)), split=40)


def test_fast_forward_equals_transformers_on_qwen2_with_bias() -> None:
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    _compare(model, list(range(1, 40)), split=20)


def test_fast_forward_declines_unknown_layouts() -> None:
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, hidden_act="gelu")  # fmt: skip
    assert FastForward.for_model(LlamaForCausalLM(config)) is None  # another activation
    config.hidden_act = "silu"
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    assert FastForward.for_model(model) is None
    assert FastForward.for_model(torch.nn.Linear(2, 2)) is None


def test_kv_forward_uses_the_fast_path_and_falls_back(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    assert kv.fast_forward(model) is not None
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    kv.forward(model, KVState(), [5, 6, 7])
    assert calls == []  # the model's own forward did not run
    model.__dict__["_brisk_fast"] = None
    kv.forward(model, KVState(), [5, 6, 7])
    assert calls == [1]


@pytest.mark.bundled
def test_fast_forward_equals_transformers_on_bundled_model(bundled_engine) -> None:  # noqa: ANN001
    loaded = bundled_engine.engine.loaded
    ids = loaded.tokenizer("The history of the bicycle is a story of many small improvements. " * 6)["input_ids"]
    _compare(loaded.model, ids[:80], split=60)
