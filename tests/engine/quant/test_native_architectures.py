"""The native decode step for the layouts beyond Llama's: Qwen2 (q/k/v biases), Mistral and Qwen2 with
sliding windows, Qwen3 (per-head q/k norms), Phi-3 (fused projections), Gemma 2 (soft-capping, windows
on every other layer) and Gemma 3 (q/k norms, a rotary base of its own for sliding layers), in fp16-cpu
and q8-cpu.

What it must keep, as for Llama (test_native.py, test_q8.py): each decode row bit for bit what a
one-row call gives, and agreement with the eager fast path within a floor (its sums run in
another order than torch's) with the same greedy tokens.  The models are the tiny ones of
``tests/engine/model/test_architectures.py``; sequences run past their windows of 8.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine import quant
from engine.model import kv
from engine.model.kv import KVState
from engine.model.support import support
from engine.quant import native
from tests.engine.model.test_architectures import COMMON, build
from tests.support.tiny import assert_same_rows

pytestmark = [
    pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: the eager path runs"),
    pytest.mark.usefixtures("native_step"),  # the build, before the first test (marks them build)
]

NAMES = ["qwen2-window-8", "mistral-window-8", "mistral-no-window", "qwen3", "phi3", "gemma2", "gemma3-text"]
MODES = ["fp16-cpu", "q8-cpu"]
# q8 quantizes each row's activations at run time (steps of 1/16383 of a group's largest): an input
# that differs in its last bits between the two paths can round to the next step, so its floor is wider.
FLOOR = {"fp16-cpu": 1e-4, "q8-cpu": 1e-3}


def qwen2_biased() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(**COMMON, num_hidden_layers=2, num_key_value_heads=1)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * (0.5 if "bias" in name else 0.2))
    return model


def quantized(name: str, mode: str) -> Any:
    model = qwen2_biased() if name == "qwen2-bias" else build(name)
    return quant.quantize_cpu(model, mode)


def counting(model: Any) -> list[int]:
    """A list that grows by one for every decode call the model's native step computed."""
    fast = kv.fast_forward(model)
    assert fast is not None and fast.native is not None
    calls: list[int] = []
    rows = fast.native.rows

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        out = rows(*args, **kwargs)
        calls.extend([1] if out is not None else [])  # None: it declined, the eager path ran
        return out

    fast.native.rows = counted  # type: ignore[method-assign]
    return calls


def eager_step(model: Any, state: KVState, token: int) -> torch.Tensor:
    """One decode step with the native step set aside (the eager fast path)."""
    fast = kv.fast_forward(model)
    assert fast is not None
    keep, fast.native = fast.native, None
    try:
        return kv.forward(model, state, [token], decode=True)[-1]
    finally:
        fast.native = keep


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["qwen2-bias", *NAMES])
def test_native_steps_agree_with_the_eager_path(name: str, mode: str) -> None:
    model = quantized(name, mode)
    assert native.module(wait=True) is not None, native.status()
    assert support(model.config.to_dict()).native_step
    ours, theirs = KVState(), KVState()
    prompt = list(range(5, 25))
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    calls = counting(model)
    token_ours = token_theirs = 7
    worst = 0.0
    for _ in range(14):  # each decodes its own greedy continuation, to position 34: past the windows of 8
        mine = kv.forward(model, ours, [token_ours], decode=True)[-1]
        reference = eager_step(model, theirs, token_theirs)
        worst = max(worst, float((mine - reference).abs().max()))
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=FLOOR[mode])
        token_ours, token_theirs = int(mine.argmax()), int(reference.argmax())
        assert token_ours == token_theirs
    assert len(calls) == 14, "every decode step ran the native step"
    for a, b in zip(ours.cache.layers, theirs.cache.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=FLOOR[mode])
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=FLOOR[mode])
    print(f"{name} {mode}: largest logit difference from the eager path {worst:.2e}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_rows_at_once_equal_one_row_calls_bit_for_bit(name: str, mode: str) -> None:
    model = quantized(name, mode)
    assert native.module(wait=True) is not None
    together, alone = KVState(), KVState()
    prompt, tokens = list(range(5, 30)), [7, 40, 3, 99, 12]
    kv.forward(model, together, prompt)
    kv.forward(model, alone, prompt)
    calls = counting(model)
    rows = kv.forward(model, together, tokens, all_logits=True, decode=True)
    ones = torch.stack([kv.forward(model, alone, [t], decode=True)[-1] for t in tokens])
    assert len(calls) == 1 + len(tokens)
    assert_same_rows(rows, ones)
    for a, b in zip(together.cache.layers, alone.cache.layers, strict=True):
        assert_same_rows(a.keys, b.keys)
        assert_same_rows(a.values, b.values)


def test_the_window_reaches_the_native_step() -> None:
    """Without its window the native step gives other logits past it (so the tests above can fail)."""
    model = quantized("mistral-window-8", "fp16-cpu")
    windowed, (step, state) = _decode_once(model)
    step.set_windows([0, 0])
    unwindowed = kv.forward(model, state, [7], decode=True)
    assert float((windowed - unwindowed).abs().max()) > 1e-3


def test_the_native_step_checks_head_norms_and_windows() -> None:
    model = quantized("qwen3", "fp16-cpu")
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    kv.forward(model, KVState(), [3, 4], decode=True)  # collects the weights and makes the step
    step = fast.native._stepper()
    assert step is not None
    with pytest.raises(RuntimeError, match="head norms"):
        step.set_head_norms([torch.ones(fast.head_dim)])  # one, not two a layer
    with pytest.raises(RuntimeError, match="head norms"):
        step.set_head_norms([torch.ones(fast.head_dim + 1)] * 4)
    with pytest.raises(RuntimeError, match="windows"):
        step.set_windows([8])
    with pytest.raises(RuntimeError, match="windows"):
        step.set_windows([8, -1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["gemma2", "gemma3-text"])
def test_sequences_batched_equal_each_alone_bit_for_bit(name: str, mode: str) -> None:
    """Continuous batching (``kv.forward_many``): Gemma 3's two rotary tables are each row's own in a batch too."""
    model = quantized(name, mode)
    assert native.module(wait=True) is not None
    batched, alone = [KVState(), KVState()], [KVState(), KVState()]
    prompts, steps = [list(range(5, 27)), list(range(40, 49))], [[7, 40, 3], [12]]
    for states in (batched, alone):
        for state, prompt in zip(states, prompts, strict=True):
            kv.forward(model, state, prompt)
    calls = counting(model)
    together = kv.forward_many(model, [(s, ids, True) for s, ids in zip(batched, steps, strict=True)])
    ones = [kv.forward(model, s, ids, all_logits=True, decode=True) for s, ids in zip(alone, steps, strict=True)]
    assert len(calls) == 2  # the batch was one native call (not counted here), each alone one
    for a, b in zip(together, ones, strict=True):
        assert_same_rows(a, b)
    for x, y in zip(batched, alone, strict=True):
        for a, b in zip(x.cache.layers, y.cache.layers, strict=True):
            assert_same_rows(a.keys, b.keys)
            assert_same_rows(a.values, b.values)


def _decode_once(model: Any) -> tuple[torch.Tensor, Any]:
    """One native decode step's logits after a 20-token prompt, and (its step, the state cropped back to
    the prompt) so that the same step can run again with other settings."""
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    state = KVState()
    kv.forward(model, state, list(range(5, 25)))
    logits = kv.forward(model, state, [7], decode=True)
    step = fast.native._stepper()
    assert step is not None
    state.crop(20)
    return logits, (step, state)


def test_gemma_settings_reach_the_native_step() -> None:
    """Without Gemma 2's soft caps, or with Gemma 3's global rotary table for every layer, the native step
    gives other logits (so the agreement tests above can fail)."""
    gemma2 = quantized("gemma2", "fp16-cpu")
    capped, (step, state) = _decode_once(gemma2)
    step.set_soft_caps(0.0, 0.0)
    uncapped = kv.forward(gemma2, state, [7], decode=True)
    assert float((capped - uncapped).abs().max()) > 1e-3
    gemma3 = quantized("gemma3-text", "fp16-cpu")
    local, (step, state) = _decode_once(gemma3)
    step.set_rotary_tables([0, 0, 0])  # the tables are sorted: full_attention's first
    global_only = kv.forward(gemma3, state, [7], decode=True)
    assert float((local - global_only).abs().max()) > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_the_native_step_sees_new_and_changed_gemma_norm_weights(mode: str) -> None:
    """Gemma's ``1 + w`` is added in the step, so a norm's new tensor (noticed by identity) and a change
    in place (read as it is) both reach it."""
    model = quantized("gemma3-text", mode)
    assert native.module(wait=True) is not None
    ours, theirs = KVState(), KVState()
    prompt = list(range(5, 25))
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    calls = counting(model)

    def agree(token: int) -> None:
        mine = kv.forward(model, ours, [token], decode=True)[-1]
        torch.testing.assert_close(mine, eager_step(model, theirs, token), rtol=1e-4, atol=FLOOR[mode])

    agree(7)
    layer = model.model.layers[1]
    beside = ("post_feedforward_layernorm.weight", "k_norm.weight")  # an output norm and a head norm a layer
    fresh = {k: torch.randn_like(v) * 0.5 for k, v in model.state_dict().items() if k.endswith(beside)}
    assert len(fresh) == 2 * len(model.model.layers)
    model.load_state_dict(fresh, strict=False, assign=True)  # new tensors; no layer swapped
    agree(8)
    with torch.no_grad():
        layer.post_attention_layernorm.weight.add_(0.75)
        model.model.norm.weight.mul_(-1.0)
    agree(9)
    assert len(calls) == 3, "every decode step ran the native step"
