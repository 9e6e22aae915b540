"""Chat history: conversations and their messages, in the SQLite file of ``engine.storage.db``.

:class:`Store` opens the file with :func:`engine.storage.db.connect` and the
chat history's schema (``engine.storage.schema``), the same way the answer
cache opens it, so whichever starts first the other opens the file (one the
CLI made before markers is adopted with its answers).  The file is checked
before anything is written: a damaged, foreign or newer file is refused and
left byte-for-byte as it was (damage confined to the answer cache's tables
drops only those), and a file the user cannot write is opened read-only.

Every public method raises :class:`StoreError` (never a bare ``sqlite3``
error) with a message that says what happened and what to do; a missing id
raises :class:`NotFoundError`, which is also a ``KeyError``.  Writes run in
one transaction each, so a failed write changes nothing.

A message row that cannot be read as written (``metrics`` that is not a JSON
object, an unknown role or status, text that is not text) is returned with
``damaged=True`` and what could be read; it never stops the other rows, or
the window, from loading.

A chat may be branched off another (:meth:`Store.branch_conversation`: the
history up to one message; :meth:`Store.keep_last_turns`: only the last N
turns, a tail fork): the branch holds copies of those messages (the version
each shows) and the parent's system prompt, parameters and documents, and
records its parent (``Conversation.parent_id``) and the parent's message it was
branched after (``Conversation.branched_after``).  Listing returns branches
beside the others with their parent, so a list can nest them.  Deleting a
chat keeps its branches: they become chats of their own (no parent).

A project (:meth:`Store.create_project`, ``Project``) is a folder of chats
with its own system prompt, sampling values and documents, which a new chat in
it starts with (``create_conversation(..., project_id=)``; the chat then keeps
its own copies).  A chat is in at most one project (``Conversation.project_id``;
:meth:`Store.move_to_project` moves it in or out, a branch starts in its
parent's).  Deleting a project keeps its chats, outside any project.

A reply asked for again keeps every answer as a version of the same message
(:meth:`Store.new_version`): the message row holds the version shown, the one
later turns continue from (``Message.version`` of ``Message.versions``), the
others wait in ``message_versions`` until :meth:`Store.show_version` swaps one
in; :meth:`Store.versions` lists them all.  Search and export see the version
shown.

:class:`StreamSaver` saves a streaming reply at most once per ``interval``
seconds, so a crash loses at most that much text; :meth:`Store.recover_streaming`
marks replies left ``"streaming"`` by a crash as ``"cancelled"``.

Search matches every word of the query as a prefix (``hel wor`` finds
"hello world") in message text and conversation titles; the query is quoted,
so no user input is an FTS syntax error.  Snippets mark matches with
:data:`MARK_OPEN` / :data:`MARK_CLOSE`.  A Store may be shared between
threads; calls are serialised by a lock.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from sqlite_utils import Database

from engine.storage import chat_documents
from engine.storage.db import NotFoundError, StoreError, connect
from engine.storage.export import to_markdown
from engine.storage.records import Conversation, Message, Project, SearchHit
from engine.storage.schema import HISTORY_SCHEMA, MIGRATIONS, SCHEMA_VERSION

ROLES = ("system", "user", "assistant")
STATUSES = ("done", "streaming", "cancelled", "error")
MARK_OPEN, MARK_CLOSE = "\u00ab", "\u00bb"  # « » around matched words in snippets

__all__ = [
    "MARK_CLOSE",
    "MARK_OPEN",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Conversation",
    "Message",
    "NotFoundError",
    "Project",
    "SearchHit",
    "Store",
    "StoreError",
    "StreamSaver",
]


_CONVERSATION_COLUMNS = (
    "id, title, system_prompt, created, updated, params, documents, parent_id, branched_after, project_id"
)
_PROJECT_COLUMNS = "id, name, system_prompt, created, updated, params, documents"
# a message row as :func:`_message` reads it: the version shown, and how many versions it has
_MESSAGE_SELECT = (
    "SELECT m.id, m.conversation_id, m.role, m.content, m.status, m.metrics, m.created, m.version, "
    "1 + (SELECT count(*) FROM message_versions v WHERE v.message_id = m.id) FROM messages m"
)
_VERSION_ROW = "SELECT conversation_id, content, status, metrics, created, version FROM messages WHERE id = ?"


def _params_json(params: dict[str, Any]) -> str:
    if not isinstance(params, dict):
        raise TypeError(f"a chat's parameters must be a dict, not {type(params).__name__}")
    return json.dumps(params, allow_nan=False)


def _own_params(raw: object) -> dict[str, Any]:
    """A params column: what is not a JSON object reads as none set (the defaults)."""
    try:
        params = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        params = {}
    return params if isinstance(params, dict) else {}


def _conversation(row: tuple[Any, ...]) -> Conversation:
    """A conversation row; parameters that are not a JSON object read as none set (the defaults), documents
    that cannot be read as none attached."""
    conversation_id, title, system_prompt, created, updated, raw, attached, parent_id, after, project = row
    own = _own_params(raw)
    docs = chat_documents.checked(attached)
    parent = parent_id if isinstance(parent_id, str) and parent_id != conversation_id else None
    branched_after = after if parent is not None and isinstance(after, int) and not isinstance(after, bool) else None
    project_id = project if isinstance(project, str) and project else None
    return Conversation(
        conversation_id, title, system_prompt, created, updated, own, docs, parent, branched_after, project_id
    )


def _project(row: tuple[Any, ...]) -> Project:
    project_id, name, system_prompt, created, updated, raw, attached = row
    return Project(
        project_id, name, system_prompt, created, updated, _own_params(raw), chat_documents.checked(attached)
    )


# Keeps ``updated`` strictly increasing, so "most recent first" holds even when the clock ties.
_NEXT_UPDATED = "max(?, (SELECT coalesce(max(updated), 0) FROM conversations) + 0.001)"


class Store:
    """The chat history in the SQLite file at ``path`` (``None``: in memory, for tests).

    ``read_only=True`` (or a file or folder the user may not write) opens it for reading
    only.  ``busy_timeout_ms`` is how long a write waits for another program's lock.
    """

    def __init__(self, path: str | Path | None, *, read_only: bool = False, busy_timeout_ms: int = 2000) -> None:
        self._file = connect(path, HISTORY_SCHEMA, read_only=read_only, busy_timeout_ms=busy_timeout_ms)
        self.path = self._file.path
        self.read_only = self._file.read_only
        self._lock = self._file.lock
        self._op = self._file.op

    # -- conversations ------------------------------------------------------------

    def create_conversation(
        self,
        title: str = "New chat",
        system_prompt: str = "",
        params: dict[str, Any] | None = None,
        attached: list[dict[str, Any]] | None = None,
        project_id: str | None = None,
    ) -> str:
        """A new chat (``project_id``: in that project; the caller gives it the project's prompt and values)."""
        conversation_id = uuid.uuid4().hex
        now = time.time()
        with self._op("create a conversation", write=True) as db:
            if project_id is not None:
                self._require_project(db, project_id)
            db.execute(
                "INSERT INTO conversations (id, title, system_prompt, params, documents, project_id, created, "
                f"updated) VALUES (?, ?, ?, ?, ?, ?, ?, {_NEXT_UPDATED})",
                [
                    conversation_id,
                    title,
                    system_prompt,
                    _params_json(params or {}),
                    chat_documents.to_json(attached or []),
                    project_id,
                    now,
                    now,
                ],
            )
        return conversation_id

    def get_conversation(self, conversation_id: str) -> Conversation:
        with self._op("read a conversation") as db:
            return self._read_conversation(db, conversation_id)

    def list_conversations(self) -> list[Conversation]:
        with self._op("list conversations") as db:
            rows = db.execute(
                f"SELECT {_CONVERSATION_COLUMNS} FROM conversations ORDER BY updated DESC, seq DESC"
            ).fetchall()
        return [_conversation(row) for row in rows]

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        with self._op("rename the conversation", write=True) as db:
            self._set(db, conversation_id, "title", title, touch=True)

    def set_system_prompt(self, conversation_id: str, text: str) -> None:
        with self._op("save the system prompt", write=True) as db:
            self._set(db, conversation_id, "system_prompt", text, touch=False)

    def set_params(self, conversation_id: str, params: dict[str, Any]) -> None:
        """Keep the sampling values set for this chat alone (``engine.storage.params``); ``{}``: the defaults."""
        with self._op("save the chat's parameters", write=True) as db:
            self._set(db, conversation_id, "params", _params_json(params), touch=False)

    def set_documents(self, conversation_id: str, attached: list[dict[str, Any]]) -> None:
        """Keep the documents attached to this chat (``engine.storage.chat_documents``), in order; ``[]``: none."""
        with self._op("save the chat's documents", write=True) as db:
            self._set(db, conversation_id, "documents", chat_documents.to_json(attached), touch=False)

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete the chat, its messages and their versions; its branches stay, as chats of their own."""
        with self._op("delete the conversation", write=True) as db:
            db.execute(
                "UPDATE conversations SET parent_id = NULL, branched_after = NULL WHERE parent_id = ?",
                [conversation_id],
            )
            db.execute(
                "DELETE FROM message_versions WHERE message_id IN (SELECT id FROM messages WHERE conversation_id = ?)",
                [conversation_id],
            )
            db.execute("DELETE FROM messages WHERE conversation_id = ?", [conversation_id])
            deleted = db.execute("DELETE FROM conversations WHERE id = ?", [conversation_id])
        if not deleted.rowcount:
            raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")

    def _set(self, db: Database, conversation_id: str, column: str, value: str, touch: bool) -> None:
        touched = f", updated = {_NEXT_UPDATED}" if touch else ""
        params = [value, time.time(), conversation_id] if touch else [value, conversation_id]
        sql = f"UPDATE conversations SET {column} = ?{touched} WHERE id = ?"
        if not db.execute(sql, params).rowcount:
            raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")

    def _touch(self, db: Database, conversation_id: str) -> None:
        sql = f"UPDATE conversations SET updated = {_NEXT_UPDATED} WHERE id = ?"
        db.execute(sql, [time.time(), conversation_id])

    # -- branches -------------------------------------------------------------------

    def branch_conversation(self, conversation_id: str, message_id: int | None, title: str | None = None) -> str:
        """A new chat branched off ``conversation_id`` after its message ``message_id``: it holds copies of
        that message and every earlier one (None: none of them), and the parent's system prompt, parameters
        and documents; titled "<parent title> (branch)" unless ``title`` is given.  Returns its id."""
        with self._op("branch the conversation", write=True) as db:
            parent = self._read_conversation(db, conversation_id)
            if (
                message_id is not None
                and not db.execute(
                    "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?", [message_id, conversation_id]
                ).fetchone()
            ):
                raise NotFoundError(f"No message {message_id} in conversation {conversation_id!r}; was it deleted?")
            rows = db.execute(
                "SELECT id FROM messages WHERE conversation_id = ? AND id <= ? ORDER BY id",
                [conversation_id, -1 if message_id is None else message_id],
            ).fetchall()
            name = title or _branch_title(parent.title, "branch")
            return self._fork(db, parent, name, [row[0] for row in rows], message_id)

    def keep_last_turns(self, conversation_id: str, turns: int, title: str | None = None) -> str:
        """A new chat branched off ``conversation_id`` holding only its last ``turns`` turns (a turn: a user
        message and the replies after it) and its system prompt, parameters and documents (a tail fork, for a
        chat grown too long); titled "<parent title> (last N turns)".  Returns its id."""
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ValueError(f"turns must be a whole number of 1 or more, not {turns!r}")
        with self._op("keep the conversation's last turns", write=True) as db:
            parent = self._read_conversation(db, conversation_id)
            rows = db.execute(
                "SELECT id, role FROM messages WHERE conversation_id = ? AND role IN ('user', 'assistant') ORDER BY id",
                [conversation_id],
            ).fetchall()
            starts = [i for i, (_id, role) in enumerate(rows) if role == "user"]
            first = starts[-turns] if len(starts) >= turns else 0
            kept = [row[0] for row in rows[first:]]
            name = title or _branch_title(parent.title, f"last {turns} turn{'s' if turns != 1 else ''}")
            return self._fork(db, parent, name, kept, kept[-1] if kept else None)

    def branches(self, conversation_id: str) -> list[Conversation]:
        """The chats branched off this one (not their own branches), most recent first."""
        with self._op("list the conversation's branches") as db:
            return self._chats_where(db, "parent_id", conversation_id)

    @staticmethod
    def _chats_where(db: Database, column: str, value: str) -> list[Conversation]:
        """The chats whose ``column`` (parent_id or project_id) is ``value``, most recent first."""
        rows = db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE {column} = ? ORDER BY updated DESC, seq DESC",
            [value],
        ).fetchall()
        return [_conversation(row) for row in rows]

    @staticmethod
    def _read_conversation(db: Database, conversation_id: str) -> Conversation:
        found = db.execute(f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", [conversation_id])
        row = found.fetchone()
        if row is None:
            raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")
        return _conversation(row)

    def _fork(self, db: Database, parent: Conversation, title: str, message_ids: list[int], after: int | None) -> str:
        """The new chat and copies of the messages ``message_ids`` of ``parent``, in order: the version each
        shows, as its only version (a reply still streaming is copied as far as it got, ``"cancelled"``)."""
        branch_id = uuid.uuid4().hex
        now = time.time()
        db.execute(
            "INSERT INTO conversations (id, title, system_prompt, params, documents, parent_id, branched_after, "
            f"project_id, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {_NEXT_UPDATED})",
            [
                branch_id,
                title,
                parent.system_prompt,
                _params_json(parent.params),
                chat_documents.to_json(parent.documents),
                parent.id,
                after,
                parent.project_id,
                now,
                now,
            ],
        )
        for message_id in message_ids:
            db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, metrics, created, version) "
                "SELECT ?, role, content, CASE status WHEN 'streaming' THEN 'cancelled' ELSE status END, metrics, "
                "created, 1 FROM messages WHERE id = ?",
                [branch_id, message_id],
            )
        return branch_id

    # -- projects -------------------------------------------------------------------

    def create_project(
        self,
        name: str,
        system_prompt: str = "",
        params: dict[str, Any] | None = None,
        attached: list[dict[str, Any]] | None = None,
    ) -> str:
        """A new project (a folder of chats with its own system prompt, values and documents); returns its id."""
        project_id = uuid.uuid4().hex
        now = time.time()
        with self._op("create a project", write=True) as db:
            db.execute(
                f"INSERT INTO projects ({_PROJECT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    project_id,
                    _project_name(name),
                    system_prompt,
                    now,
                    now,
                    _params_json(params or {}),
                    chat_documents.to_json(attached or []),
                ],
            )
        return project_id

    def get_project(self, project_id: str) -> Project:
        with self._op("read a project") as db:
            row = db.execute(f"SELECT {_PROJECT_COLUMNS} FROM projects WHERE id = ?", [project_id]).fetchone()
        if row is None:
            raise NotFoundError(f"No project with id {project_id!r}; was it deleted?")
        return _project(row)

    def list_projects(self) -> list[Project]:
        """Every project, by name."""
        with self._op("list projects") as db:
            rows = db.execute(f"SELECT {_PROJECT_COLUMNS} FROM projects ORDER BY name COLLATE NOCASE, created")
            return [_project(row) for row in rows.fetchall()]

    def project_chats(self, project_id: str) -> list[Conversation]:
        """The chats in the project (branches among them), most recent first."""
        with self._op("list the project's chats") as db:
            self._require_project(db, project_id)
            return self._chats_where(db, "project_id", project_id)

    def rename_project(self, project_id: str, name: str) -> None:
        with self._op("rename the project", write=True) as db:
            self._set_project(db, project_id, "name", _project_name(name))

    def set_project_prompt(self, project_id: str, text: str) -> None:
        """The system prompt new chats in the project start with (its chats keep their own)."""
        with self._op("save the project's system prompt", write=True) as db:
            self._set_project(db, project_id, "system_prompt", text)

    def set_project_params(self, project_id: str, params: dict[str, Any]) -> None:
        """The sampling values new chats in the project start with (``engine.storage.params``); ``{}``: defaults."""
        with self._op("save the project's parameters", write=True) as db:
            self._set_project(db, project_id, "params", _params_json(params))

    def set_project_documents(self, project_id: str, attached: list[dict[str, Any]]) -> None:
        """The documents new chats in the project start with (``engine.storage.chat_documents``); ``[]``: none."""
        with self._op("save the project's documents", write=True) as db:
            self._set_project(db, project_id, "documents", chat_documents.to_json(attached))

    def delete_project(self, project_id: str) -> None:
        """Delete the project; its chats stay, outside any project."""
        with self._op("delete the project", write=True) as db:
            db.execute("UPDATE conversations SET project_id = NULL WHERE project_id = ?", [project_id])
            if not db.execute("DELETE FROM projects WHERE id = ?", [project_id]).rowcount:
                raise NotFoundError(f"No project with id {project_id!r}; was it deleted?")

    def move_to_project(self, conversation_id: str, project_id: str | None) -> None:
        """Put the chat in the project (None: out of any); its prompt, values and documents stay its own."""
        with self._op("move the chat to the project", write=True) as db:
            if project_id is not None:
                self._require_project(db, project_id)
            sql = "UPDATE conversations SET project_id = ? WHERE id = ?"
            if not db.execute(sql, [project_id, conversation_id]).rowcount:
                raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")

    def _set_project(self, db: Database, project_id: str, column: str, value: str) -> None:
        sql = f"UPDATE projects SET {column} = ?, updated = ? WHERE id = ?"
        if not db.execute(sql, [value, time.time(), project_id]).rowcount:
            raise NotFoundError(f"No project with id {project_id!r}; was it deleted?")

    def _require_project(self, db: Database, project_id: str) -> None:
        if not db.execute("SELECT 1 FROM projects WHERE id = ?", [project_id]).fetchone():
            raise NotFoundError(f"No project with id {project_id!r}; was it deleted?")

    # -- messages -----------------------------------------------------------------

    def add_message(
        self,
        conversation_id: str,
        role: str,
        content: str,
        *,
        status: str = "done",
        metrics: dict[str, Any] | None = None,
    ) -> int:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        _check_status(status)
        metrics_json = _to_json(metrics)
        with self._op("save the message", write=True) as db:
            self._require_conversation(db, conversation_id)
            cursor = db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, metrics, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [conversation_id, role, content, status, metrics_json, time.time()],
            )
            self._touch(db, conversation_id)
        return cast(int, cursor.lastrowid)

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        status: str | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        sets, params = ["content = ?"], [content]
        if status is not None:
            _check_status(status)
            sets.append("status = ?")
            params.append(status)
        if metrics is not None:
            sets.append("metrics = ?")
            params.append(_to_json(metrics))
        with self._op("save the message", write=True) as db:
            row = db.execute("SELECT conversation_id FROM messages WHERE id = ?", [message_id])
            found = row.fetchone()
            if found is None:
                raise NotFoundError(f"No message with id {message_id}; was it deleted?")
            db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", [*params, message_id])
            self._touch(db, found[0])

    def messages(self, conversation_id: str) -> list[Message]:
        with self._op("read the conversation's messages") as db:
            self._require_conversation(db, conversation_id)
            rows = db.execute(f"{_MESSAGE_SELECT} WHERE m.conversation_id = ? ORDER BY m.id", [conversation_id])
            return [_message(*row) for row in rows.fetchall()]

    def message(self, message_id: int) -> Message:
        """One message, as :meth:`messages` reads it (the version shown)."""
        with self._op("read the message") as db:
            row = db.execute(f"{_MESSAGE_SELECT} WHERE m.id = ?", [message_id]).fetchone()
        if row is None:
            raise NotFoundError(f"No message with id {message_id}; was it deleted?")
        return _message(*row)

    # -- versions of a reply ----------------------------------------------------------

    def new_version(self, message_id: int) -> int:
        """Keep the message's text as one of its versions and empty the row for a new one (``"streaming"``),
        shown from now on; returns the new version's number, the highest (regenerate)."""
        with self._op("keep the reply's earlier version", write=True) as db:
            conversation_id, *shown = self._version_row(db, message_id)
            numbers = db.execute("SELECT max(number) FROM message_versions WHERE message_id = ?", [message_id])
            number = 1 + max(_number(shown[-1]), _number(numbers.fetchone()[0]))
            self._keep_version(db, message_id, shown)
            db.execute(
                "UPDATE messages SET content = '', status = 'streaming', metrics = '{}', created = ?, version = ? "
                "WHERE id = ?",
                [time.time(), number, message_id],
            )
            self._touch(db, conversation_id)
        return number

    def show_version(self, message_id: int, number: int) -> Message:
        """Make version ``number`` of the message the one shown (and the one later turns continue from);
        returns the message as it reads now.  A reply still streaming cannot be switched."""
        with self._op("show another version of the reply", write=True) as db:
            _conversation_id, *shown = self._version_row(db, message_id)
            if shown[1] == "streaming":
                raise StoreError("This reply is still being written; wait for it to end, then pick a version.")
            if number != _number(shown[-1]):
                wanted = db.execute(
                    "SELECT content, status, metrics, created FROM message_versions "
                    "WHERE message_id = ? AND number = ?",
                    [message_id, number],
                ).fetchone()
                if wanted is None:
                    raise NotFoundError(f"Message {message_id} has no version {number}.")
                self._keep_version(db, message_id, shown)
                db.execute("DELETE FROM message_versions WHERE message_id = ? AND number = ?", [message_id, number])
                db.execute(
                    "UPDATE messages SET content = ?, status = ?, metrics = ?, created = ?, version = ? WHERE id = ?",
                    [*wanted, number, message_id],
                )
        return self.message(message_id)

    def versions(self, message_id: int) -> list[Message]:
        """Every version of the message, by number (the one shown among them, read from its row)."""
        shown = self.message(message_id)
        with self._op("read the reply's versions") as db:
            rows = db.execute(
                "SELECT number, content, status, metrics, created FROM message_versions WHERE message_id = ?",
                [message_id],
            ).fetchall()
        conversation_id, role, count = shown.conversation_id, shown.role, shown.versions
        kept = [
            _message(message_id, conversation_id, role, text, status, metrics, created, number, count)
            for number, text, status, metrics, created in rows
        ]
        return sorted([*kept, shown], key=lambda m: m.version)

    def _version_row(self, db: Database, message_id: int) -> tuple[Any, ...]:
        row = db.execute(_VERSION_ROW, [message_id]).fetchone()
        if row is None:
            raise NotFoundError(f"No message with id {message_id}; was it deleted?")
        return tuple(row)

    def _keep_version(self, db: Database, message_id: int, shown: list[Any]) -> None:
        """Move the row's version (content, status, metrics, created, number) into ``message_versions``; one
        left ``"streaming"`` (a crash) is kept as ``"cancelled"``."""
        content, status, metrics, created, number = shown
        db.execute(
            "INSERT INTO message_versions (message_id, number, content, status, metrics, created) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [message_id, _number(number), content, "cancelled" if status == "streaming" else status, metrics, created],
        )

    def delete_messages_from(self, conversation_id: str, message_id: int) -> None:
        """Delete that message and every later one in its conversation, with their versions (edit, and what
        followed a reply asked for again)."""
        with self._op("delete the messages", write=True) as db:
            found = db.execute(
                "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                [message_id, conversation_id],
            ).fetchone()
            if found is None:
                raise NotFoundError(f"No message {message_id} in conversation {conversation_id!r}; was it deleted?")
            db.execute(
                "DELETE FROM message_versions WHERE message_id IN "
                "(SELECT id FROM messages WHERE conversation_id = ? AND id >= ?)",
                [conversation_id, message_id],
            )
            db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                [conversation_id, message_id],
            )

    def recover_streaming(self) -> int:
        """Mark replies a crash left ``"streaming"`` as ``"cancelled"``; return how many."""
        with self._lock:
            with self._op("check for unfinished replies") as db:
                sql = "SELECT count(*) FROM messages WHERE status = 'streaming'"
                if not db.execute(sql).fetchone()[0]:
                    return 0
            with self._op("mark unfinished replies as cancelled", write=True) as db:
                sql = "UPDATE messages SET status = 'cancelled' WHERE status = 'streaming'"
                return db.execute(sql).rowcount

    def _require_conversation(self, db: Database, conversation_id: str) -> None:
        if db.execute("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]).fetchone():
            return
        raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")

    # -- search, export, close ------------------------------------------------------

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Title matches first, then messages, each best first; at most ``limit`` hits."""
        words = query.replace("\x00", " ").split()
        terms = [word for word in words if any(ch.isalnum() for ch in word)]
        if not terms or limit <= 0:
            return []
        match = " ".join('"' + term.replace('"', '""') + '"*' for term in terms)
        with self._op("search the chat history") as db:
            titles = db.execute(
                "SELECT c.id, NULL, c.title, highlight(conversations_fts, 0, ?, ?) "
                "FROM conversations_fts JOIN conversations c ON c.seq = conversations_fts.rowid "
                "WHERE conversations_fts MATCH ? ORDER BY rank LIMIT ?",
                [MARK_OPEN, MARK_CLOSE, match, limit],
            ).fetchall()
            found = db.execute(
                "SELECT m.conversation_id, m.id, c.title, "
                "snippet(messages_fts, 0, ?, ?, '\u2026', 16) "
                "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
                "JOIN conversations c ON c.id = m.conversation_id "
                "WHERE messages_fts MATCH ? ORDER BY rank LIMIT ?",
                [MARK_OPEN, MARK_CLOSE, match, limit],
            ).fetchall()
        return [SearchHit(*row) for row in [*titles, *found][:limit]]

    def export_markdown(self, conversation_id: str) -> str:
        with self._lock:
            return to_markdown(self.get_conversation(conversation_id), self.messages(conversation_id))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StreamSaver:
    """Saves a reply while it streams: at most once per `interval` seconds (default 1.0),
    so a crash loses at most a second of text.

    The first :meth:`append` writes at once.  If a write fails, :meth:`append` raises
    :class:`StoreError`; the text is kept and the next write is tried an interval later.
    """

    def __init__(
        self,
        store: Store,
        message_id: int,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._message_id = message_id
        self.interval = interval
        self._clock = clock
        self._parts: list[str] = []
        self._last_write: float | None = None
        self._finished = False

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def append(self, text: str) -> None:
        if self._finished:
            raise RuntimeError("StreamSaver.append() called after finish()")
        self._parts.append(text)
        now = self._clock()
        if self._last_write is None or now - self._last_write >= self.interval:
            self._last_write = now
            self._store.update_message(self._message_id, self.text, status="streaming")

    def finish(self, status: str = "done", metrics: dict[str, Any] | None = None) -> None:
        self._store.update_message(self._message_id, self.text, status=status, metrics=metrics)
        self._finished = True


def _project_name(name: str) -> str:
    """A project's name on one line; an empty one is refused."""
    tidy = " ".join(str(name).split())
    if not tidy:
        raise ValueError("A project needs a name.")
    return tidy


def _branch_title(title: str, what: str) -> str:
    """ "<title> (<what>)"; a branch of a branch does not repeat the same parenthesis."""
    suffix = f" ({what})"
    return title if title.endswith(suffix) else f"{title}{suffix}"


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")


def _to_json(metrics: dict[str, Any] | None) -> str:
    try:
        return json.dumps(metrics or {}, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metrics must be plain JSON (numbers, text, lists, dicts): {e}") from e


def _number(value: object) -> int:
    """A version number as stored (1 when it is not a whole number of 1 or more: a damaged row)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _message(
    m_id: int,
    conv: str,
    role: object,
    text: object,
    status: object,
    metrics: object,
    created: object,
    version: object = 1,
    versions: object = 1,
) -> Message:
    """A Message from a row; what cannot be read as written is replaced and the message marked damaged."""
    damaged = _number(version) != version
    try:
        parsed = json.loads(metrics) if isinstance(metrics, str | bytes) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        parsed, damaged = {}, True
    if not isinstance(text, str):
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else "" if text is None else str(text)
        damaged = True
    if role not in ROLES:
        role, damaged = str(role), True
    if status not in STATUSES:
        status, damaged = "error", True
    if not isinstance(created, int | float) or isinstance(created, bool) or not math.isfinite(created):
        created, damaged = 0.0, True
    number = _number(version)
    count = max(_number(versions), number)
    return Message(m_id, conv, cast(str, role), text, cast(str, status), parsed, float(created), damaged, number, count)
