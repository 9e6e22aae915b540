"""The lean forward (engine.model.fastpath) computes what transformers' forward computes, for every layout it takes.

Each architecture is a tiny random model built here (fixed seed, float32).  A prompt, a
chunk on top of the cache and single decode steps run through both; the logits must agree
within 1e-4 and pick the same tokens, and a greedy continuation must be the same.  The
reference is transformers' own forward on its own cache (``DynamicCache(config=...)``,
which keeps only a window's positions for sliding layers), so a window applied wrongly
shows up from the ninth token on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engine.bench.tiny import sharpen
from engine.model import kv
from engine.model.fastpath import FastForward
from engine.model.kv import KVState
from engine.model.support import support

TOLERANCE = 1e-4
COMMON = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
COMMON |= {"max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _qwen3() -> Any:
    return Qwen3ForCausalLM(Qwen3Config(**COMMON, num_hidden_layers=2, num_key_value_heads=2, head_dim=32))


def _mistral() -> Any:  # every layer windowed to the last 8 positions
    return MistralForCausalLM(MistralConfig(**COMMON, num_hidden_layers=2, num_key_value_heads=2, sliding_window=8))


def _mistral_unwindowed() -> Any:
    return MistralForCausalLM(MistralConfig(**COMMON, num_hidden_layers=2, num_key_value_heads=1, sliding_window=None))


def _qwen2_windowed() -> Any:  # layers from the second on windowed (max_window_layers)
    config = Qwen2Config(**COMMON, num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=True,
                         sliding_window=8, max_window_layers=1)  # fmt: skip
    return Qwen2ForCausalLM(config)


def _phi3() -> Any:
    return Phi3ForCausalLM(Phi3Config(**COMMON, num_hidden_layers=2, num_key_value_heads=2))


def _phi3_partial_windowed() -> Any:  # the rotary embedding on half of each head; a window of 8
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = Phi3Config(**COMMON, num_hidden_layers=2, num_key_value_heads=4, rope_parameters=rope, sliding_window=8)
    return Phi3ForCausalLM(config)


def _gemma2() -> Any:  # sliding and full layers alternate; soft-capped attention and output
    config = Gemma2Config(**COMMON, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                          query_pre_attn_scalar=24, attn_logit_softcapping=1.5,
                          final_logit_softcapping=8.0)  # fmt: skip
    return Gemma2ForCausalLM(config)


def _gemma3() -> Any:  # two sliding layers (local rotary base), then a full one; q/k norms
    types = ["sliding_attention", "sliding_attention", "full_attention"]
    config = Gemma3TextConfig(**COMMON, num_hidden_layers=3, num_key_value_heads=2, head_dim=16, sliding_window=8,
                              layer_types=types, query_pre_attn_scalar=24)  # fmt: skip
    return Gemma3ForCausalLM(config)


MODELS: dict[str, Callable[[], Any]] = {
    "qwen3": _qwen3,
    "mistral-window-8": _mistral,
    "mistral-no-window": _mistral_unwindowed,
    "qwen2-window-8": _qwen2_windowed,
    "phi3": _phi3,
    "phi3-partial-rotary-window-8": _phi3_partial_windowed,
    "gemma2": _gemma2,
    "gemma3-text": _gemma3,
}


def build(name: str) -> Any:
    """The tiny model ``name`` (seed 0), its weights made sharper than the default initialisation and
    its norms' weights random too, so that no part of it is the identity."""
    torch.manual_seed(0)
    return sharpen(MODELS[name]().eval())


def compare(model: Any, ids: list[int], split: int, branch: bool = False) -> float:
    """Prefill, a chunk of 5 on top of the cache, single steps, then a greedy continuation; the largest
    logit difference from transformers' forward.  ``branch``: everything after the prefill runs on a branch
    of it (``KVState.from_snapshot``: the prefill's positions shared, not copied)."""
    fast = FastForward.for_model(model)
    assert fast is not None
    ours, theirs = KVState(), DynamicCache(config=model.config)
    x = torch.tensor([ids])
    worst = 0.0
    with torch.inference_mode():

        def both(chunk: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal worst
            a = fast(chunk, ours.cache, keep)
            b = model(input_ids=chunk, cache=theirs, use_cache=True, logits_to_keep=keep).logits
            assert a.shape == b.shape
            worst = max(worst, float((a - b).abs().max()))
            torch.testing.assert_close(a, b, rtol=0, atol=TOLERANCE)
            assert torch.equal(a.argmax(-1), b.argmax(-1))
            return a, b

        pieces = [(0, split, 0), (split, split + 5, 0)] + [(j, j + 1, 1) for j in range(split + 5, len(ids))]
        for begin, end, keep in pieces:
            both(x[:, begin:end], keep)
            if branch and begin == 0:
                ours = KVState.from_snapshot(ours.snapshot(split), ids[:split])
        token_ours = token_theirs = ids[-1]
        for _ in range(8):  # each side decodes its own greedy continuation
            a, b = both(torch.tensor([[token_ours]]), 1) if token_ours == token_theirs else (None, None)
            assert a is not None and b is not None, "the greedy continuations parted"
            token_ours, token_theirs = int(a[0, -1].argmax()), int(b[0, -1].argmax())
        assert token_ours == token_theirs
    assert ours.cache.get_seq_length() == len(ids) + 8
    return worst


@pytest.mark.parametrize("name", list(MODELS))
def test_fast_forward_agrees_with_transformers(name: str) -> None:
    model = build(name)
    worst = compare(model, list(range(3, 33)), split=12)  # 30 tokens: longer than a window of 8
    print(f"{name}: largest logit difference {worst:.2e}")


@pytest.mark.parametrize("name", list(MODELS))
def test_a_branch_reading_its_shared_prefix_in_place_agrees_with_transformers(name: str) -> None:
    """A new chat on a shared prefix (a document's KV): its prompt and steps read the prefix where it is;
    layers that cannot (soft-capped attention; a window shorter than the context) join it first."""
    model = build(name)
    compare(model, list(range(3, 33)), split=12, branch=True)


@pytest.mark.parametrize("name", list(MODELS))
def test_support_says_what_the_fast_path_does(name: str) -> None:
    model = build(name)
    said = support(model.config.to_dict())
    assert said.fast_path and FastForward.for_model(model) is not None
    assert said.native_step == (kv.fast_forward(model).native is not None)  # type: ignore[union-attr]
    assert said.native_step or said.reason


def test_the_window_matters_in_these_tests() -> None:
    """Attending to every position instead gives other logits past the window (so the tests above can fail)."""
    model = build("mistral-window-8")
    fast = FastForward.for_model(model)
    assert fast is not None and set(fast.plan.windows) == {8}
    ids = torch.tensor([list(range(3, 33))])
    windowed = fast(ids, KVState().cache, 0)
    fast.plan = dataclasses.replace(fast.plan, windows=(None, None))
    unwindowed = fast(ids, KVState().cache, 0)
    assert torch.equal(windowed[:, :8], unwindowed[:, :8])
    assert float((windowed[:, 8:] - unwindowed[:, 8:]).abs().max()) > 100 * TOLERANCE


def test_kv_forward_runs_gemma_on_the_fast_path() -> None:
    model = build("gemma2")
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    state = KVState()
    kv.forward(model, state, list(range(3, 20)))
    kv.forward(model, state, [5], decode=True)
    assert calls == [] and len(state) == 18  # the model's own forward did not run


def test_layouts_it_does_not_know_decline_with_a_reason() -> None:
    torch.manual_seed(0)
    config = Gemma2Config(**COMMON, num_hidden_layers=1, num_key_value_heads=1, head_dim=16, hidden_activation="gelu")
    model = Gemma2ForCausalLM(config)
    assert FastForward.for_model(model) is None
    said = support(config.to_dict())
    assert not said.fast_path and not said.native_step and "'gelu'" in said.reason
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    qwen = Qwen3ForCausalLM(Qwen3Config(**COMMON, num_hidden_layers=1, num_key_value_heads=2, rope_parameters=rope))
    assert FastForward.for_model(qwen) is None
    assert "dynamic" in support(qwen.config.to_dict()).reason


# Architectures outside the seven families, each close to one of them (norm placement, q/k norms, multipliers,
# sliding layers, NoPE layers, parallel blocks): they run on transformers' own forward over Brisk's KV cache, and
# Brisk's greedy tokens must be transformers' own (the issue-47 report: one such model left them after 11 of 24).
HELD_OUT = ("olmo2", "olmo3", "cohere2", "exaone4", "smollm3", "granite", "starcoder2", "gemma", "arcee", "glm4")
# In-family variants whose fields each path must honour or decline: biases, head sizes, rotary kinds, windows.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama-head-32": ("llama", {"head_dim": 32, "tie_word_embeddings": False}),
    "llama-rope-llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}}),  # fmt: skip
    "llama-rope-yarn": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 16}}),  # fmt: skip
    "qwen3-bias-window": ("qwen3", {"attention_bias": True, "head_dim": 16, "use_sliding_window": True,
                                    "sliding_window": 8, "max_window_layers": 1}),  # fmt: skip
    "gemma3-linear-global": ("gemma3_text", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                                             "rope_parameters": {
                                                 "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                    "rope_theta": 1e6},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
}  # fmt: skip


def _tiny(model_type: str, **extra: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**COMMON, "num_key_value_heads": 2, "num_hidden_layers": 3, **extra})
    if hasattr(config, "sliding_window") and "sliding_window" not in extra:
        config.sliding_window = 8  # so a window applied wrongly shows within the 24 tokens
    return sharpen(AutoModelForCausalLM.from_config(config).eval())


def _greedy_both(model: Any, steps: int = 24) -> tuple[list[int], list[int]]:
    """Greedy tokens after a 17-token prompt: transformers' ``generate`` and Brisk's ``kv.forward`` steps."""
    prompt = list(range(3, 20))
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        state, ours = KVState(), []
        logits = kv.forward(model, state, prompt)
        for _ in range(steps):
            ours.append(int(logits[-1].argmax()))
            logits = kv.forward(model, state, [ours[-1]], decode=True)
    return out[0, len(prompt) :].tolist(), ours


@pytest.mark.parametrize("model_type", HELD_OUT)
def test_architectures_outside_the_families_keep_transformers_greedy_tokens(model_type: str) -> None:
    model = _tiny(model_type)
    said = support(model.config.to_dict())
    assert not said.fast_path and FastForward.for_model(model) is None and "transformers' forward" in said.reason
    theirs, ours = _greedy_both(model)
    assert ours == theirs


@pytest.mark.parametrize("name", list(VARIANTS))
def test_family_variants_keep_transformers_greedy_tokens(name: str) -> None:
    model_type, extra = VARIANTS[name]
    model = _tiny(model_type, **extra)
    assert FastForward.for_model(model) is not None
    theirs, ours = _greedy_both(model)
    assert ours == theirs
