"""A token's exact bytes, for what shows single tokens: logprobs (``engine.runtime.decode``) and llama.cpp's
``/tokenize`` (``engine.server.vocab``).

A byte-level BPE vocabulary (GPT-2's table: SmolLM2, Qwen, Llama 3) writes each byte as one printable
character, so a token that holds part of a character maps back to exactly its bytes; any other token
(sentencepiece, special tokens) gives its decoded text as UTF-8.
"""

from __future__ import annotations

import functools
from typing import Any


def piece_bytes(tokenizer: Any, token_id: int) -> bytes:
    """A token's bytes: a byte-level BPE token's characters mapped back to the bytes they stand for (GPT-2's
    table, which SmolLM2, Qwen and Llama 3 use); any other token, its decoded text as UTF-8."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    table = _byte_of()
    if isinstance(token, str) and token and all(c in table for c in token):
        return bytes(table[c] for c in token)
    return str(tokenizer.decode([token_id], skip_special_tokens=False)).encode("utf-8")


@functools.cache
def _byte_of() -> dict[str, int]:
    """GPT-2's byte-to-character table turned round: the character a byte-level BPE vocabulary writes for each
    byte, to that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
