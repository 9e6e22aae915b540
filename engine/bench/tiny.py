"""Tiny models for benchmarks and tests: a byte-level tokenizer with a ChatML template, and small GGUF files.

``brisk bench models`` saves tiny random models of each architecture with it, and
the tests (``tests/support/tiny.py``) do the same: every byte is a token, so any
text encodes, and the three special tokens end turns as a chat model's do.
:func:`write_gguf` writes a small GGUF file whose header says what a test or the
library benchmark needs (architecture, quantization, tokens, chat template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]


def make_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHATML
    return fast


def write_gguf(
    path: Path,
    arch: str = "qwen2",
    tokens: list[str] | None = None,
    chat_template: str | None = CHATML,
    file_type: int = 15,
    layers: int = 2,
    hidden: int = 64,
) -> Path:
    """A small GGUF file with the metadata llama.cpp writes (architecture, sizes, tokenizer, file type) and
    float32 tensors of the shapes it names: loadable headers, not a useful model."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = tokens if tokens is not None else [f"t{i}" for i in range(32)]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(file_type)
    if tokens:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
    if chat_template:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", np.zeros((max(len(tokens), 1), hidden), dtype=np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((hidden, hidden), dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((hidden * 2, hidden), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sharpen(model: Any) -> Any:
    """Random weights made sharper than the default initialisation (matrices times 4) and norm weights made
    random too, so that greedy choices are not near ties and no part of the model is the identity."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(4.0)
            elif "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


# Byte offsets of the float16 steps in blocks of the K formats and IQ4_NL, which gguf cannot quantize to:
# random blocks with these steps set stand in for quantized weights (their values are what gguf de-quantizes)
RANDOM_BLOCK_STEPS = {10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,), 20: (0,)}


def gguf_blocks(weight: np.ndarray, qtype: int, rng: np.random.Generator) -> np.ndarray:
    """``weight`` [out, in] float32 as blocks of ggml type ``qtype``: quantized by ``gguf`` where it can, else
    random blocks whose steps give weights of about ``weight``'s spread (read them back with
    ``gguf.quants.dequantize``)."""
    import gguf

    kind = gguf.GGMLQuantizationType(qtype)
    if kind == gguf.GGMLQuantizationType.F32:
        return weight.astype(np.float32)
    if kind == gguf.GGMLQuantizationType.F16:
        return weight.astype(np.float16)
    if qtype not in RANDOM_BLOCK_STEPS:
        return gguf.quants.quantize(weight.astype(np.float32), kind)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    out, width = weight.shape
    raw = rng.integers(0, 256, size=(out, width // block, size), dtype=np.uint8)
    spread = float(np.abs(weight).mean()) or 0.01
    levels = {10: 2.0, 11: 4.0 * 32, 12: 8.0 * 32, 13: 16.0 * 32, 14: 32.0 * 64, 20: 127.0}[qtype]
    for offset in RANDOM_BLOCK_STEPS[qtype]:  # steps (and minimums) near spread / levels
        step = (rng.random((out, width // block)) * 0.5 + 0.75) * spread / levels
        raw[:, :, offset : offset + 2] = step.astype(np.float16).view(np.uint8).reshape(out, width // block, 2)
    return raw.reshape(out, -1)


def write_model_gguf(path: Path, model: Any, qtype: int, seed: int = 0) -> dict[str, Any]:
    """``model`` (a transformers Llama or Qwen2 with :func:`make_tokenizer`'s vocabulary) written as a GGUF file
    whose matrices are blocks of ``qtype`` (norms and biases float32), as llama.cpp lays it out (Llama's query
    and key rows permuted for its rotary embedding).  Returns the float32 weights the file holds, by the
    model's parameter names (de-quantized by ``gguf``), for a reference model to load."""
    import gguf

    config = model.config
    arch = {"llama": "llama", "qwen2": "qwen2"}[config.model_type]
    rng = np.random.default_rng(seed)
    tokenizer = make_tokenizer()
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in SPECIAL else 1 for token, _ in vocab])
    writer.add_token_scores([0.0] * len(vocab))
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHATML)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.QWEN2,
                                     int(config.num_hidden_layers))  # fmt: skip
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    weights: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        value = tensor.detach().float().numpy()
        if value.ndim == 1:
            writer.add_tensor(gguf_name, value.astype(np.float32))
            weights[name] = value.astype(np.float32)
            continue
        blocks = gguf_blocks(value, qtype, rng)
        exact = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(qtype)).reshape(value.shape)
        weights[name] = exact.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's row order
            n = heads if "q_proj" in name else kv_heads
            order = np.arange(value.shape[0]).reshape(n, 2, -1).swapaxes(1, 2).reshape(-1)
            blocks = blocks[order]
        if qtype in (0, 1):
            writer.add_tensor(gguf_name, blocks)
        else:
            writer.add_tensor(gguf_name, blocks, raw_dtype=gguf.GGMLQuantizationType(qtype))
    if config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights
