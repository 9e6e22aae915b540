"""Chat messages to prompt token ids, fitted to the model's context.

``build_prompt`` renders messages with the model's own chat template and
tokenises the text.  When prompt plus ``max_tokens`` would not fit the context,
it keeps the system prompt and the most recent turns that fit, and when the
last message alone is too long it keeps the start of it; ``truncated`` says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from engine.model.kv import common_prefix


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    truncated: bool
    system_tokens: int  # length of the system prompt's own token prefix (0 if none)


def render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@functools.lru_cache(maxsize=16)
def _system_ids(tokenizer: Any, content: str) -> tuple[int, ...]:
    """The system message alone, rendered and tokenised (the same few system prompts recur)."""
    text = tokenizer.apply_chat_template([{"role": "system", "content": content}], tokenize=False)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def system_prefix_tokens(tokenizer: Any, messages: list[dict[str, str]], ids: list[int]) -> int:
    """Number of leading prompt tokens that belong to the system message."""
    if not messages or messages[0]["role"] != "system":
        return 0
    sys_ids = list(_system_ids(tokenizer, messages[0]["content"]))
    return common_prefix(sys_ids, ids)


def build_prompt(tokenizer: Any, messages: list[dict[str, str]], context: int, max_tokens: int) -> Prompt:
    if not messages or not messages[-1].get("content", "").strip():
        raise ValueError("The message is empty. Type something to send.")
    budget = context - min(max_tokens, context // 2)
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    ids = render(tokenizer, messages)
    truncated = False
    while len(ids) > budget and len(turns) > 1:
        turns = turns[1:]
        while len(turns) > 1 and turns[0]["role"] != "user":
            turns = turns[1:]
        ids, truncated = render(tokenizer, system + turns), True
    if len(ids) > budget:
        last = turns[-1]
        content_ids = tokenizer(last["content"], add_special_tokens=False)["input_ids"]
        overflow = len(ids) - budget
        keep = len(content_ids) - overflow
        if keep < 1:
            raise ValueError("The system prompt alone is longer than the model's context. Shorten it in Settings.")
        cut = {"role": last["role"], "content": tokenizer.decode(content_ids[:keep])}
        turns = turns[:-1] + [cut]
        ids, truncated = render(tokenizer, system + turns), True
        while len(ids) > budget and keep > 1:  # re-tokenisation can differ slightly at the cut
            keep = max(1, keep - (len(ids) - budget) - 1)
            cut = {"role": last["role"], "content": tokenizer.decode(content_ids[:keep])}
            ids = render(tokenizer, system + turns[:-1] + [cut])
    return Prompt(ids, truncated, system_prefix_tokens(tokenizer, system + turns, ids))
