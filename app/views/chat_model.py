"""The conversation as a Qt list model: one row per shown message, nothing else.

:class:`ChatItem` is the plain-Python state of one row: its message id and
role, the plain text (what Copy copies), the grey stats line, the notices
(older turns dropped: which ones, :func:`truncated_notice`; damaged row), the error, an optional tooltip, the
answer-cache badge (``From cache, exact · …``, :func:`~app.state.answer_stats.cache_badge`),
the reply's tool calls (saved as ``metrics["tool_calls"]``; shown as a section
that opens and closes, ``tools_open``), the documents and passages it drew on
(``metrics["sources"]``, :func:`~app.state.attachments.sources_of`), and for a
reply of this session its :class:`~app.state.reply.ReplyState` (so drafted
text keeps its colour), and which of the reply's versions it shows
(``version`` of ``versions``: a reply asked for again keeps each answer).
The rendered HTML is made on demand, the first time a row is painted or
measured, and kept until the row changes; a revision counter tells the delegate when its cached layout is stale.

A message sent while the reply streams is a row of its own until it is sent
(:func:`queued_item`: id ``QUEUED_ID``, greyed, ``QUEUED_NOTICE`` above it).

:class:`ChatModel` changes only through ``beginResetModel``/``endResetModel``
(:meth:`ChatModel.reset`), ``beginInsertRows``/``endInsertRows``
(:meth:`ChatModel.append`), ``beginRemoveRows``/``endRemoveRows``
(:meth:`ChatModel.remove_from`, :meth:`ChatModel.remove`) and ``dataChanged`` (:meth:`ChatModel.touch`,
and :meth:`ChatModel.replace` for another version of a row's message).
It holds strings only: opening 10,000 stored messages costs a list of 10,000
small objects, no widgets and no Markdown.

:func:`item_from_message` turns a stored row into a :class:`ChatItem` (a
damaged row gets a notice, never an exception).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from app.state.answer_stats import cache_badge
from app.state.attachments import sources_of
from app.state.reply import ReplyState, stats_line, thinking_line
from app.state.tools import calls_from_metrics, tools_header, tools_text
from app.views.markdown_render import render_reply, render_user
from app.views.style import current
from engine.documents.render import source_label, source_labels, source_word, sources_line, sources_prefix
from engine.storage import Message

TRUNCATED_NOTICE = "Older turns were dropped to fit the model's context."


def truncated_notice(dropped: object) -> str:
    """What a reply whose prompt left turns out says above it: which turns (``Metrics.dropped``: first and
    last, numbered from 1 after the system prompt), or that some were when that is not known."""
    if not (isinstance(dropped, list | tuple) and len(dropped) == 2 and all(type(n) is int for n in dropped)):
        return TRUNCATED_NOTICE
    first, last = dropped
    turns = f"Turn {first} is" if first == last else f"Turns {first}–{last} are"
    return f"{turns} no longer in the model's context (dropped to fit it; the system prompt and documents are kept)."


QUEUED_NOTICE = "Queued — sends when the reply ends"
QUEUED_ID = -1  # the row of a message sent while the reply streams (not stored yet): always the last row
DAMAGED_NOTICE = "This message was damaged in the history file; what could be read is shown."
ERROR_FALLBACK = "This reply ended with an error."
SHOWN_ROLES = ("user", "assistant")
ITEM_ROLE = Qt.ItemDataRole.UserRole + 1

_Index = QModelIndex | QPersistentModelIndex


@dataclass(eq=False)
class ChatItem:
    message_id: int
    role: str
    text: str = ""
    stats_text: str = ""
    notice: str = ""
    error: str = ""
    tooltip: str = ""
    damaged: bool = False
    badge: str = ""  # the answer-cache hit this reply came from ("" for a generated reply)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # app.state.tools.call_record dicts
    tools_open: bool = False  # the tool section shows each result, not only the calls
    thinking: str = ""  # a thinking model's thinking (metrics["thinking"]), shown collapsed under thinking_header
    thinking_header: str = ""  # app.state.reply.thinking_line: "Thought for 4.2 s (310 tokens), ..."
    thinking_open: bool = False
    sources: list[dict[str, Any]] = field(default_factory=list)  # Metrics.sources: what the reply drew on
    reply: ReplyState | None = None  # a reply of this session: rendered from its segments
    version: int = 1  # the version of the message shown (a reply asked for again has several), from 1
    versions: int = 1  # how many versions the message has
    queued: bool = False  # a message waiting for the reply to end (greyed, QUEUED_NOTICE above it)
    stats_source: tuple[Mapping[str, Any], str, bool] | None = None  # stored (metrics, finish, unfinished)
    revision: int = 0
    html_cache: tuple[int, bool, str] | None = field(default=None, repr=False)  # (revision, colour, html)
    # the delegate's measurements: (revision, width, colour, height, exact) of the content, and
    # ((revision, width, colour, first, last), height) of the whole row
    content_size: tuple[int, int, bool, int, bool] | None = field(default=None, repr=False)
    row_size: tuple[tuple[int, int, bool, bool, bool], int] | None = field(default=None, repr=False)
    answered: tuple[tuple[int, int, bool, bool, bool], int] | None = field(default=None, repr=False)  # row_size given

    @property
    def stats(self) -> str:
        """The grey line under a reply; a stored reply's is formatted the first time it is needed."""
        if self.stats_source is not None:
            metrics, finish, unfinished = self.stats_source
            line = stats_line(metrics, finish)
            self.stats_text = (line + " \u00b7 " if line else "") + "unfinished" if unfinished else line
            self.stats_source = None
        return self.stats_text

    @property
    def cached(self) -> bool:
        return bool(self.badge)

    @property
    def tools_header(self) -> str:
        return tools_header(self.tool_calls, self.tools_open)

    @property
    def tools_text(self) -> str:
        return tools_text(self.tool_calls, self.tools_open)

    @property
    def source_labels(self) -> list[str]:
        return source_labels(self.sources)

    @property
    def sources_prefix(self) -> str:
        """``Sources:``, or ``Given:`` when the reply's text can be tied to none of them."""
        return sources_prefix(self.sources)

    def source_menu_text(self, n: int) -> str:
        """``Source: [1] notes.md, part 3`` or ``Given: handbook.pdf``: the ``n``-th source on its own."""
        return f"{source_word(self.sources[n])}: {source_label(self.sources[n])}"

    @property
    def sources_text(self) -> str:
        return sources_line(self.sources)

    @property
    def has_stats(self) -> bool:
        return self.stats_source is not None or bool(self.stats_text)

    def html(self, colour_drafts: bool) -> str:
        """The rendered content, made once per revision (Markdown for replies, escaped text for users)."""
        cached = self.html_cache
        colour = colour_drafts and self.reply is not None
        if cached is not None and cached[0] == self.revision and cached[1] == colour:
            return cached[2]
        if self.role == "user":
            html = render_user(self.text)
            if self.queued:  # greyed: not sent yet
                html = f'<div style="color: {current().muted}">{html}</div>'
        elif self.reply is not None:
            html = render_reply(self.reply.segments, colour_drafts=colour, streaming=self.reply.streaming)
        else:
            html = render_reply(self.text, colour_drafts=False)
        self.html_cache = (self.revision, colour, html)
        return html

    def refresh_from_reply(self) -> None:
        """Copy what the reply shows now (text, stats, notice, error) and mark the row changed."""
        reply = self.reply
        if reply is None:
            return
        self.text = reply.text
        self.stats_text, self.stats_source = reply.status_line(), None
        dropped = reply.metrics.dropped if reply.metrics is not None else ()
        self.notice = truncated_notice(dropped) if reply.truncated else ""
        self.error = reply.error
        self.badge = cache_badge(reply.metrics)
        self.tool_calls = list(reply.tool_calls)
        self.thinking, self.thinking_header = reply.thinking, reply.thinking_line()
        self.sources = sources_of({"sources": reply.metrics.sources}) if reply.metrics is not None else []
        self.revision += 1

    @property
    def streaming(self) -> bool:
        """A reply still streaming, or a queued message (neither is a place to branch from yet)."""
        return self.queued or (self.reply is not None and self.reply.streaming)


def queued_item(text: str) -> ChatItem:
    """The row of a message sent while the reply streams: greyed, with :data:`QUEUED_NOTICE` above it."""
    return ChatItem(QUEUED_ID, "user", text, notice=QUEUED_NOTICE, queued=True)


def item_from_message(message: Message) -> ChatItem:
    """A stored message as a row; a damaged row shows what could be read and says so."""
    role = message.role if message.role in SHOWN_ROLES else "assistant"
    item = ChatItem(message.id, role, message.content, version=message.version, versions=message.versions)
    item.damaged = message.damaged
    notices = [DAMAGED_NOTICE] if message.damaged else []
    if role == "assistant":
        # the stored dict as read: stats_line takes only numbers of the right type, so a damaged value is skipped
        row = message.metrics if isinstance(message.metrics, Mapping) else {}
        finish = str(row.get("finish_reason") or ("cancelled" if message.status == "cancelled" else ""))
        item.stats_source = (row, finish, message.status == "streaming")
        if row.get("truncated") is True:
            notices.append(truncated_notice(row.get("dropped")))
        if message.status == "error":
            item.error = str(row.get("error") or ERROR_FALLBACK)
        item.badge = cache_badge(row)
        item.tool_calls = calls_from_metrics(row)
        item.thinking = row["thinking"] if isinstance(row.get("thinking"), str) else ""
        item.thinking_header = (thinking_line(row) or "Thought") if item.thinking else ""
        item.sources = sources_of(row)
    item.notice = " ".join(notices)
    return item


# a reply's collapsible parts: (the item field that says it has one, the field that says it is open)
TOGGLES = {"tools": ("tool_calls", "tools_open"), "thinking": ("thinking_header", "thinking_open")}


class ChatModel(QAbstractListModel):
    """The rows of the open conversation, in message order."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[ChatItem] = []  # read by the delegate; changed only by the methods below
        self._rows: dict[int, int] = {}  # message id -> row

    # -- Qt's model interface ---------------------------------------------------------------
    def rowCount(self, parent: _Index | None = None) -> int:  # noqa: N802 (Qt override)
        return 0 if parent is not None and parent.isValid() else len(self.rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.rows):
            return None
        item = self.rows[index.row()]
        if role == ITEM_ROLE:
            return item
        if role == Qt.ItemDataRole.DisplayRole:
            return item.text
        if role == Qt.ItemDataRole.ToolTipRole:
            return item.tooltip or None
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        # editable: a read-only text browser opens over a message on demand, to select its text
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsEditable

    # -- changes (each through Qt's begin/end calls) ------------------------------------------
    def reset(self, items: Sequence[ChatItem]) -> None:
        self.beginResetModel()
        self.rows = list(items)
        self._rows = {item.message_id: row for row, item in enumerate(self.rows)}
        self.endResetModel()

    def append(self, item: ChatItem) -> int:
        row = len(self.rows)
        self.beginInsertRows(QModelIndex(), row, row)
        self.rows.append(item)
        self._rows[item.message_id] = row
        self.endInsertRows()
        return row

    def remove_from(self, message_id: int) -> None:
        """Drop the row of ``message_id`` and every later one."""
        first = next((row for row, item in enumerate(self.rows) if item.message_id >= message_id), None)
        if first is None:
            return
        self.beginRemoveRows(QModelIndex(), first, len(self.rows) - 1)
        for item in self.rows[first:]:
            self._rows.pop(item.message_id, None)
        del self.rows[first:]
        self.endRemoveRows()

    def remove(self, message_id: int) -> None:
        """Drop the row of ``message_id`` alone (a queued message taken back or sent)."""
        row = self._rows.get(message_id)
        if row is None:
            return
        self.beginRemoveRows(QModelIndex(), row, row)
        del self.rows[row]
        self._rows = {item.message_id: n for n, item in enumerate(self.rows)}
        self.endRemoveRows()

    def replace(self, item: ChatItem) -> None:
        """Show ``item`` in place of the row of the same message (another version of it)."""
        row = self._rows.get(item.message_id)
        if row is not None:
            self.rows[row] = item
            index = self.index(row)
            self.dataChanged.emit(index, index, [ITEM_ROLE])

    def touch(self, message_id: int) -> None:
        """Tell the view that a row's content changed (its revision was bumped by the caller)."""
        row = self._rows.get(message_id)
        if row is not None:
            index = self.index(row)
            self.dataChanged.emit(index, index, [ITEM_ROLE])

    def toggle(self, message_id: int, part: str) -> bool:
        """Open or close a reply's collapsible ``part`` ("tools": its tool results, "thinking": its thinking);
        returns whether it is open now (false where the reply has none)."""
        shown, flag = TOGGLES[part]
        item = self.item(message_id)
        if item is None or not getattr(item, shown):
            return False
        setattr(item, flag, not getattr(item, flag))
        item.revision += 1
        self.touch(message_id)
        return bool(getattr(item, flag))

    def restyle_all(self) -> None:
        """The colours changed (another theme): every row renders and lays out again."""
        for item in self.rows:
            item.revision += 1
        self.touch_all()

    def touch_all(self) -> None:
        if self.rows:
            self.dataChanged.emit(self.index(0), self.index(len(self.rows) - 1), [ITEM_ROLE])

    # -- queries ------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return len(self.rows)

    def item(self, message_id: int) -> ChatItem | None:
        row = self._rows.get(message_id)
        return None if row is None else self.rows[row]

    def item_at(self, row: int) -> ChatItem:
        return self.rows[row]

    def row_of(self, message_id: int) -> int | None:
        return self._rows.get(message_id)

    def items(self) -> list[ChatItem]:
        return list(self.rows)
