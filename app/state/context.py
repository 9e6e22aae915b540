"""The context meter under the composer: how much of the model's context the open chat fills (no Qt).

After a reply the chat holds its prompt and its reply: ``prompt_tokens + completion_tokens`` of the last
reply the model computed (a reply from the answer cache reads no prompt and says nothing about it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def tokens_in_chat(metrics: Iterable[Mapping[str, Any] | None]) -> int | None:
    """Tokens the chat fills after its last computed reply (``metrics`` oldest first), None when none was."""
    for m in reversed(list(metrics)):
        prompt = (m or {}).get("prompt_tokens")
        if isinstance(prompt, int) and prompt > 0:
            completion = (m or {}).get("completion_tokens")
            return prompt + (completion if isinstance(completion, int) else 0)
    return None


def context_text(used: int | None, context_length: int) -> str:
    """``Context: 1,234 of 8,192 tokens (15 %)``; ``Context: empty`` before a reply; the count alone when
    the model's context length is unknown (a remote server)."""
    if used is None:
        return "Context: empty" if context_length else ""
    if not context_length:
        return f"Context: {used:,} tokens"
    return f"Context: {used:,} of {context_length:,} tokens ({100 * used / context_length:.0f} %)"
