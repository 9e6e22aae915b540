"""GGUF files run as they are: block kernels, the model mapped from the file, nothing converted or written.

What it must keep: every block format de-quantized exactly as ``gguf``'s own code does it; a
projection's few rows (integer dots on the blocks) near the float32 product and a prompt's rows
(de-quantized tiles) equal to it; a row's result independent of the rows beside it (speculation
and batching cannot change a greedy reply); a tiny model written as a GGUF of each type loaded on
its blocks (Llama's permuted query and key rows put back) giving the reference model's logits,
built from the file de-quantized; and a load that writes no copy of the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.api import ModelSpec
from engine.bench.tiny import gguf_blocks, make_tokenizer, sharpen, write_model_gguf
from engine.model import kv
from engine.model.kv import KVState
from engine.model.loader import GGUF_AS_IS, load_model
from engine.quant import native
from tests.support.tiny import assert_rows_at_once_equal_alone, greedy_native_and_eager

pytestmark = [
    pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler: the block kernels are native"),
    pytest.mark.usefixtures("native_step"),  # the build, before the first test (marks them build)
]

# every type the kernels read: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL
TYPES = [0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20]


@pytest.fixture(scope="module")
def built() -> Any:
    module = native.module(wait=True)
    assert module is not None, native.status()
    return module


def reference(blocks: np.ndarray, qtype: int, shape: tuple[int, int]) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(qtype)).reshape(shape).copy())


@pytest.mark.parametrize("qtype", TYPES)
def test_each_block_format_reads_as_gguf_reads_it(built: Any, qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    weight = rng.standard_normal((48, 512)).astype(np.float32) * 0.05
    blocks = np.ascontiguousarray(gguf_blocks(weight, qtype, rng)).view(np.uint8).reshape(48, -1)
    exact = reference(blocks, qtype, (48, 512))
    held = torch.from_numpy(blocks)
    assert torch.equal(built.gguf_dequantize(held, qtype), exact)
    parts = [held, torch.randn(48)]
    few, many = torch.randn(3, 512), torch.randn(40, 512)  # a decode step's rows; a prompt's
    want_few, want_many = few @ exact.T + parts[1], many @ exact.T + parts[1]
    got_few, got_many = built.gguf_linear(few, parts, [qtype]), built.gguf_linear(many, parts, [qtype])
    assert float((got_few - want_few).norm() / want_few.norm()) < 2e-4  # activations in 15 bits a block
    assert torch.allclose(got_many, want_many, rtol=1e-4, atol=1e-4)  # float32 tiles, torch's GEMM
    alone = torch.cat([built.gguf_linear(few[i : i + 1], parts, [qtype]) for i in range(3)])
    assert torch.equal(alone, got_few), "a row's result does not depend on the rows beside it"


def test_embedding_rows_and_bad_input_are_refused(built: Any) -> None:
    rng = np.random.default_rng(1)
    blocks = torch.from_numpy(np.ascontiguousarray(gguf_blocks(rng.standard_normal((10, 256)), 12, rng)))
    full = built.gguf_dequantize(blocks, 12)
    assert torch.equal(built.gguf_rows(blocks, 12, torch.tensor([3, 0, 3])), full[[3, 0, 3]])
    with pytest.raises(RuntimeError, match="outside"):
        built.gguf_rows(blocks, 12, torch.tensor([10]))
    with pytest.raises(RuntimeError, match="not one Brisk reads"):
        built.gguf_linear(torch.randn(1, 256), [blocks, torch.empty(0)], [99])
    with pytest.raises(RuntimeError, match="whole blocks"):
        built.gguf_linear(torch.randn(1, 256), [blocks[:, :100].contiguous(), torch.empty(0)], [12])


def tiny_gguf(folder: Path, arch: str, qtype: int) -> tuple[Path, Any]:
    """A tiny random ``arch`` model written as a GGUF of ``qtype`` blocks, and the reference model holding the
    file's weights de-quantized (transformers' own forward, float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(qtype)
    config = config_class(
        vocab_size=len(make_tokenizer()), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1,
        eos_token_id=2, pad_token_id=2, tie_word_embeddings=arch == "llama",
    )  # fmt: skip
    model = sharpen(model_class(config).eval())
    with torch.no_grad():  # sharper still: greedy choices far from ties (a random model's are close)
        model.lm_head.weight.mul_(4.0)
    path = folder / f"tiny-{arch}-{qtype}.gguf"
    weights = write_model_gguf(path, model, qtype)
    ref = model_class(config).eval()
    ref.load_state_dict({name: torch.from_numpy(value) for name, value in weights.items()})
    return path, ref


@pytest.mark.parametrize(("arch", "qtype"), [("qwen2", t) for t in TYPES] + [("llama", 12), ("llama", 2)])
def test_a_tiny_gguf_runs_on_its_blocks_with_the_references_logits(
    built: Any, arch: str, qtype: int, tmp_path: Path, brisk_data_dir: Path
) -> None:
    path, ref = tiny_gguf(tmp_path, arch, qtype)
    loaded = load_model(ModelSpec(source=str(path)))
    assert loaded.quant == GGUF_AS_IS
    fast = kv.fast_forward(loaded.model)
    assert fast is not None and fast.native is not None
    ids = torch.randint(3, ref.config.vocab_size, (1, 2000), generator=torch.Generator().manual_seed(7))[0].tolist()
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
        prompt = kv.forward(loaded.model, KVState(), ids, all_logits=True)  # a prompt: float32 tiles
        state, steps = KVState(), []
        kv.forward(loaded.model, state, ids[:1])
        for token in ids[1:]:  # teacher-forced decode steps: the native step's integer dots
            steps.append(kv.forward(loaded.model, state, [token], decode=True)[-1])
    decoded = torch.stack(steps)
    assert float((prompt.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.995
    assert float((decoded.argmax(-1) == want[1:].argmax(-1)).float().mean()) >= 0.995
    assert not (brisk_data_dir / "cache" / "models").exists(), "no converted copy written"


def test_greedy_decode_through_the_native_step_equals_the_eager_path(
    built: Any, tmp_path: Path, brisk_data_dir: Path
) -> None:
    path, _ = tiny_gguf(tmp_path, "qwen2", 12)
    model = load_model(ModelSpec(source=str(path))).model
    mine, reference = greedy_native_and_eager(model)
    assert mine == reference
    assert_rows_at_once_equal_alone(model)  # verifying drafts in one call gives what one-token calls give


def test_an_architecture_it_does_not_map_is_converted_and_says_why(tmp_path: Path, brisk_data_dir: Path) -> None:
    from engine.model import gguf_model, loader

    path, _ = tiny_gguf(tmp_path, "qwen2", 8)
    file = gguf_model.read_header(path)
    file.metadata["general.architecture"] = "rwkv6"
    with pytest.raises(gguf_model.Unsupported, match="rwkv6"):
        gguf_model.check(file)
    assert loader.gguf_runs_as_is(ModelSpec(source=str(path)))
    assert not loader.gguf_runs_as_is(ModelSpec(source=str(path), quant="q8-cpu")), "a mode asked for converts"
    assert not loader.gguf_runs_as_is(ModelSpec(source=str(tmp_path / "missing.gguf")))


def test_memory_is_predicted_from_the_file_and_a_model_too_big_is_refused(
    tmp_path: Path, brisk_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.model import gguf_model, headers
    from engine.model.source import ModelLoadError

    path, _ = tiny_gguf(tmp_path, "qwen2", 12)
    file = gguf_model.read_header(path)
    need = gguf_model.predict_bytes(file, 1000)
    tensors = sum(gguf_model.tensor_bytes(s, k) for s, k, _ in file.tensors.values())
    assert need["weights"] == tensors and need["kv"] == 2 * 2 * 2 * 64 * 1000 * 4
    monkeypatch.setattr(headers, "available_memory", lambda: need["weights"])
    with pytest.raises(ModelLoadError, match="needs about .* GB of memory"):
        load_model(ModelSpec(source=str(path)))


def test_a_damaged_file_is_refused_with_a_reason_and_nothing_crashes(tmp_path: Path, brisk_data_dir: Path) -> None:
    from engine.model import gguf_model
    from engine.model.source import ModelLoadError

    path, _ = tiny_gguf(tmp_path, "qwen2", 12)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 5000])  # the last tensors' blocks missing
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(ModelSpec(source=str(cut)))
    file = gguf_model.read_header(path)
    file.metadata["qwen2.block_count"] = "many"  # a value of the wrong type: predicted as unknown, no crash
    file.metadata["qwen2.attention.head_count"] = [4, 4]
    assert gguf_model.predict_bytes(file, 100)["kv"] == 0
    name = next(iter(file.tensors))
    file.tensors[name] = ((0, 256), 12, file.tensors[name][2])
    with pytest.raises(ModelLoadError, match="shape"):
        gguf_model.check(file)
