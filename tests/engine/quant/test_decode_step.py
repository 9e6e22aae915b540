"""fp16-cpu's fused layers compute what separate layers compute, and the native decode step's Python side
(engine.quant.decode_step) takes exactly the models it fits, notices new weights, and declines the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine import quant
from engine.model import kv
from engine.model.kv import KVState
from engine.quant import Fp16Group, Fp16Linear, native
from tests.support.tiny import load_fp16

pytestmark = pytest.mark.usefixtures("native_step")  # the build, before the first test (marks them build)


def test_a_group_computes_once_for_its_parts_and_matches_separate_layers() -> None:
    torch.manual_seed(0)
    linears = [nn.Linear(64, out, bias=True) for out in (48, 16, 16)]
    alone = [Fp16Linear.from_linear(lin) for lin in linears]
    parts = [Fp16Linear.from_linear(lin) for lin in linears]
    bytes_before = sum(p.packed_nbytes for p in parts)
    group = Fp16Group(parts)
    assert all(p.packed is None and p.group is group for p in parts)
    x = torch.randn(1, 5, 64)
    with torch.inference_mode():
        outs = [p(x) for p in parts]
        assert group._memo is None  # every part took its rows: nothing kept
        for out, layer in zip(outs, alone, strict=True):
            torch.testing.assert_close(out, layer(x), atol=1e-5, rtol=1e-5)
        assert len({o.untyped_storage().data_ptr() for o in outs}) == 1  # one matmul for the three
        q = parts[0](x)
        assert group._memo is not None
        other = torch.randn(1, 2, 64)
        torch.testing.assert_close(parts[1](other), alone[1](other), atol=1e-5, rtol=1e-5)  # a new input: computed anew
        torch.testing.assert_close(q, alone[0](x), atol=1e-5, rtol=1e-5)
    for part, layer in zip(parts, alone, strict=True):  # saved weights are the layer's own
        ours, theirs = part.state_dict(), layer.state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert sum(p.packed_nbytes for p in parts) == bytes_before
    parts[1].set_weights(*alone[1].weights())  # k leaves the group: q and v alone release the output
    with torch.inference_mode():
        parts[0](x), parts[2](x)
    assert group._memo is None and group.active == {0, 2}
    with pytest.raises(ValueError, match="same input width"):
        Fp16Group([Fp16Linear.from_linear(nn.Linear(64, 8)), Fp16Linear.from_linear(nn.Linear(32, 8))])


def test_fp16_model_is_fused_and_its_saved_copy_reloads_fused(tiny_dir: Path, tmp_path: Path) -> None:
    model = load_fp16(tiny_dir)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.q_proj.group is attn.k_proj.group is attn.v_proj.group is not None
    assert mlp.gate_proj.group is mlp.up_proj.group is not None and mlp.down_proj.group is None
    quant.save_quantized(model, tmp_path / "copy")
    again = quant.load_quantized(tmp_path / "copy", torch.float32)
    assert again.model.layers[0].self_attn.q_proj.group is not None
    ids = torch.tensor([[3, 9, 27, 81, 5]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert quant.weight_bytes(again) == quant.weight_bytes(model)


needs_native = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: the eager path runs")


def _decode(model: Any, state: KVState, tokens: list[int], on: bool) -> torch.Tensor:
    """One-token decode steps through the native step (``on``) or the eager path."""
    fast = kv.fast_forward(model)
    assert fast is not None
    keep, fast.native = fast.native, (fast.native if on else None)
    try:
        return torch.stack([kv.forward(model, state, [t], decode=True)[-1] for t in tokens])
    finally:
        fast.native = keep


def _runs(step: Any, cache: Any = None) -> bool:
    """Whether the native step takes a decode token on a fresh cache holding two tokens."""
    state = KVState()
    if cache is None:
        kv.forward(step.model, state, [0, 1])
        cache = state.cache
    return step.rows(torch.tensor([[2]]), cache, False) is not None


@needs_native
def test_native_step_runs_only_where_it_fits(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, DynamicCache

    assert native.module(wait=True) is not None
    fp16 = load_fp16(tiny_dir)
    fast = kv.fast_forward(fp16)
    assert fast is not None and fast.native is not None
    assert _runs(fast.native)
    assert fast.native.rows(torch.tensor([[4]]), DynamicCache(), False) is None  # not Brisk's growing cache layers
    q = fp16.model.layers[0].self_attn.q_proj
    q.set_weights(*q.weights())  # unfused again: noticed at the next call
    assert not _runs(fast.native)
    logits = kv.forward(fp16, KVState(), [4, 5])  # the eager path still runs it
    assert logits.shape[-1] == fp16.config.vocab_size
    for other in (
        AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval(),
        quant.quantize_cpu(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval(), "int8-cpu"),
    ):
        step = kv.fast_forward(other).native  # type: ignore[union-attr]
        assert step is not None and not _runs(step)


@needs_native
def test_native_step_sees_new_norm_weights_and_remembers_a_misfit(tiny_dir: Path) -> None:
    assert native.module(wait=True) is not None
    model = load_fp16(tiny_dir)
    prompt = list(range(5, 15))
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    _decode(model, ours, [3], True)
    _decode(model, theirs, [3], False)
    norms = {k: torch.rand_like(v) + 0.5 for k, v in model.state_dict().items() if "norm" in k}
    model.load_state_dict(norms, strict=False, assign=True)  # new tensors; no layer swapped
    torch.testing.assert_close(_decode(model, ours, [4, 5], True), _decode(model, theirs, [4, 5], False))

    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    step = kv.fast_forward(plain).native  # type: ignore[union-attr]
    assert step is not None
    calls = []
    collect = step.collect
    step.collect = lambda: calls.append(1) or collect()  # type: ignore[method-assign]
    state = KVState()
    kv.forward(plain, state, [0, 1])
    for _ in range(3):
        assert step.rows(torch.tensor([[1]]), state.cache, False) is None
    assert calls == [1]  # looked at once, then remembered as not fitting


@needs_native
def test_native_step_notices_a_fused_model_after_a_misfit(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert native.module(wait=True) is not None
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    step = kv.fast_forward(model).native  # type: ignore[union-attr]
    assert step is not None and not _runs(step)  # plain linears: no
    before = quant.layout_version(model)
    quant.quantize_cpu(model, "fp16-cpu")  # swaps every layer in place, then fuses
    assert quant.layout_version(model) > before
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, [5, 6, 7])
    kv.forward(model, theirs, [5, 6, 7])
    torch.testing.assert_close(_decode(model, ours, [8, 9], True), _decode(model, theirs, [8, 9], False))
    assert step._collected is not None and step.kind == "fp16"  # the native step ran once the model fitted


@needs_native
def test_first_and_cached_fp16_loads_are_both_fused(tiny_dir: Path, tmp_path: Path) -> None:
    import shutil

    assert native.module(wait=True) is not None
    source = Path(shutil.copytree(tiny_dir, tmp_path / "tiny"))
    cpu = torch.device("cpu")
    first = quant.load_quantized_model(str(source), "fp16-cpu", torch.float32, cpu)
    again = quant.load_quantized_model(str(source), "fp16-cpu", torch.float32, cpu)
    assert (first.cached, again.cached) == (False, True)
    for loaded in (first, again):
        assert loaded.model.model.layers[-1].mlp.up_proj.group is not None
        assert _runs(kv.fast_forward(loaded.model).native)  # type: ignore[union-attr]
