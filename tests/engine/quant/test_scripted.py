"""fp16-cpu's fused layers and its TorchScript decode step (engine.quant.scripted) compute what the
eager path computes: layer by layer, and step by step through the KV cache, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine import quant
from engine.model import kv
from engine.model.kv import KVState
from engine.quant import Fp16Group, Fp16Linear
from tests.support.tiny import load_fp16


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


def _decode(model: Any, state: KVState, tokens: list[int], scripted: bool) -> torch.Tensor:
    fast = kv.fast_forward(model)
    assert fast is not None
    keep, fast.scripted = fast.scripted, (fast.scripted if scripted else None)
    try:
        return torch.stack([kv.forward(model, state, [t])[-1] for t in tokens])
    finally:
        fast.scripted = keep


def test_scripted_steps_equal_eager_steps_through_the_cache_and_a_branch(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    fast = kv.fast_forward(model)
    assert fast is not None and fast.scripted is not None
    prompt, steps = list(range(5, 25)), [7, 40, 3, 99, 12, 61, 8, 8, 30, 2]
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    assert torch.equal(_decode(model, ours, steps, True), _decode(model, theirs, steps, False))
    for a, b in zip(ours.cache.layers, theirs.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    # a branch from a snapshot copies on its first write; the original goes on unchanged
    branch = KVState.from_snapshot(ours.snapshot(25), ours.tokens, 25)
    reference = KVState.from_snapshot(theirs.snapshot(25), theirs.tokens, 25)
    assert torch.equal(_decode(model, branch, [50, 51], True), _decode(model, reference, [50, 51], False))
    assert torch.equal(_decode(model, ours, [9, 10], True), _decode(model, theirs, [9, 10], False))
    assert len(ours) == len(theirs) == 32 and ours.cache_length() == 32


def test_scripted_step_runs_only_where_it_fits(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, DynamicCache

    ids = torch.tensor([[4]])
    fp16 = load_fp16(tiny_dir)
    fast = kv.fast_forward(fp16)
    assert fast is not None and fast.scripted is not None
    assert fast.scripted(ids, kv.new_cache()) is not None
    assert fast.scripted(ids, DynamicCache()) is None  # not Brisk's growing cache layers
    q = fp16.model.layers[0].self_attn.q_proj
    q.set_weights(*q.weights())  # unfused again: noticed at the next call
    assert fast.scripted(ids, kv.new_cache()) is None
    logits = kv.forward(fp16, KVState(), [4, 5])  # the eager path still runs it
    assert logits.shape[-1] == fp16.config.vocab_size
    for other in (
        AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval(),
        quant.quantize_cpu(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval(), "int8-cpu"),
    ):
        step = kv.fast_forward(other).scripted  # type: ignore[union-attr]
        assert step is not None and step(ids, kv.new_cache()) is None


def test_scripted_step_sees_new_norm_weights_and_remembers_a_misfit(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    fast = kv.fast_forward(model)
    assert fast is not None and fast.scripted is not None
    prompt = list(range(5, 15))
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    _decode(model, ours, [3], True)
    _decode(model, theirs, [3], False)
    norms = {k: torch.rand_like(v) + 0.5 for k, v in model.state_dict().items() if "norm" in k}
    model.load_state_dict(norms, strict=False, assign=True)  # new tensors; no layer swapped
    assert torch.equal(_decode(model, ours, [4, 5], True), _decode(model, theirs, [4, 5], False))

    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    step = kv.fast_forward(plain).scripted  # type: ignore[union-attr]
    assert step is not None
    calls = []
    collect = step.collect
    step.collect = lambda: calls.append(1) or collect()  # type: ignore[method-assign]
    for _ in range(3):
        assert step(torch.tensor([[1]]), kv.new_cache()) is None
    assert calls == [1]  # looked at once, then remembered as not fitting


def test_scripted_step_notices_a_fused_model_after_a_misfit(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    step = kv.fast_forward(model).scripted  # type: ignore[union-attr]
    assert step is not None and step(torch.tensor([[1]]), kv.new_cache()) is None  # plain linears: no
    before = quant.layout_version(model)
    quant.quantize_cpu(model, "fp16-cpu")  # swaps every layer in place, then fuses
    assert quant.layout_version(model) > before
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, [5, 6, 7])
    kv.forward(model, theirs, [5, 6, 7])
    assert torch.equal(_decode(model, ours, [8, 9], True), _decode(model, theirs, [8, 9], False))
    assert step._collected is not None  # the step ran scripted once the model fitted


@pytest.mark.bundled
def test_scripted_greedy_decode_equals_eager_on_bundled_model() -> None:
    from engine.api import ModelSpec
    from engine.model.loader import load_model

    loaded = load_model(ModelSpec(dtype="float32", device="cpu"))
    model = quant.load_quantized_model(loaded.source, "fp16-cpu", torch.float32, torch.device("cpu")).model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    replies = []
    for scripted in (True, False):
        state = KVState()
        token = int(kv.forward(model, state, prompt)[-1].argmax())
        reply = [token]
        for _ in range(24):
            token = int(_decode(model, state, [token], scripted)[-1].argmax())
            reply.append(token)
        replies.append(reply)
    assert replies[0] == replies[1]  # bit for bit; which words they are depends on this CPU's kernels


def test_first_and_cached_fp16_loads_are_both_fused(tiny_dir: Path, tmp_path: Path) -> None:
    import shutil

    source = Path(shutil.copytree(tiny_dir, tmp_path / "tiny"))
    cpu = torch.device("cpu")
    first = quant.load_quantized_model(str(source), "fp16-cpu", torch.float32, cpu)
    again = quant.load_quantized_model(str(source), "fp16-cpu", torch.float32, cpu)
    assert (first.cached, again.cached) == (False, True)
    for loaded in (first, again):
        assert loaded.model.model.layers[-1].mlp.up_proj.group is not None
        assert kv.fast_forward(loaded.model).scripted(torch.tensor([[1]]), kv.new_cache()) is not None  # type: ignore[union-attr]
