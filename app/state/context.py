"""The context meter under the composer: how much of the model's context the open chat fills (no Qt).

After a reply the chat holds its prompt and its reply: ``prompt_tokens + completion_tokens`` of the last
reply the model computed (a reply from the answer cache reads no prompt and says nothing about it).
Documents attached to the chat count too: before the first reply (or when that reply read none of them,
``document_tokens`` 0: they were attached after it) their tokens are added (:func:`with_documents`), an
estimate ("≈") until the loaded model counted them.
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


def documents_read(metrics: Iterable[Mapping[str, Any] | None]) -> bool:
    """Whether the last computed reply's prompt held attached documents (so ``tokens_in_chat`` counts them)."""
    for m in reversed(list(metrics)):
        prompt = (m or {}).get("prompt_tokens")
        if isinstance(prompt, int) and prompt > 0:
            read = (m or {}).get("document_tokens")
            return isinstance(read, int) and read > 0
    return False


def with_documents(used: int | None, read: bool, documents: int) -> int | None:
    """The chat's tokens with its attached documents' ``documents`` tokens, unless the last reply read them."""
    if not documents or read:
        return used
    return (used or 0) + documents


def context_text(used: int | None, context_length: int, estimated: bool = False) -> str:
    """``Context: 1,234 of 8,192 tokens (15 %)``; ``Context: empty`` before a reply; the count alone when
    the model's context length is unknown (a remote server); ``≈`` before an ``estimated`` count."""
    if used is None:
        return "Context: empty" if context_length else ""
    about = "\u2248 " if estimated else ""
    if not context_length:
        return f"Context: {about}{used:,} tokens"
    return f"Context: {about}{used:,} of {context_length:,} tokens ({100 * used / context_length:.0f} %)"
