"""The native decode step (engine/quant/native_step.cpp) for fp16-cpu models (q8-cpu: test_q8.py).

It is built here (a C++ compiler is part of this project's set-up, as for torch.compile),
so a failure to build fails this file.  What it must keep: each decode row bit for bit as
a one-row call gives it (so speculative verification cannot change a greedy reply), the
same keys and values in the cache, and agreement with the eager path within a floor
(its sums run in another order than torch's, so not the same bits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import quant
from engine.model import kv
from engine.model.kv import KVState
from engine.quant import native
from tests.support.tiny import assert_rows_at_once_equal_alone, assert_same_rows, load_fp16, load_q8

# Where no C++ compiler exists the app decodes on the eager path;
# everywhere else these must pass.
pytestmark = [
    pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: the eager path runs"),
    pytest.mark.usefixtures("native_step"),  # the build, before the first test (marks them build)
]


def eager(model: Any, state: KVState, tokens: list[int]) -> torch.Tensor:
    """Logits of one-token decode steps with the compiled steps turned off (the eager path)."""
    fast = kv.fast_forward(model)
    assert fast is not None
    keep, fast.native = fast.native, None
    try:
        return torch.stack([kv.forward(model, state, [t], decode=True)[-1] for t in tokens])
    finally:
        fast.native = keep


def test_without_a_compiler_the_native_step_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import threading

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing built there (a built copy loads without one)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_error", None)
    monkeypatch.setattr(native, "_thread", None)
    monkeypatch.setattr(native, "_done", threading.Event())
    assert native.compiler() is None
    assert native.module(wait=True) is None
    assert "no C++ compiler" in native.status() and "eager path" in native.status()
    assert "python -m engine.quant.native" in native.status()  # how to build it once there is one


def test_the_native_step_builds_on_this_machine() -> None:
    assert native.module(wait=True) is not None, native.status()
    assert native.status().startswith(("built", "rebuilt")) and "verified" in native.status()
    assert native.build_name().startswith("brisk_step_")


def test_rows_at_once_equal_one_row_calls_bit_for_bit(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    assert native.module(wait=True) is not None
    together, alone = assert_rows_at_once_equal_alone(model, assert_same_rows)
    # the last row only (logits_to_keep=1) is the same row
    last = kv.forward(model, together, [8, 9], decode=True)
    kv.forward(model, alone, [8], decode=True)
    assert_same_rows(last[-1], kv.forward(model, alone, [9], decode=True)[-1])


def test_native_steps_agree_with_the_eager_path(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    ours, theirs = KVState(), KVState()
    prompt, tokens = list(range(5, 25)), [7, 40, 3, 99, 12, 61, 8, 8, 30, 2]
    kv.forward(model, ours, prompt)
    kv.forward(model, theirs, prompt)
    calls = []
    rows = fast.native.rows
    fast.native.rows = lambda *a, **k: calls.append(1) or rows(*a, **k)  # type: ignore[method-assign]
    mine = torch.stack([kv.forward(model, ours, [t], decode=True)[-1] for t in tokens])
    del fast.native.rows
    assert len(calls) == len(tokens)
    reference = eager(model, theirs, tokens)
    assert not torch.equal(mine, torch.zeros_like(mine))
    torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-4)
    assert torch.equal(mine.argmax(-1), reference.argmax(-1))
    for a, b in zip(ours.cache.layers, theirs.cache.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-5)
    assert len(ours) == len(theirs) == 30


def test_a_branch_and_a_cropped_cache_decode_as_a_fresh_one(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    assert native.module(wait=True) is not None
    state = KVState()
    kv.forward(model, state, list(range(5, 25)))
    kv.forward(model, state, [3, 4, 5, 6], all_logits=True, decode=True)
    branch = KVState.from_snapshot(state.snapshot(22), state.tokens, 22)  # copy on first write
    state.crop(22)  # rejected drafts
    fresh = KVState()
    kv.forward(model, fresh, list(range(5, 25)))
    kv.forward(model, fresh, [3, 4], all_logits=True, decode=True)
    expected = kv.forward(model, fresh, [50], decode=True)
    assert_same_rows(kv.forward(model, state, [50], decode=True), expected)
    assert_same_rows(kv.forward(model, branch, [50], decode=True), expected)


@pytest.mark.parametrize("load", [load_fp16, load_q8], ids=["fp16-cpu", "q8-cpu"])
def test_a_shared_prefix_is_read_in_place_and_decodes_as_a_copy_of_it(tiny_dir: Path, load: Any) -> None:
    """A chat on a shared prefix (a document's KV) decodes from the prefix where it is, alone and batched with
    a chat of its own, bit for bit as from a copy of it; the prefix is never copied nor written."""
    model = load(tiny_dir)
    assert native.module(wait=True) is not None
    prefix = KVState()
    kv.forward(model, prefix, list(range(5, 45)))
    before = [layer.keys.clone() for layer in prefix.cache.layers]
    shared = KVState.from_snapshot(prefix.snapshot(), prefix.tokens)
    copied = KVState.from_snapshot(prefix.snapshot(), prefix.tokens)
    for layer in copied.cache.layers:
        layer.keys  # noqa: B018 - reading them joins the prefix into a buffer of its own: a copy
    other = KVState()
    kv.forward(model, other, [9, 8, 7])
    for state in (shared, copied):
        kv.forward(model, state, [11, 12, 13])  # the new chat's prompt, on the eager path
    for tokens in ([50], [51, 52, 53], [54]):  # a step, a verification of drafts, a step
        a = kv.forward_many(model, [(shared, tokens, True), (other, [60 + len(tokens)], False)])[0]
        b = kv.forward(model, copied, tokens, all_logits=True, decode=True)
        assert_same_rows(a, b)
    layer = shared.cache.layers[0]
    assert [p[0].shape[-2] for p in layer.segments()] == [40, 8], "the prefix is read where it is"
    assert layer.buf is not None and layer.buf.start == 40 and layer.buf.capacity <= 8 + kv.MIN_CAPACITY
    assert all(torch.equal(x.keys, y) for x, y in zip(prefix.cache.layers, before, strict=True))
    assert_same_rows(shared.cache.layers[1].keys, copied.cache.layers[1].keys)


def test_prompts_and_other_modes_keep_their_paths(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = load_fp16(tiny_dir)
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    calls = []
    rows = fast.native.rows
    fast.native.rows = lambda *a, **k: calls.append(1) or rows(*a, **k)  # type: ignore[method-assign]
    kv.forward(model, KVState(), [4, 5, 6])  # a prompt: the eager path
    kv.forward(model, KVState(), [4])  # a one-token prompt: the eager path too
    assert calls == []
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    step = kv.fast_forward(plain).native  # type: ignore[union-attr]
    assert step is not None and step.rows(torch.tensor([[1]]), kv.new_cache(), False) is None
    assert kv.forward(plain, KVState(), [4], decode=True).shape[-1] == plain.config.vocab_size


def test_without_the_native_step_decode_runs_on_the_eager_path(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_fp16(tiny_dir)
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, list(range(5, 15)))
    kv.forward(model, theirs, list(range(5, 15)))
    monkeypatch.setattr(native, "ENABLED", False)
    assert native.module() is None and native.status().startswith("off")
    fast = kv.fast_forward(model)
    assert fast is not None and fast.native is not None
    assert fast.native.rows(torch.tensor([[3]]), ours.cache, False) is None, "nothing to run without the library"
    assert torch.equal(
        torch.stack([kv.forward(model, ours, [t], decode=True)[-1] for t in (3, 4)]), eager(model, theirs, [3, 4])
    )


@pytest.mark.bundled
def test_native_greedy_decode_agrees_with_eager_on_the_bundled_model() -> None:
    from engine.api import ModelSpec
    from engine.model.loader import load_model
    from engine.model.source import wait_written

    loaded = load_model(ModelSpec(dtype="float32", device="cpu"))
    wait_written(loaded.source)  # a first load's converted copy is written behind it
    model = quant.load_quantized_model(loaded.source, "fp16-cpu", torch.float32, torch.device("cpu")).model
    assert native.module(wait=True) is not None
    messages = [{"role": "user", "content": "Write a short story about a fox who learns to sail."}]
    prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    ours, theirs = KVState(), KVState()
    token = int(kv.forward(model, ours, prompt)[-1].argmax())
    kv.forward(model, theirs, prompt)
    matches, steps = 0, 48
    for _ in range(steps):  # teacher-forced on the eager path's own greedy tokens
        mine = int(kv.forward(model, ours, [token], decode=True)[-1].argmax())
        reference = int(eager(model, theirs, [token])[-1].argmax())
        matches += mine == reference
        token = reference
    assert matches / steps >= 0.95  # kernels differ between CPUs: a floor, not the words


def test_a_native_step_that_fails_is_set_aside_and_decode_goes_on(tiny_dir: Path) -> None:
    model = load_fp16(tiny_dir)
    fast = kv.fast_forward(model)
    assert native.module(wait=True) is not None and fast is not None and fast.native is not None
    ours, theirs = KVState(), KVState()
    kv.forward(model, ours, list(range(5, 15)))
    kv.forward(model, theirs, list(range(5, 15)))
    kv.forward(model, ours, [3], decode=True)  # builds the native step
    kv.forward(model, theirs, [3], decode=True)

    class Broken:
        calls = 0

        def forward_batch(self, *args: Any) -> torch.Tensor:  # the call every decode step makes (rows_batch)
            Broken.calls += 1
            raise RuntimeError("KV buffers: contiguous float32 [1, kv heads, capacity >= past + n, head_dim]")

    fast.native._native = (fast.native._collected, Broken())
    mine = torch.stack([kv.forward(model, ours, [t], decode=True)[-1] for t in (4, 5)])  # eager steps now
    assert Broken.calls == 1 and fast.native._native[1] is None
    assert len(ours) == len(theirs) + 2 == 13
    assert torch.equal(mine, eager(model, theirs, [4, 5]))
