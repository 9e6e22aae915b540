"""Model resolution and loading: the bundled GGUF, conversion cache, and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.api import ModelSpec
from engine.model.loader import ModelLoadError, bundled_model_path, converted_dir, load_model


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(ModelSpec(source=str(tmp_path / "nope.gguf")))


def test_non_model_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("these are not weights")
    with pytest.raises(ModelLoadError, match="not a GGUF model"):
        load_model(ModelSpec(source=str(bogus)))


def test_truncated_gguf_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with bundled_model_path().open("rb") as fh:
        cut.write_bytes(fh.read(3 << 20))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(ModelSpec(source=str(cut)))


def test_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(ModelSpec(source=str(tmp_path)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_says_so(tiny_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="CUDA"):
        load_model(ModelSpec(source=str(tiny_dir), device="cuda"))


def test_unknown_dtype_is_refused(tiny_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model(ModelSpec(source=str(tiny_dir), dtype="float8"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp16_cpu_with_another_precision_is_refused_with_what_to_do(tiny_dir: Path, dtype: str) -> None:
    with pytest.raises(ModelLoadError, match="set Precision to auto or float32"):
        load_model(ModelSpec(source=str(tiny_dir), dtype=dtype, quant="fp16-cpu"))
    loaded = load_model(ModelSpec(source=str(tiny_dir), dtype="float32", quant="fp16-cpu"))
    assert loaded.quant == "fp16-cpu" and loaded.dtype == torch.float32


@pytest.mark.parametrize(("dtype", "mode"), [("float32", "none"), ("float32", "fp16-cpu"), ("bfloat16", "int8-cpu")])
def test_parameter_count_is_the_checkpoint_s_whatever_holds_the_weights(tiny_dir: Path, dtype: str, mode: str) -> None:
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_dir)
    expected = sum(p.numel() for p in plain.parameters())  # the tied head counts once
    loaded = load_model(ModelSpec(source=str(tiny_dir), dtype=dtype, quant=mode))
    if mode == "none":
        assert loaded.info["packed_linears"] > 0  # float32 on the CPU: packed, weights out of parameters()
    assert sum(p.numel() for p in loaded.model.parameters()) < expected  # what hid them before
    assert loaded.info["parameters"] == expected


def test_tiny_model_folder_loads_with_eos_and_template(tiny_dir: Path) -> None:
    loaded = load_model(ModelSpec(source=str(tiny_dir), dtype="bfloat16"))
    assert loaded.eos_ids == {2}
    assert loaded.dtype == torch.bfloat16
    assert loaded.context_length == 512


def test_bundled_gguf_is_converted_once(bundled_engine) -> None:  # noqa: ANN001
    # bundled_engine has loaded (and so converted) the bundled model in this session's data folder
    target = converted_dir(bundled_model_path(), lambda _f, _m: None)
    weights = target / "model.safetensors"
    before = weights.stat().st_mtime_ns
    loaded = load_model(ModelSpec())
    assert weights.stat().st_mtime_ns == before, "the cached conversion must be reused, not rewritten"
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.eos_ids
    assert loaded.load_s > 0  # how fast is the foundation benchmark's business, not a test's


@pytest.fixture(scope="module")
def plain_bundled() -> dict[str, torch.Tensor]:
    """transformers' own float32 load of the bundled GGUF (its state dict), made once for the tests that compare
    a conversion with it."""
    from transformers import AutoModelForCausalLM

    gguf = bundled_model_path()
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).state_dict()


def _parse(part: object, types: list[int]) -> object:
    from transformers.integrations.ggml import _gguf_parse_value

    return _gguf_parse_value(part, list(types))


def test_the_one_read_conversion_gives_transformers_own_tensors(
    bundled_engine,  # noqa: ANN001
    plain_bundled: dict[str, torch.Tensor],
) -> None:
    """``gguf_read_once`` memoises the file's parse and the name maps: the weights must be those of a plain load."""
    import gguf
    import gguf.gguf_reader as reader_module
    import numpy as np
    from safetensors.torch import load_file

    from engine.model.source import gguf_read_once

    reader, name_map, dequantize = gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize
    gguf_path = bundled_model_path()
    with gguf_read_once():
        fast = gguf.GGUFReader(gguf_path)
        assert fast is gguf.GGUFReader(gguf_path), "parsed once"
        assert not isinstance(fast.data, np.memmap) and fast.data.nbytes == gguf_path.stat().st_size, "in memory"
        theirs = reader(gguf_path)  # gguf's own reader: the fast one must give what it gives
        assert list(fast.fields) == list(theirs.fields)
        for name, field in theirs.fields.items():
            mine = fast.fields[name]
            assert [_parse(mine.parts[i], mine.types) for i in mine.data] == [
                _parse(field.parts[i], field.types) for i in field.data
            ], name
        assert len(fast.tensors) == len(theirs.tensors)
        for mine, their in zip(fast.tensors, theirs.tensors, strict=True):
            assert (mine.name, mine.tensor_type, mine.n_bytes, mine.data_offset) == (
                their.name,
                their.tensor_type,
                their.n_bytes,
                their.data_offset,
            )
            assert list(mine.shape) == list(their.shape) and mine.data.dtype == their.data.dtype
            assert np.array_equal(mine.data, their.data), mine.name
            # transformers' torch kernels de-quantize to the same float32 values as gguf's numpy ones
            assert np.array_equal(
                gguf.dequantize(mine.data, mine.tensor_type), dequantize(their.data, their.tensor_type)
            )
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == (reader, name_map, dequantize), "put back"
    assert reader_module.np is np and isinstance(gguf.GGUFReader(gguf_path).data, np.memmap)

    import transformers.integrations.gguf.reader as tf_reader
    import transformers.modeling_gguf_pytorch_utils as tf_utils

    before = (tf_reader._mapped, tf_reader.read_gguf_metadata, tf_utils.load_gguf_checkpoint)
    with gguf_read_once():  # transformers' own reading: memoised, and each caller gets its own copy
        assert tf_reader.read_gguf_metadata is not before[1]
        first = tf_utils.load_gguf_checkpoint(str(gguf_path))
        first["config"]["changed_by_a_caller"] = True
        assert "changed_by_a_caller" not in tf_utils.load_gguf_checkpoint(str(gguf_path))["config"]
    assert (tf_reader._mapped, tf_reader.read_gguf_metadata, tf_utils.load_gguf_checkpoint) == before

    converted = load_file(converted_dir(gguf_path, lambda _f, _m: None) / "model.safetensors")
    expected = plain_bundled
    assert set(converted) <= set(expected) and len(converted) >= len(expected) - 1  # tied lm_head saved once
    different = [name for name, tensor in converted.items() if not torch.equal(tensor, expected[name])]
    assert different == []

    from transformers import AutoTokenizer

    mine = AutoTokenizer.from_pretrained(converted_dir(gguf_path, lambda _f, _m: None))
    theirs = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert len(mine) == len(theirs) and mine.chat_template == theirs.chat_template
    for text in ("Hello, world!", "Ünïcödé  spaces\n\ttabs 12345", "<|im_start|>user\nHi<|im_end|>"):
        assert mine(text)["input_ids"] == theirs(text)["input_ids"], text


@pytest.mark.bundled
def test_a_fresh_conversion_loads_from_memory_while_its_copy_is_written(
    brisk_data_dir: Path, monkeypatch: pytest.MonkeyPatch, plain_bundled: dict[str, torch.Tensor]
) -> None:
    """The first start chats on the model the conversion just read; its copy is written behind it, equal to a
    plain transformers load of the GGUF, and a later load reads the copy under the same identity."""
    from safetensors.torch import load_file

    from engine.model import loader, source

    calls: list[str] = []

    def spying(location: str) -> source.Fresh | None:
        fresh = source.take_fresh(location)
        calls.append("memory" if fresh is not None else "disk")
        return fresh

    monkeypatch.setattr(loader, "take_fresh", spying)
    first = load_model(ModelSpec(quant="none", dtype="float32"))
    target = Path(first.source)
    source.wait_written(str(target))
    second = load_model(ModelSpec(quant="none", dtype="float32"))
    assert calls == ["memory", "disk"]
    assert first.identity == second.identity  # the copy on disk is the same weights as far as caches know
    written = load_file(target / "model.safetensors")
    plain = plain_bundled
    assert set(written) == set(plain) - {"lm_head.weight"}  # the tied head is written once, as the embedding
    for name, tensor in written.items():
        assert torch.equal(tensor, plain[name]), name
    assert not list(target.parent.glob(f"{target.name}.tmp-*")), "no temporary folder left"
