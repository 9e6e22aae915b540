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
