"""The model library: models found where LM Studio, Ollama, GPT4All and the Hugging Face cache keep them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.library import scan as library_scan
from engine.library.scan import drafts_for, lookup, scan
from engine.model.headers import HeaderError, describe, fingerprint
from engine.model.source import bundled_model_path
from tests.support.brisk_cli import brisk
from tests.support.model_library import build_library, hf_cache_add_folder, link_or_copy, write_gguf
from tests.support.tiny import make_tiny_model

REQUIRED = {
    "path",
    "source",
    "architecture",
    "format",
    "quant",
    "size_bytes",
    "memory_bytes",
    "fast_path",
    "native_step",
}


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny Llamas with the same tokenizer: 4 layers (the target) and 1 layer (a draft)."""
    big = make_tiny_model(tmp_path_factory.mktemp("big"), seed=1, layers=4, hidden=96)
    small = make_tiny_model(tmp_path_factory.mktemp("small"), seed=2, layers=1, hidden=64)
    return big, small


def test_gguf_headers_are_read_without_loading() -> None:
    facts = describe(bundled_model_path())
    assert (facts.format, facts.architecture, facts.quant) == ("gguf", "llama", "Q4_1")
    assert facts.parameters == 134_515_008  # SmolLM2-135M: embedding 49,152 x 576 and 30 layers
    assert facts.embedding_parameters == 49_152 * 576 and facts.tied
    assert (facts.layers, facts.context, facts.kv_width) == (30, 8192, 3 * 64)
    assert facts.tokenizer and facts.chat_template and not facts.problem
    assert facts.vocab.startswith("49152:")


def test_folder_headers_match_the_loaded_model(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    facts = describe(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert facts.parameters == sum(p.numel() for p in model.parameters())
    assert facts.architecture == "llama" and facts.format == "safetensors" and facts.quant == "F32"
    by_id = sorted((i, t) for t, i in tokenizer.get_vocab().items())
    assert facts.vocab == fingerprint(by_id)
    assert facts.tokenizer and facts.chat_template and not facts.problem


def test_gguf_quant_architecture_and_problems(tmp_path: Path) -> None:
    tokens = [f"w{i}" for i in range(40)]
    q = describe(write_gguf(tmp_path / "q.gguf", "qwen2", tokens, file_type=15))
    assert (q.architecture, q.quant, q.problem) == ("qwen2", "Q4_K_M", "")
    assert q.vocab == fingerprint(enumerate(tokens))
    rwkv = describe(write_gguf(tmp_path / "r.gguf", "rwkv6", tokens))
    assert "rwkv6" in rwkv.problem and "cannot read" in rwkv.problem
    bare = describe(write_gguf(tmp_path / "b.gguf", "llama", tokens, chat_template=None))
    assert "chat template" in bare.problem
    data = (tmp_path / "q.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:200])
    with pytest.raises(HeaderError, match="truncated|damaged"):
        describe(tmp_path / "cut.gguf")
    (tmp_path / "text.gguf").write_text("not a model at all, just some text")
    with pytest.raises(HeaderError, match="not a GGUF"):
        describe(tmp_path / "text.gguf")


def test_folder_problems_are_said_before_loading(tiny_dir: Path, tmp_path: Path) -> None:
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        link_or_copy(tiny_dir / name, no_tok / name)
    assert "no tokenizer" in describe(no_tok).problem
    mlx = tmp_path / "mlx"
    mlx.mkdir()
    for p in tiny_dir.iterdir():
        link_or_copy(p, mlx / p.name)
    config = json.loads((tiny_dir / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    (mlx / "config.json").unlink()
    (mlx / "config.json").write_text(json.dumps(config))
    assert "MLX" in describe(mlx).problem
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "no weights" in describe(empty).problem


def test_scan_finds_models_of_every_app(library_home: Path, tiny_dir: Path) -> None:
    paths = build_library(library_home, tiny_dir)
    library = scan([str(paths["mine_root"])])
    by_name = {e.name: e for e in library.entries}
    sources = {e.source for e in library.entries}
    assert sources == {"bundled", "huggingface", "lmstudio", "gpt4all", "ollama", "folder"}
    assert by_name["Org/tiny-chat"].path == str(paths["hf_folder"])
    assert by_name["Org/qwen-GGUF/qwen-q4_k_m.gguf"].quant == "Q4_K_M"
    assert not any("mmproj" in e.path or "00002-of" in e.path for e in library.entries)
    lms = by_name["bartowski/SmolLM2-GGUF/SmolLM2-135M-Instruct-Q4_1"]
    assert (lms.source, lms.architecture, lms.quant, lms.fast_path) == ("lmstudio", "llama", "Q4_1", True)
    assert lms.memory_bytes["fp16-cpu"] < lms.memory_bytes["none"] and "fp16-cpu" in lms.fits
    # a 4-bit GGUF's layers stay in 4 bits in q8-cpu: 0.5 byte a weight fewer than 8 bits
    layers = lms.parameters - 49152 * 576  # the bundled model's embedding (tied: the head is its own layer)
    assert lms.memory_bytes["fp16-cpu"] - lms.memory_bytes["q8-cpu"] == pytest.approx(
        0.75 * lms.parameters + 0.5 * layers, rel=0.01
    )
    assert by_name["smollm2:135m"].parameters == 134_515_008
    assert "ollama pull ghost:latest" in by_name["ghost:latest"].problem
    assert "rwkv6" in by_name["rwkv"].problem
    assert by_name["my-models/deep/tiny"].source == "folder" and by_name["my-models/deep/tiny"].path == str(
        paths["mine"]
    )
    for entry in library.entries:
        assert set(entry.to_json()) >= REQUIRED
    assert lookup("org/TINY-chat", library) is by_name["Org/tiny-chat"]
    assert lookup("SmolLM2-135M-Instruct-Q4_1.gguf", library) is lms


def test_second_scan_reads_no_headers_until_a_model_changes(library_home: Path, tiny_dir: Path) -> None:
    paths = build_library(library_home, tiny_dir)
    first = scan([str(paths["mine_root"])])
    assert first.described >= 7
    again = scan([str(paths["mine_root"])])
    assert again.described == 0
    assert [e.to_json() for e in again.entries] == [e.to_json() for e in first.entries]
    write_gguf(paths["gpt4all"], "qwen2", [f"w{i}" for i in range(40)])  # replaced by another model
    changed = scan([str(paths["mine_root"])])
    assert changed.described == 1
    assert next(e for e in changed.entries if e.path == str(paths["gpt4all"])).architecture == "qwen2"


def test_a_damaged_library_cache_is_read_again(library_home: Path, tiny_dir: Path, brisk_data_dir: Path) -> None:
    build_library(library_home, tiny_dir)
    first = scan()
    cache = brisk_data_dir / "cache" / "library.json"
    cache.write_text('{"version": 1, "models": [1, 2')
    again = scan()
    assert again.described == first.described
    assert [e.name for e in again.entries] == [e.name for e in first.entries]


def test_a_model_bigger_than_memory_says_so(
    library_home: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_library(library_home, tiny_dir)
    monkeypatch.setattr(library_scan, "available_memory", lambda: 64 << 20)
    entry = next(e for e in scan(remember=False).entries if e.source == "bundled")
    assert entry.fits == []
    assert "Needs about" in entry.problem and "free" in entry.problem


def test_drafts_share_the_vocabulary_and_are_smaller(library_home: Path, tiny_pair: tuple[Path, Path]) -> None:
    big, small = tiny_pair
    hub = Path(os.environ["HF_HUB_CACHE"])
    hf_cache_add_folder(hub, "Org/big", big)
    hf_cache_add_folder(hub, "Org/small", small)
    library = scan()
    target = lookup("Org/big", library)
    assert target is not None
    assert [e.name for e in drafts_for(target, library)] == ["Org/small"]
    small_entry = lookup("Org/small", library)
    assert small_entry is not None and drafts_for(small_entry, library) == []
    bundled = next(e for e in library.entries if e.source == "bundled")
    assert drafts_for(bundled, library) == []  # another vocabulary


def test_cli_lists_uses_and_chats_with_a_listed_model(library_home: Path, tiny_dir: Path, brisk_data_dir: Path) -> None:
    build_library(library_home, tiny_dir)
    listed = brisk("models", "--json", data_dir=str(brisk_data_dir))
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {r["name"] for r in rows} >= {"Org/tiny-chat", "smollm2:135m", "ghost:latest"}
    assert all(set(r) >= REQUIRED for r in rows)
    table = brisk("models", data_dir=str(brisk_data_dir))
    assert "Org/tiny-chat" in table.stdout and "ollama pull ghost:latest" in table.stdout
    refused = brisk("models", "use", "ghost:latest", data_dir=str(brisk_data_dir))
    assert refused.returncode != 0 and "missing" in refused.stderr
    used = brisk("models", "use", "Org/tiny-chat", data_dir=str(brisk_data_dir))
    assert used.returncode == 0, used.stderr
    settings = json.loads((brisk_data_dir / "settings.json").read_text())
    assert settings["model"].endswith("snapshots/" + "a" * 40)
    reply = brisk(
        "--model", "Org/tiny-chat", "ask", "hello", "--max-tokens", "4", "--json", data_dir=str(brisk_data_dir)
    )
    assert reply.returncode == 0, reply.stderr
    done = [json.loads(line) for line in reply.stdout.splitlines() if '"done"' in line]
    assert done and done[-1]["metrics"]["completion_tokens"] >= 1
