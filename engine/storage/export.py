"""A conversation as Markdown: ``to_markdown(conversation, messages)`` (pure; no database).

The title is the heading, then the system prompt, then each message under its
role; a reply that did not finish says so in italics.  A damaged row is
exported as it reads, marked as damaged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.storage.records import Conversation, Message

LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}
STATUS_NOTES = {
    "streaming": "*(unfinished)*",
    "cancelled": "*(stopped before the end)*",
    "error": "*(ended with an error)*",
}
DAMAGED_NOTE = "*(this message was damaged in the history file; shown as it could be read)*"


def to_markdown(conversation: Conversation, messages: Iterable[Message]) -> str:
    parts = ["# " + " ".join(conversation.title.split())]
    if conversation.system_prompt:
        parts.append(f"**System prompt**\n\n{conversation.system_prompt}")
    for message in messages:
        notes = [note for note in (STATUS_NOTES.get(message.status), message.damaged and DAMAGED_NOTE) if note]
        body = "\n\n".join([message.content, *notes])
        label = LABELS.get(message.role, message.role.title() or "Unknown")
        parts.append(f"**{label}**\n\n{body}")
    return "\n\n".join(parts) + "\n"
