"""engine.model.support says, from a config.json alone, which models run fast, and why not in words.

The configs are the keys that matter from real models' config.json files (as they are on
disk, not as transformers rewrites them).  Whether the fast path really takes what
``support()`` says is tested on tiny models in ``test_architectures.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.model import support as support_module
from engine.model.support import Support, support, support_for_gguf

LLAMA_3_2 = {
    "model_type": "llama",
    "hidden_act": "silu",
    "num_hidden_layers": 16,
    "pretraining_tp": 1,
    "rope_scaling": {"factor": 32.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
}
MISTRAL_V01 = {
    "model_type": "mistral",
    "hidden_act": "silu",
    "num_hidden_layers": 32,
    "sliding_window": 4096,
    "max_position_embeddings": 32768,
}
MISTRAL_V03 = {"model_type": "mistral", "hidden_act": "silu", "num_hidden_layers": 32, "sliding_window": None}
QWEN2_5 = {
    "model_type": "qwen2",
    "hidden_act": "silu",
    "num_hidden_layers": 24,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 21,
    "rope_scaling": None,
}
QWEN3 = {
    "model_type": "qwen3",
    "hidden_act": "silu",
    "num_hidden_layers": 28,
    "head_dim": 128,
    "use_sliding_window": False,
    "sliding_window": None,
    "rope_scaling": None,
}
PHI3_MINI_4K = {
    "model_type": "phi3",
    "hidden_act": "silu",
    "num_hidden_layers": 32,
    "sliding_window": 2047,
    "rope_scaling": None,
}
PHI3_5_MINI = {
    **PHI3_MINI_4K,
    "sliding_window": 262144,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]},
}
PHI4_MINI = {**PHI3_MINI_4K, "partial_rotary_factor": 0.75, "sliding_window": 262144}
GEMMA2 = {
    "model_type": "gemma2",
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "num_hidden_layers": 26,
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
}
GEMMA3_TEXT = {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "num_hidden_layers": 34,
               "sliding_window": 1024, "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0,
               "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "attn_logit_softcapping": None,
               "final_logit_softcapping": None, "query_pre_attn_scalar": 256}  # fmt: skip

BOTH = Support(fast_path=True, native_step=True, reason="")


@pytest.mark.parametrize(
    "config", [LLAMA_3_2, MISTRAL_V01, MISTRAL_V03, QWEN2_5, QWEN3, PHI3_MINI_4K, GEMMA2, GEMMA3_TEXT]
)
def test_llama_mistral_qwen_phi3_and_gemma_take_both_paths(config: dict[str, Any]) -> None:
    assert support(config) == BOTH


def test_a_partial_rotary_phi_takes_the_fast_path_only() -> None:
    said = support(PHI4_MINI)
    assert said.fast_path and not said.native_step and "part of each head" in said.reason


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "mamba"}, "'mamba'"),
        ({}, "without a model_type"),
        ({"model_type": "gemma3", "text_config": {}}, "vision"),
        ({"model_type": "mixtral"}, "Mixtral"),
        ({**LLAMA_3_2, "hidden_act": "gelu"}, "activation 'gelu'"),
        ({**GEMMA2, "hidden_activation": "gelu"}, "activation 'gelu'"),
        ({**LLAMA_3_2, "pretraining_tp": 2}, "pretraining_tp"),
        ({**LLAMA_3_2, "_attn_implementation": "eager"}, "'eager'"),
        ({**PHI3_5_MINI}, "'longrope'"),
        ({**QWEN3, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ({**LLAMA_3_2, "partial_rotary_factor": 0.5}, "part of each head"),
        ({**MISTRAL_V01, "sliding_window": 0}, "sliding window of 0"),
        ({**QWEN2_5, "layer_types": ["chunked_attention"] * 24}, "chunked_attention"),
        ({**MISTRAL_V01, "layer_types": ["sliding_attention", "full_attention"] * 16}, "other attention types"),
        ({**GEMMA3_TEXT, "use_bidirectional_attention": True}, "bidirectional"),
        ({**QWEN3, "attn_logit_softcapping": 30.0}, "soft-capping"),
    ],
)
def test_what_it_does_not_take_declines_with_a_reason(config: dict[str, Any], words: str) -> None:
    said = support(config)
    assert not said.fast_path and not said.native_step
    assert words in said.reason and "transformers' forward (slower)" in said.reason


@pytest.mark.parametrize(
    ("arch", "fast", "native"),
    [("llama", True, True), ("mistral", True, True), ("qwen2", True, True), ("qwen3", True, True),
     ("phi3", True, True), ("gemma2", True, True), ("gemma3", True, True), ("qwen3moe", False, False),
     ("phi2", False, False), ("falcon", False, False)],
)  # fmt: skip
def test_gguf_architectures(arch: str, fast: bool, native: bool) -> None:
    said = support_for_gguf(arch)
    assert (said.fast_path, said.native_step) == (fast, native)
    assert bool(said.reason) != (fast and native)
    if not fast:
        assert repr(arch) in said.reason


def test_support_is_a_frozen_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        support(QWEN3).fast_path = False  # type: ignore[misc]


def test_windows_are_read_as_transformers_reads_them() -> None:
    windows = support_module.layout
    assert windows(MISTRAL_V01)[0].windows == (4096,) * 32  # type: ignore[union-attr]
    assert windows(QWEN2_5)[0].windows == (None,) * 24  # type: ignore[union-attr]  # use_sliding_window is off
    qwen_windowed = {**QWEN2_5, "use_sliding_window": True}
    assert windows(qwen_windowed)[0].windows == (None,) * 21 + (32768,) * 3  # type: ignore[union-attr]
    gemma2 = windows(GEMMA2)[0]
    assert gemma2 is not None and gemma2.windows[:3] == (4096, None, 4096) and gemma2.softcap == 50.0
    gemma3 = windows(GEMMA3_TEXT)[0]
    assert gemma3 is not None and gemma3.windows[:6] == (1024,) * 5 + (None,) and gemma3.softcap is None
    assert windows({**LLAMA_3_2, "sliding_window": 4096})[0].windows == (None,) * 16  # type: ignore[union-attr]


def test_the_module_imports_only_the_standard_library() -> None:
    """The model library scans folders with it, so it must not pull in torch or transformers."""
    tree = ast.parse(Path(support_module.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots = {name.split(".")[0] for name in names}
    assert roots and roots <= set(sys.stdlib_module_names) | {"__future__"}, roots
