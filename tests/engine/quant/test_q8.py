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
from engine.quant.kernels import PROMPT_ROWS, Q8Linear, pack4, q8_reference, q8_weights, unpack4
from tests.support.tiny import (
    assert_rows_at_once_equal_alone,
    assert_same_rows,
    greedy_native_and_eager,
    load_q8,
    make_tiny_model,
)

pytestmark = [
    pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: q8-cpu runs its torch reference"),
    pytest.mark.usefixtures("native_step"),  # the build, before the first test (marks them build)
]


@pytest.fixture(scope="module", params=["8-bit", "4-bit"])
def tiny_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, and a copy whose weights lie on 16 levels a group (q8-cpu keeps it in 4 bits)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), four_bit=request.param == "4-bit")


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


def q4_layer(inputs: int, outputs: int, centred: bool = False, seed: int = 0) -> nn.Linear:
    """A layer whose weights came from a 4-bit GGUF: Q4_1 (d * q + m, both ends present) or Q4_0 (d * (q - 8))."""
    torch.manual_seed(seed)
    groups = inputs // 32
    d = torch.rand(outputs, groups, 1) * 0.02 + 0.001
    q = torch.randint(0, 16, (outputs, groups, 32)).float()
    if centred:
        q[..., 0] = 0  # the largest magnitude is level 0; the sign of d decides which end
        d = d * torch.where(torch.rand(outputs, groups, 1) < 0.5, -1.0, 1.0)
        w = d * (q - 8)
    else:
        q[..., 0], q[..., 1] = 0, 15
        w = d * q + torch.randn(outputs, groups, 1) * 0.05
    lin = nn.Linear(inputs, outputs).requires_grad_(False)
    lin.weight.copy_(w.reshape(outputs, inputs))
    return lin


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_0", "Q4_K"])
def test_weights_from_a_4_bit_gguf_are_kept_in_4_bits_and_give_8_bits_results(kind: str) -> None:
    built = native.module(wait=True)
    assert built is not None, native.status()
    lin = q4_layer(192, 70, centred=kind == "Q4_0")
    if kind == "Q4_K":  # fitted scales: a group's values need not reach levels 0 and 15
        torch.manual_seed(3)
        q = torch.randint(2, 13, (70, 6, 32)).float()
        lin.weight.copy_((torch.rand(70, 6, 1) * 0.02 * q - torch.rand(70, 6, 1) * 0.1).reshape(70, 192))
    four = Q8Linear.from_linear(lin)
    assert four.bits == 4 and four.qweight.shape == (70, 96)
    back = unpack4(four.qweight).float().reshape(70, 6, 32) * four.steps[..., None] + four.mins[..., None]
    assert float((back.reshape(70, 192) - lin.weight).abs().max()) <= 1e-6 * float(lin.weight.abs().max())
    # the same levels in 8 bits: the kernel must give the same floats, bit for bit, from half the bytes
    eight = Q8Linear(192, 70, True, bits=8)
    eight.qweight, eight.steps, eight.mins, eight.bias = (
        unpack4(four.qweight).contiguous(),
        four.steps,
        four.mins,
        four.bias,
    )
    for rows in (1, 2, 3, 4, 5, 9):
        x = torch.randn(rows, 192) * torch.linspace(0.01, 30, 192)
        ours = built.q8_linear(x, four.parts())
        assert torch.equal(ours, built.q8_linear(x, eight.parts()))
        reference = q8_reference(x, four.parts())  # float32 sums in another order
        assert float((ours - reference).norm() / reference.norm()) < 5e-5  # the minimums' term cancels some
        alone = torch.cat([built.q8_linear(x[i : i + 1], four.parts()) for i in range(rows)])
        assert torch.equal(ours, alone), "a row's result must not depend on the rows beside it"
    assert Q8Linear.from_linear(lin, four=False).bits == 8


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_steps_from_a_gguf_are_kept_in_float16_and_give_the_same_results(kind: str) -> None:
    built = native.module(wait=True)
    assert built is not None, native.status()
    torch.manual_seed(5)
    outputs, inputs = 70, 192
    d = (torch.rand(outputs, inputs // 32, 1) * 0.02 + 0.001).half().float()  # a GGUF's float16 scales
    if kind == "Q4_1":
        q = torch.randint(0, 16, (outputs, inputs // 32, 32)).float()
        q[..., 0], q[..., 1] = 0, 15
        w = d * q + (torch.randn(outputs, inputs // 32, 1) * 0.05).half().float()
    else:
        q = torch.randint(-127, 128, (outputs, inputs // 32, 32)).float()
        q[..., 3] = 127
        w = d * q
    lin = nn.Linear(inputs, outputs).requires_grad_(False)
    lin.weight.copy_(w.reshape(outputs, inputs))
    half = Q8Linear.from_linear(lin)
    assert half.bits == (4 if kind == "Q4_1" else 8)
    assert half.steps.dtype == half.mins.dtype == torch.float16
    levels = unpack4(half.qweight) if half.bits == 4 else half.qweight
    back = levels.float().reshape(outputs, -1, 32) * half.steps.float()[..., None] + half.mins.float()[..., None]
    assert float((back.reshape(outputs, inputs) - lin.weight).abs().max()) <= 1e-6 * float(lin.weight.abs().max())
    # the same values in float32: the kernel gives the same floats from fewer bytes (bit for bit where its
    # float16 and float32 loops sum alike: AVX-512; AVX2 rounds them apart in the last bit)
    wide = [half.qweight, half.steps.float(), half.mins.float(), half.parts()[3]]
    for rows in (1, 2, 4, 5, 9, PROMPT_ROWS):
        x = torch.randn(rows, inputs) * torch.linspace(0.01, 30, inputs)
        ours = built.q8_linear(x, half.parts())
        assert_same_rows(ours, built.q8_linear(x, wide))
        reference = q8_reference(x, half.parts())
        assert float((ours - reference).norm() / reference.norm()) < 5e-5
        expected = ours if rows < PROMPT_ROWS else nn.functional.linear(x, built.q8_dequantize(half.parts()), half.bias)
        assert torch.equal(half(x), expected), "the layer runs the native product (a prompt: its float32 weights)"
    assert torch.equal(built.q8_dequantize(half.parts()), built.q8_dequantize(wide))
    mixed = [half.qweight, half.steps, half.mins.float(), half.parts()[3]]
    with pytest.raises(RuntimeError, match="both float16"):
        built.q8_linear(torch.randn(1, inputs), mixed)


def test_steps_that_float16_would_round_stay_in_float32() -> None:
    assert Q8Linear.from_linear(layer(128, 16)).steps.dtype == torch.float32  # weights from float
    assert Q8Linear.from_linear(q4_layer(128, 8)).steps.dtype == torch.float32  # float32 steps on 16 levels
    huge = q4_layer(128, 8)
    huge.weight.mul_(1e6)  # steps beyond float16's range
    assert Q8Linear.from_linear(huge).steps.dtype == torch.float32


def test_weights_not_on_16_levels_stay_in_8_bits() -> None:
    assert Q8Linear.from_linear(layer(128, 16)).bits == 8  # random weights: 4 bits would round them
    assert Q8Linear.from_linear(q4_layer(96, 8)).bits == 8  # inputs not a multiple of 64: no 4-bit layout
    lin = q4_layer(128, 8)
    lin.weight[3, 5] += 1e-4  # one weight off the grid
    assert Q8Linear.from_linear(lin).bits == 8


def test_pack4_round_trips_and_the_kernel_refuses_wrong_shapes() -> None:
    q = torch.randint(0, 16, (5, 128), dtype=torch.uint8)
    assert torch.equal(unpack4(pack4(q)), q)
    built = native.module(wait=True)
    assert built is not None
    four = Q8Linear.from_linear(q4_layer(128, 4))
    w, d, m, b = four.parts()
    with pytest.raises(RuntimeError, match="4 bits with inputs a multiple of 64"):
        built.q8_linear(torch.randn(1, 128), [w[:, :48].contiguous(), d, m, b])
    with pytest.raises(RuntimeError, match="steps and minimums"):
        built.q8_linear(torch.randn(1, 128), [w, d, m[:, :3].contiguous(), b])
    with pytest.raises(ValueError, match="multiple of 64"):
        Q8Linear(96, 4, False, bits=4)


@pytest.mark.parametrize("four", [False, True])
def test_a_prompt_multiplies_the_weights_in_float32(four: bool) -> None:
    """From PROMPT_ROWS rows a q8 layer multiplies its weights as float32 (d * q + m), torch's GEMM: what
    float32 gives for those weights, closer than the integer path's 15-bit activations."""
    built = native.module(wait=True)
    assert built is not None
    lin = q4_layer(192, 40) if four else layer(192, 40)
    q = Q8Linear.from_linear(lin)
    assert (q.bits == 4) == four
    dense = built.q8_dequantize(q.parts())
    qw = unpack4(q.qweight) if four else q.qweight
    expected = (qw.float().reshape(40, 6, 32) * q.steps[..., None] + q.mins[..., None]).reshape(40, 192)
    torch.testing.assert_close(dense, expected, rtol=0, atol=1e-6)
    x = torch.randn(PROMPT_ROWS, 192)
    torch.testing.assert_close(q(x), nn.functional.linear(x, expected, q.bias), rtol=1e-5, atol=1e-5)
    small = x[: PROMPT_ROWS - 1]
    assert torch.equal(q(small), built.q8_linear(small, q.parts())), "fewer rows: the integer product"


def test_a_zero_group_and_a_zero_input_give_zeros_not_nans() -> None:
    lin = layer(64, 8, bias=False)
    lin.weight[:, :32] = 0.0
    q = Q8Linear.from_linear(lin)
    assert torch.isfinite(q.steps).all() and torch.isfinite(q.mins).all()
    out = q(torch.zeros(3, 64))
    assert torch.equal(out, torch.zeros(3, 8))
    assert torch.isfinite(q(torch.randn(2, 64))).all()


def test_greedy_decode_through_the_native_step_equals_the_eager_q8_path(
    tiny_dir: Path, request: pytest.FixtureRequest
) -> None:
    model = load_q8(tiny_dir)
    layers = [m for m in model.modules() if isinstance(m, Q8Linear)]
    four = request.node.callspec.params["tiny_dir"] == "4-bit"
    assert {m.bits for m in layers} == {4 if four else 8}
    # the 4-bit copy's groups are a GGUF's (float16 steps and minimums): its layers keep them in float16
    assert {m.steps.dtype for m in layers} == {torch.float16 if four else torch.float32}
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    calls = []
    rows = fast.native.rows
    fast.native.rows = lambda *a, **k: calls.append(1) or rows(*a, **k)  # type: ignore[method-assign]
    mine, reference = greedy_native_and_eager(model)
    assert len(calls) == 12, "every decode step ran the native step"
    assert mine == reference


def test_rows_at_once_equal_one_row_calls_bit_for_bit(tiny_dir: Path) -> None:
    model = load_q8(tiny_dir)
    assert native.module(wait=True) is not None
    assert_rows_at_once_equal_alone(model)


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


def test_a_q8_copy_saves_and_loads(tiny_dir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    model = load_q8(tiny_dir)
    quant.save_quantized(model, tmp_path / "copy")
    again = quant.load_quantized(tmp_path / "copy", torch.float32)
    assert type(again.lm_head) is Q8Linear and again.brisk_quant["mode"] == "q8-cpu"
    bits = {name: m.bits for name, m in model.named_modules() if type(m) is Q8Linear}
    assert bits == {name: m.bits for name, m in again.named_modules() if type(m) is Q8Linear}
    four = request.node.callspec.params["tiny_dir"] == "4-bit"
    assert set(bits.values()) == ({4} if four else {8})
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
