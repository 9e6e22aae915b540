"""Earlier answers from the saved history, to seed the engine's answer memory (no Qt).

The engine drafts from earlier answers to similar questions ("Earlier answers"
speculative source), but it only remembers what it answered since it started.
:func:`answer_pairs` reads the store for the most recent ``limit``
(question, answer) pairs: a user message immediately followed by an assistant
reply that finished normally (status ``done``, not empty).  They come oldest
first, so the newest answers end up most recent in the engine's memory.
:meth:`app.bridge.EngineBridge.seed_answers` hands them to the engine.

Conversations are read most recently updated first, and reading stops once no
older conversation can hold a pair newer than those already kept: a
conversation's ``updated`` is never earlier than any of its messages.
:class:`~engine.storage.StoreError` propagates to the caller.
"""

from __future__ import annotations

from engine.storage import Message, Store

SEED_LIMIT = 200


def pairs_in(messages: list[Message]) -> list[tuple[Message, Message]]:
    """(user message, assistant reply) pairs of one conversation, in order."""
    pairs: list[tuple[Message, Message]] = []
    turns = [m for m in messages if m.role in ("user", "assistant")]
    for question, answer in zip(turns, turns[1:], strict=False):
        if (
            question.role == "user"
            and answer.role == "assistant"
            and answer.status == "done"
            and question.content.strip()
            and answer.content.strip()
        ):
            pairs.append((question, answer))
    return pairs


def answer_pairs(store: Store, limit: int = SEED_LIMIT) -> list[tuple[str, str]]:
    """The newest ``limit`` finished (question, answer) pairs in ``store``, oldest first."""
    if limit <= 0:
        return []
    found: list[tuple[Message, Message]] = []
    for conversation in store.list_conversations():  # most recently updated first
        if len(found) >= limit:
            found = _newest(found, limit)
            if conversation.updated < found[-1][1].created:
                break
        found.extend(pairs_in(store.messages(conversation.id)))
    kept = _newest(found, limit)
    return [(q.content, a.content) for q, a in reversed(kept)]


def _newest(pairs: list[tuple[Message, Message]], limit: int) -> list[tuple[Message, Message]]:
    return sorted(pairs, key=lambda p: (p[1].created, p[1].id), reverse=True)[:limit]
