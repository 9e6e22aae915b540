"""Read-only views of one chat row as the user sees it, for the window's callers and the tests.

:class:`MessageHandle` (returned by ``ChatView.bubble`` / ``bubbles`` and when
a turn is added) reads its item each time it is asked, so it always shows the
row now: ``plain_text``, ``tooltip``, and the parts ``stats``, ``notice``,
``error``, ``badge`` (the answer-cache badge), ``thinking`` (a thinking model's line, and its text when
open), ``tools`` (the tool section's
header and lines), ``sources`` (the documents a reply drew on: "Sources: …")
and ``content`` (the rendered HTML).  Each part answers
``text()`` and ``isVisible()`` like the ``QLabel`` it stands for.  Nothing
here changes the conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.views.chat_model import ChatItem
from app.views.message_geometry import thinking_title


class _View(Protocol):
    """What a handle reads from the chat view (``ChatView`` is one)."""

    @property
    def colour_drafts(self) -> bool: ...

    def tooltip_for(self, message_id: int) -> str: ...


class _Part:
    """One part of a message as shown (stats line, notice, error, content)."""

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read

    def text(self) -> str:
        return self._read()

    def isVisible(self) -> bool:  # noqa: N802 (like the QLabel it stands for)
        return bool(self._read())

    def openExternalLinks(self) -> bool:  # noqa: N802
        return False  # links open only through the delegate's web-only handler


class MessageHandle:
    """A read-only view of one row: what the user sees of that message now."""

    def __init__(self, view: _View, item: ChatItem) -> None:
        self._view, self._item = view, item
        self.role, self.message_id = item.role, item.message_id
        self.stats = _Part(lambda: item.stats)
        self.notice = _Part(lambda: item.notice)
        self.error = _Part(lambda: item.error)
        self.badge = _Part(lambda: item.badge)
        self.thinking = _Part(lambda: self._thinking())
        self.tools = _Part(lambda: item.tools_header + "\n" + item.tools_text if item.tool_calls else "")
        self.sources = _Part(lambda: item.sources_text)
        self.content = _Part(lambda: item.html(view.colour_drafts))

    def _thinking(self) -> str:
        item = self._item
        if not item.thinking_header:
            return ""
        return thinking_title(item) + ("\n" + item.thinking if item.thinking_open else "")

    @property
    def plain_text(self) -> str:
        return self._item.text

    @property
    def tooltip(self) -> str:
        return self._view.tooltip_for(self.message_id)
