"""q8-cpu: 8-bit weights with a step and minimum per group of 32, 15-bit activations, in the native step.

What it must keep: the native product equal to its torch reference (the integer sums are
exact; only the float32 sums' order differs), a row's result independent of the rows beside
it (so speculative verification cannot change a greedy reply), weights that came from a 4-bit
or Q8_0 GGUF kept exactly, and greedy decode through the native step equal to the eager q8
path on a tiny random model and within the agreement floor on the bundled one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine import quant
from engine.model import kv
from engine.model.kv import KVState
from engine.quant import native
from engine.quant.kernels import Q8Linear, q8_reference, q8_weights
from tests.support.tiny import load_q8

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: q8-cpu runs its torch reference")


def layer(inputs: int, outputs: int, seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(inputs, outputs, bias=bias).requires_grad_(False)


@pytest.mark.parametrize(("inputs", "outputs", "rows"), [(64, 40, 1), (96, 24, 5), (576, 300, 3), (128, 7, 9)])
def test_the_native_product_equals_its_reference(inputs: int, outputs: int, rows: int) -> None:
    built = native.module(wait=True)
    assert built is not None, native.status()
    q = Q8Linear.from_linear(layer(inputs, outputs))
    x = torch.randn(rows, inputs) * torch.linspace(0.01, 30, inputs)  # groups of very different sizes
    ours = built.q8_linear(x, q.parts())
    torch.testing.assert_close(ours, q8_reference(x, q.parts()), rtol=1e-5, atol=1e-5)
    exact = nn.functional.linear(x, layer(inputs, outputs).weight, layer(inputs, outputs).bias)
    assert float((ours - exact).norm() / exact.norm()) < 0.01, "8-bit weights of random values: near float32"
    alone = torch.cat([built.q8_linear(x[i : i + 1], q.parts()) for i in range(rows)])
    assert torch.equal(ours, alone), "a row's result must not depend on the rows beside it"
    assert torch.equal(q(x), ours), "the layer runs the native product"
    assert q(x[None]).shape == (1, rows, outputs)


def test_weights_from_a_4_bit_or_q8_0_gguf_are_kept_exactly() -> None:
    torch.manual_seed(1)
    groups = 4 * 3
    # Q4_1: d * q + m, q in 0..15 with both ends present in each group of 32
    d, m = torch.rand(groups, 1) * 0.02 + 0.001, torch.randn(groups, 1) * 0.05
    q4 = torch.randint(0, 16, (groups, 32)).float()
    q4[:, 0], q4[:, 1] = 0, 15
    w4 = (d * q4 + m).reshape(4, 96)
    # Q8_0: d * q, q in -127..127 with the largest magnitude present
    q8 = torch.randint(-127, 128, (groups, 32)).float()
    q8[:, 3] = 127
    w8 = (d * q8).reshape(4, 96)
    for w in (w4, w8):
        q, steps, mins = q8_weights(w)
        back = (q.float().reshape(4, 3, 32) * steps[..., None] + mins[..., None]).reshape(4, 96)
        assert float((back - w).abs().max()) <= 1e-6 * float(w.abs().max())
    plain = nn.Linear(96, 4, bias=False).requires_grad_(False)
    plain.weight.copy_(w4)
    x = torch.randn(2, 96)
    relative = (Q8Linear.from_linear(plain)(x) - plain(x)).norm() / plain(x).norm()
    assert float(relative) < 2e-4, "only the 15-bit activations round"


def test_a_zero_group_and_a_zero_input_give_zeros_not_nans() -> None:
    lin = layer(64, 8, bias=False)
    lin.weight[:, :32] = 0.0
    q = Q8Linear.from_linear(lin)
    assert torch.isfinite(q.steps).all() and torch.isfinite(q.mins).all()
    out = q(torch.zeros(3, 64))
    assert torch.equal(out, torch.zeros(3, 8))
    assert torch.isfinite(q(torch.randn(2, 64))).all()


def test_greedy_decode_through_the_native_step_equals_the_eager_q8_path(tiny_dir: Path) -> None:
    model = load_q8(tiny_dir)
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    ours, theirs = KVState(), KVState()
    prompt = list(range(5, 25))
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    calls = []
    rows = fast.native.rows
    fast.native.rows = lambda *a, **k: calls.append(1) or rows(*a, **k)  # type: ignore[method-assign]
    token_ours = token_theirs = 7
    mine, reference = [], []
    for _ in range(12):  # each decodes its own greedy continuation
        token_ours = int(kv.forward(model, ours, [token_ours], decode=True)[-1].argmax())
        mine.append(token_ours)
        keep, fast.native = fast.native, None
        try:
            token_theirs = int(kv.forward(model, theirs, [token_theirs], decode=True)[-1].argmax())
        finally:
            fast.native = keep
        reference.append(token_theirs)
    assert len(calls) == 12, "every decode step ran the native step"
    assert mine == reference


def test_rows_at_once_equal_one_row_calls_bit_for_bit(tiny_dir: Path) -> None:
    model = load_q8(tiny_dir)
    assert native.module(wait=True) is not None
    together, alone = KVState(), KVState()
    prompt, tokens = list(range(5, 30)), [7, 40, 3, 99, 12]
    kv.forward(model, together, prompt)
    kv.forward(model, alone, prompt)
    rows = kv.forward(model, together, tokens, all_logits=True, decode=True)
    ones = torch.stack([kv.forward(model, alone, [t], decode=True)[-1] for t in tokens])
    assert rows.shape == ones.shape and torch.equal(rows, ones)
    for a, b in zip(together.cache.layers, alone.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_new_weights_are_collected_again(tiny_dir: Path) -> None:
    model = load_q8(tiny_dir)
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    state = KVState()
    kv.forward(model, state, list(range(5, 15)))
    before = kv.forward(model, state, [3], decode=True)[-1]
    head = model.lm_head
    head.mins = head.mins + 1.0  # a new tensor: the step must not keep the old one
    state.crop(10)
    after = kv.forward(model, state, [3], decode=True)[-1]
    assert not torch.allclose(before, after)


def test_a_q8_copy_saves_and_loads(tiny_dir: Path, tmp_path: Path) -> None:
    model = load_q8(tiny_dir)
    quant.save_quantized(model, tmp_path / "copy")
    again = quant.load_quantized(tmp_path / "copy", torch.float32)
    assert type(again.lm_head) is Q8Linear and again.brisk_quant["mode"] == "q8-cpu"
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)


@pytest.mark.bundled
def test_the_bundled_model_keeps_float32s_greedy_tokens_in_q8() -> None:
    from engine.api import ModelSpec
    from engine.model.loader import load_model
    from engine.model.source import wait_written

    loaded = load_model(ModelSpec(dtype="float32", device="cpu", quant="none"))
    wait_written(loaded.source)  # a first load's converted copy is written behind it
    model = quant.load_quantized_model(loaded.source, "q8-cpu", torch.float32, torch.device("cpu")).model
    assert native.module(wait=True) is not None
    messages = [{"role": "user", "content": "Explain to a child why the sea is salty."}]
    prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    ours, theirs = KVState(), KVState()
    token = int(kv.forward(loaded.model, theirs, prompt)[-1].argmax())
    kv.forward(model, ours, prompt)
    matches, steps = 0, 48
    for _ in range(steps):  # teacher-forced on float32's own greedy tokens, through the native step
        mine = int(kv.forward(model, ours, [token], decode=True)[-1].argmax())
        reference = int(kv.forward(loaded.model, theirs, [token], decode=True)[-1].argmax())
        matches += mine == reference
        token = reference
    assert matches / steps >= 0.95  # a floor, not the words: kernels differ between CPUs


def test_without_the_native_step_the_layer_computes_the_same_in_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    q = Q8Linear.from_linear(layer(96, 20))
    x = torch.randn(4, 96)
    with_native = q(x)
    monkeypatch.setattr(native, "ENABLED", False)
    assert native.module() is None
    torch.testing.assert_close(q(x), with_native, rtol=1e-5, atol=1e-5)


def test_the_native_step_checks_every_tensor_it_is_given(tiny_dir: Path) -> None:
    model = load_q8(tiny_dir)
    built = native.module(wait=True)
    fast = kv.fast_forward(model)
    assert built is not None and fast is not None and fast.native is not None
    norms, weights, (q_size, kv_size, intermediate), eps = fast.native.collect()
    args = (fast.head_dim, q_size, kv_size, intermediate, eps, float(fast.scaling))
    wrong = [*norms[:-1], torch.ones(norms[-1].numel() + 1)]
    with pytest.raises(RuntimeError, match="norms"):
        built.q8_stepper(wrong, weights, *args)
    with pytest.raises(RuntimeError, match="q8 projection of layer 0"):
        built.q8_stepper(norms, [weights[1], *weights[1:]], *args)
    step = built.q8_stepper(norms, weights, *args)
    embedding = model.model.embed_tokens.weight
    cos, sin = torch.zeros(1, fast.head_dim), torch.zeros(1, fast.head_dim)
    layers = len(model.model.layers)
    kv_heads = kv_size // fast.head_dim
    good = [torch.zeros(1, kv_heads, 8, fast.head_dim) for _ in range(layers)]
    logits = step.forward(torch.tensor([3]), embedding, cos, sin, good, list(good), 0, False)
    assert logits.shape == (1, embedding.shape[0])
    half = [torch.zeros(1, kv_heads, 8, fast.head_dim, dtype=torch.float16) for _ in range(layers)]
    with pytest.raises(RuntimeError, match="KV buffers"):
        step.forward(torch.tensor([3]), embedding, cos, sin, half, half, 0, False)
    with pytest.raises(RuntimeError, match="token id out of range"):
        step.forward(torch.tensor([embedding.shape[0]]), embedding, cos, sin, good, list(good), 0, False)
