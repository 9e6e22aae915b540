"""The context meter under the composer: how much of the model's context the open chat fills (no Qt).

After a reply the chat holds its prompt and its reply: ``prompt_tokens + completion_tokens`` of the last
reply the model computed (a reply from the answer cache reads no prompt and says nothing about it).
Documents attached to the chat count too, and the meter shows their share (:func:`usage`, :func:`meter_text`):
the reply's ``document_tokens`` are what its prompt held of them (whole texts and searched passages, which its
``sources`` tell apart).  While the chat's documents are the ones that reply read, its measured count stands;
once one is attached or detached (or before the first reply) the documents that go whole count with their
chips' tokens (an estimate, "≈", until the loaded model counted them), at once, not after the next reply.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.state.attachments import APPROX, documents_tokens, estimated_tokens, is_passage, sources_of, tokens_of

TIP = "Tokens the open chat fills (system prompt, messages, replies) of the model's context"


def last_computed(metrics: Iterable[Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """The metrics of the last reply the model computed (``metrics`` oldest first), None when none was."""
    for m in reversed(list(metrics)):
        prompt = (m or {}).get("prompt_tokens")
        if m is not None and isinstance(prompt, int) and prompt > 0:
            return m
    return None


def tokens_in_chat(metrics: Iterable[Mapping[str, Any] | None]) -> int | None:
    """Tokens the chat fills after its last computed reply (``metrics`` oldest first), None when none was."""
    m = last_computed(metrics)
    return None if m is None else _filled(m)


def _filled(m: Mapping[str, Any]) -> int:
    """Tokens a computed reply's chat holds after it: its prompt and its reply."""
    completion = m.get("completion_tokens")
    return int(m["prompt_tokens"]) + (completion if isinstance(completion, int) else 0)


def _read_tokens(m: Mapping[str, Any] | None) -> int:
    read = (m or {}).get("document_tokens")
    return read if isinstance(read, int) and not isinstance(read, bool) and read > 0 else 0


@dataclass(frozen=True)
class Usage:
    """What the open chat fills of the model's context, in parts (tokens)."""

    chat: int | None  # the system prompt, the messages and the replies; None before a reply
    whole: int = 0  # attached documents that go whole into the prompt
    passages: int = 0  # passages searched from the documents too long to go whole (the last reply's)
    estimated: bool = False  # a part is an estimate (a document the loaded model has not counted)
    searched: int = 0  # attached documents searched for passages (their passages: one set per question)

    @property
    def documents(self) -> int:
        return self.whole + self.passages

    @property
    def total(self) -> int | None:
        if self.chat is None and not self.documents:
            return None
        return (self.chat or 0) + self.documents


def usage(
    metrics: Iterable[Mapping[str, Any] | None],
    docs: Sequence[Mapping[str, Any]],
    skip: Collection[str] = (),
    searched: Collection[str] = (),
) -> Usage:
    """The open chat's parts of the context: ``metrics`` of its replies (oldest first), ``docs`` its attached
    documents; ``skip``: ids not sent (gone from the index); ``searched``: ids searched for passages."""
    last = last_computed(metrics)
    sent = [d for d in docs if d.get("id") not in skip]
    whole_docs = [d for d in sent if d.get("id") not in searched]
    searched_now = len(sent) - len(whole_docs)
    whole_now, estimated = documents_tokens(whole_docs)
    if last is None:
        return Usage(None, whole_now, 0, estimated, searched_now)
    used = _filled(last)
    read = _read_tokens(last)
    if not read:  # the reply read no document: those attached now were attached after it
        return Usage(used, whole_now, 0, estimated, searched_now)
    chat = max(0, used - read)
    sources = sources_of(last)
    if not sources:  # stored without its sources: the whole documents count as attached now, the rest passages
        passages = max(0, read - whole_now) if searched_now else 0
        return Usage(chat, whole_now, passages, estimated, searched_now)
    read_whole = {s["doc_id"] for s in sources if not is_passage(s)}
    whole_read, passages_read = _split(sources, read, read_whole, docs)
    passages = passages_read if searched_now else 0
    if read_whole == {d.get("id") for d in whole_docs}:  # the documents that reply read: its count stands
        return Usage(chat, whole_read, passages, False, searched_now)
    return Usage(chat, whole_now, passages, estimated, searched_now)  # attached or detached since: at once


def _split(
    sources: Sequence[Mapping[str, Any]], read: int, read_whole: set[str], docs: Sequence[Mapping[str, Any]]
) -> tuple[int, int]:
    """A reply's ``read`` document tokens as (whole texts, searched passages)."""
    passages_read = [s for s in sources if is_passage(s)]
    if not passages_read:
        return read, 0
    if not read_whole:
        return 0, read
    by_id = {d.get("id"): d for d in docs}
    if read_whole <= by_id.keys():  # the whole texts' counts are known: the rest was passages
        passages = read - sum(tokens_of(by_id[i]) for i in read_whole)
    else:  # a document read whole was detached since: the passages' own length tells
        passages = sum(estimated_tokens(int(s.get("end") or 0) - int(s.get("start") or 0)) for s in passages_read)
    passages = max(0, min(read, passages))
    return read - passages, passages


def context_text(used: int | None, context_length: int, estimated: bool = False) -> str:
    """``Context: 1,234 of 8,192 tokens (15 %)``; ``Context: empty`` before a reply; the count alone when
    the model's context length is unknown (a remote server); ``≈`` before an ``estimated`` count."""
    if used is None:
        return "Context: empty" if context_length else ""
    about = APPROX if estimated else ""
    if not context_length:
        return f"Context: {about}{used:,} tokens"
    return f"Context: {about}{used:,} of {context_length:,} tokens ({100 * used / context_length:.0f} %)"


def meter_text(parts: Usage, context_length: int) -> str:
    """:func:`context_text` of the whole; once the chat holds more than its documents, their share in place of
    the percentage (which the tooltip keeps), short enough for a narrow window:
    ``Context: 3,900 of 8,192 tokens (documents 3,012)``.  Before a reply the count is all documents."""
    if not parts.documents or parts.chat is None:
        return context_text(parts.total, context_length, parts.estimated)
    total = parts.total or 0
    about = APPROX if parts.estimated else ""
    of = f" of {context_length:,}" if context_length else ""
    return f"Context: {about}{total:,}{of} tokens (documents {parts.documents:,})"


def meter_tip(parts: Usage, context_length: int) -> str:
    """The meter's tooltip: what it counts and, with documents attached, each part."""
    if not parts.documents and not parts.searched:
        return TIP
    about = APPROX if parts.estimated else ""
    lines = [f"{context_text(parts.total, context_length, parts.estimated)}, of which:"]
    if parts.chat is None:
        lines.append("\u2022 System prompt and messages: counted after the first reply")
    else:
        lines.append(f"\u2022 System prompt and messages: {parts.chat:,}")
    lines.append(f"\u2022 Documents, whole: {about}{parts.whole:,}")
    if parts.searched:
        if parts.passages:
            lines.append(f"\u2022 Documents, searched passages: {parts.passages:,} (the last reply's)")
        else:
            lines.append("\u2022 Documents, searched passages: chosen for each question")
        noun = "document is" if parts.searched == 1 else "documents are"
        lines.append(f"{parts.searched:,} {noun} too long to go whole: each question gets the passages it needs.")
    return "\n".join(lines)
