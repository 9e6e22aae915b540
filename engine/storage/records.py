"""The history's records as plain frozen values: a conversation, a project, a message, a search hit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    system_prompt: str
    created: float
    updated: float
    # the sampling values set for this chat alone, as saved (engine.storage.params reads them); {}: the defaults
    params: dict[str, Any] = field(default_factory=dict)
    # the documents attached to this chat (engine.storage.chat_documents: {id, name, path, chars, tokens}); [] none
    documents: list[dict[str, Any]] = field(default_factory=list)
    # a branch's parent chat and the parent's message it was branched after (None: a chat of its own, or one
    # whose parent was deleted; ``branched_after`` is also None for a branch made before any message)
    parent_id: str | None = None
    branched_after: int | None = None
    project_id: str | None = None  # the project the chat is in (None: none)


@dataclass(frozen=True)
class Project:
    """A folder of chats: a new chat in it starts with its system prompt, sampling values and documents."""

    id: str
    name: str
    system_prompt: str
    created: float
    updated: float
    params: dict[str, Any] = field(default_factory=dict)  # sampling values, as a chat's own (engine.storage.params)
    documents: list[dict[str, Any]] = field(default_factory=list)  # engine.storage.chat_documents entries


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: str
    role: str
    content: str
    status: str
    metrics: dict[str, Any]
    created: float
    damaged: bool = False  # the row could not be read as written; the fields hold what could be
    version: int = 1  # which of the message's versions this is (a reply asked for again has several), from 1
    versions: int = 1  # how many versions the message has; the message row holds the one shown


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    message_id: int | None  # None when the conversation's title matched
    title: str
    snippet: str
