"""Moving cached KV (engine.model.kv_shift) and llama-server's chunk reuse (engine.runtime.prefix_cache): a key
shifted by d is the key computed d positions later; the reuse loop moves what llama.cpp's moves; a state built
from moves holds the cached keys re-rotated and the values as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.kv import KVState, forward
from engine.model.kv_shift import RopeShift, moved_state
from engine.quant.decode_step import rotate
from engine.runtime.prefix_cache import PrefixCache, reuse_moves


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def rope(model: Any, k: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """``k`` [1, heads, n, dim] rotated to ``positions`` by the model's own rotary module."""
    pos = torch.tensor([positions])
    cos, sin = model.model.rotary_emb(k, pos)
    return rotate(k, cos.unsqueeze(1), sin.unsqueeze(1), k.shape[-1] // 2)


@pytest.mark.parametrize("delta", [-300, -37, -1, 5, 211])
def test_a_shifted_key_is_the_key_at_its_new_position(tiny: Any, delta: int) -> None:
    torch.manual_seed(1)
    dim = tiny.config.hidden_size // tiny.config.num_attention_heads
    k = torch.randn(1, 2, 6, dim)
    start = [310, 311, 312, 400, 401, 450]
    shift = RopeShift.for_model(tiny)
    moved = shift.shift(rope(tiny, k, start), delta)
    torch.testing.assert_close(moved, rope(tiny, k, [p + delta for p in start]), atol=2e-5, rtol=1e-5)
    assert not torch.allclose(moved, rope(tiny, k, start), atol=1e-3)  # it did rotate
    half = shift.shift(rope(tiny, k, start).half(), delta)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), rope(tiny, k, [p + delta for p in start]), atol=1e-2, rtol=1e-2)


def test_a_model_whose_rotary_it_does_not_handle_is_refused(tiny: Any) -> None:
    rotary = tiny.model.rotary_emb
    saved = rotary.rope_type
    try:
        rotary.rope_type = "dynamic"
        with pytest.raises(ValueError, match="depends on the length"):
            RopeShift.for_model(tiny)
    finally:
        rotary.rope_type = saved


def test_reuse_moves_follows_llama_servers_loop() -> None:
    a, b, c = list(range(100, 140)), list(range(200, 210)), list(range(300, 340))
    # a chunk deleted in the middle: the rest is moved back by its length
    assert reuse_moves([1, 2, *a, *b, *c, 9], [1, 2, *a, *c, 9, 7], 16) == (42, [(52, 42, 41)])
    assert reuse_moves([1, 2, *a, *b, *c], [1, 2, *a, *c], 16) == (42, [(52, 42, 39)])  # one token left to compute
    # a run shorter than N is not moved, and nothing after the prompt's head is looked for (llama.cpp's loop)
    assert reuse_moves([*a, *b, *c], [*a, *c[:10]], 16) == (40, [])
    assert reuse_moves([*a, *b, *c], [*a, 5, *c], 16) == (40, [])
    assert reuse_moves([*a, *b, *c], [*a, *c], 0) == (40, [])  # off
    # with gaps: text inserted (a keystroke) is computed, the run after it still moved
    assert reuse_moves([*a, *b, *c], [*a, 5, 6, *c, 1], 16, gaps=1) == (40, [(50, 42, 40)])
    # b is too short to move: computed with the gap around it
    assert reuse_moves([*a, *b, *c], [*a, 5, *b, 6, *c, 1], 16, gaps=1) == (40, [(50, 52, 40)])
    assert reuse_moves([*a, *b, *c], [*a, 5, *c[:20], 6, *c[20:], 1], 16, gaps=2) == (40, [(50, 41, 20), (70, 62, 20)])
    assert reuse_moves([*a, *b, *c], [*a, 5, *c[:20], 6, *c[20:], 1], 16, gaps=1) == (40, [(50, 41, 20)])
    # two chunks, each moved to where the prompt's head is
    assert reuse_moves([*b, *a, 7, 7, *c], [*a, *c, 1], 16) == (0, [(10, 0, 40), (52, 40, 40)])


@pytest.fixture
def cached(tiny: Any) -> tuple[list[int], KVState, PrefixCache]:
    """A 60-token prompt's KV, and a prefix cache holding it under "old"."""
    prompt = list(range(10, 70))
    state = KVState()
    forward(tiny, state, prompt)
    cache = PrefixCache("tiny")
    cache.insert("old", state)
    return prompt, state, cache


def test_a_moved_state_holds_re_rotated_keys_and_the_same_values(
    tiny: Any, cached: tuple[list[int], KVState, PrefixCache]
) -> None:
    prompt, state, cache = cached
    new = [*prompt[:8], *prompt[28:], 5]  # 20 tokens deleted after the first 8
    got = cache.lookup(new, reuse=16, model=tiny)
    assert got.tokens == new[:-1] and len(got) == 40
    assert cache.lookup(new).tokens == new[:8]  # off: the prefix alone, as before
    shift = RopeShift.for_model(tiny)
    for layer, old in zip(got.cache.layers, state.cache.layers, strict=True):
        torch.testing.assert_close(layer.keys[..., :8, :], old.keys[..., :8, :], atol=0, rtol=0)
        torch.testing.assert_close(layer.keys[..., 8:, :], shift.shift(old.keys[..., 28:60, :], -20))
        torch.testing.assert_close(layer.values[..., 8:, :], old.values[..., 28:60, :], atol=0, rtol=0)
    logits = forward(tiny, got, [5])  # the prefill continues from it
    assert logits.shape[-1] == tiny.config.vocab_size and len(got) == len(new)
    # the entry itself was not changed by the move
    again = moved_state(cache.entries["old"].snapshot, prompt, new, 8, [(28, 8, 32)], shift)
    torch.testing.assert_close(again.cache.layers[0].keys, got.cache.layers[0].keys[..., :40, :])


def test_new_tokens_before_a_chunk_are_computed_and_counted(
    tiny: Any, cached: tuple[list[int], KVState, PrefixCache]
) -> None:
    prompt, state, cache = cached
    typed = [*prompt[:8], 3, 4, *prompt[8:], 5]  # two tokens typed after the first 8
    got = cache.lookup(typed, reuse=16, model=tiny)
    assert got.tokens == typed[:-1] and got.computed == 2
    alone = KVState()
    forward(tiny, alone, typed[:10])  # the typed tokens' KV, as a prefill computes it
    shift = RopeShift.for_model(tiny)
    for layer, cold, old in zip(got.cache.layers, alone.cache.layers, state.cache.layers, strict=True):
        torch.testing.assert_close(layer.keys[..., :10, :], cold.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.keys[..., 10:, :], shift.shift(old.keys[..., 8:60, :], 2))
    assert cache.lookup(typed).tokens == typed[:8] and cache.lookup(typed).computed == 0  # off: the prefix alone
