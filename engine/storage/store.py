"""Chat history: conversations and their messages in one SQLite file.

:class:`Store` wraps a ``sqlite_utils.Database``.  Its constructor checks the
file (``PRAGMA quick_check``), refuses a file from a newer Brisk, switches to
WAL and runs the pending :data:`MIGRATIONS` (one transaction each; the schema
version is ``PRAGMA user_version``).  Nothing is written before those checks
pass, so a damaged, foreign or newer file is left byte-for-byte as it was.

Every public method raises :class:`StoreError` (never a bare ``sqlite3``
error) with a message that says what happened and what to do; a missing id
raises :class:`NotFoundError`, which is also a ``KeyError``.  Writes run in
``BEGIN IMMEDIATE`` transactions, so a failed write changes nothing.  A file
the user cannot write is opened read-only: reads work, writes raise.

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
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlite_utils import Database

ROLES = ("system", "user", "assistant")
STATUSES = ("done", "streaming", "cancelled", "error")
MARK_OPEN, MARK_CLOSE = "\u00ab", "\u00bb"  # « » around matched words in snippets
_TOKENIZER = "unicode61 remove_diacritics 2"  # no stemming: prefix search stays exact
_LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}
_STATUS_NOTES = {
    "streaming": "*(unfinished)*",
    "cancelled": "*(stopped before the end)*",
    "error": "*(ended with an error)*",
}


class StoreError(Exception):
    """The chat database could not do what was asked; the message says why and what to do."""


class NotFoundError(StoreError, KeyError):
    """No conversation or message with that id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    system_prompt: str
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: str
    role: str
    content: str
    status: str
    metrics: dict[str, Any]
    created: float


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    message_id: int | None  # None when the conversation's title matched
    title: str
    snippet: str


def _create_tables(db: Database) -> None:
    # ``seq`` pins the rowid that the title index points at (VACUUM may renumber implicit rowids).
    db.execute(
        """CREATE TABLE conversations (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            updated REAL NOT NULL)"""
    )
    db.execute("CREATE INDEX conversations_updated ON conversations (updated)")
    db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'done',
            metrics TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL)"""
    )
    db.execute("CREATE INDEX messages_conversation ON messages (conversation_id, id)")


def _add_search(db: Database) -> None:
    db.table("messages").enable_fts(["content"], create_triggers=True, tokenize=_TOKENIZER)
    db.table("conversations").enable_fts(["title"], create_triggers=True, tokenize=_TOKENIZER)


MIGRATIONS: list[Callable[[Database], None]] = [_create_tables, _add_search]
SCHEMA_VERSION = len(MIGRATIONS)

# Keeps ``updated`` strictly increasing, so "most recent first" holds even when the clock ties.
_NEXT_UPDATED = "max(?, (SELECT coalesce(max(updated), 0) FROM conversations) + 0.001)"


class Store:
    """The chat history in the SQLite file at ``path`` (``None``: in memory, for tests).

    ``read_only=True`` (or a file or folder the user may not write) opens it for reading
    only.  ``busy_timeout_ms`` is how long a write waits for another program's lock.
    """

    def __init__(self, path: str | Path | None, *, read_only: bool = False, busy_timeout_ms: int = 2000) -> None:
        self.path = Path(path) if path is not None else None
        self.read_only = read_only or (self.path is not None and not _writable(self.path))
        self._where = str(self.path) if self.path is not None else "(in memory)"
        self._lock = threading.RLock()
        self._closed = False
        conn = self._connect()
        self._conn = conn
        self._db = Database(conn, execute_plugins=False)
        try:
            with self._op("set up the chat database"):
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                self._check_and_migrate()
        except BaseException:
            conn.close()
            raise

    # -- opening ------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
        try:
            if self.path is None:
                return sqlite3.connect(":memory:", **kwargs)
            if self.path.is_dir():
                raise StoreError(f"{self._where} is a folder, not a chat database file.")
            if not self.read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                return sqlite3.connect(str(self.path), **kwargs)
            if not self.path.exists():
                raise StoreError(f"There is no chat database at {self._where} to open read-only.")
            uri = self.path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, **kwargs)
            try:
                conn.execute("PRAGMA user_version").fetchone()
            except sqlite3.OperationalError as e:
                # A WAL file in a read-only folder can only be read with immutable=1,
                # which is safe while no -wal file (no writer) exists.
                conn.close()
                if e.sqlite_errorcode & 0xFF not in (8, 14) or Path(f"{self.path}-wal").exists():
                    raise
                conn = sqlite3.connect(uri + "&immutable=1", uri=True, **kwargs)
            return conn
        except OSError as e:
            raise StoreError(
                f"Could not open the chat database at {self._where}: {e}. "
                "Check that the folder exists and that you may write to it."
            ) from e
        except sqlite3.Error as e:
            raise self._translate(e, "open the chat database") from e

    def _check_and_migrate(self) -> None:
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        check = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if check != "ok":
            raise StoreError(self._damaged_message(check))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"The chat database at {self._where} was written by a newer version of Brisk "
                f"(schema {version}; this version knows up to {SCHEMA_VERSION}). "
                "Nothing was changed. Update Brisk to open it."
            )
        if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(
                f"The file at {self._where} is a database, but not Brisk's chat history. "
                "Nothing was changed. Move it aside or choose another location."
            )
        db.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION and self.read_only:
            raise StoreError(self._read_only_message("upgrade the chat database"))
        if self.read_only:
            return
        if self.path is not None:
            db.enable_wal()
        for number, migrate in enumerate(MIGRATIONS[version:], start=version + 1):
            with self._op(f"upgrade the chat database to schema {number}", write=True):
                migrate(db)
                db.execute(f"PRAGMA user_version = {number}")

    # -- errors and transactions ----------------------------------------------

    @contextmanager
    def _op(self, action: str, *, write: bool = False) -> Iterator[Database]:
        """Serialise, translate sqlite errors, and (for writes) run one transaction."""
        with self._lock:
            if self._closed:
                raise StoreError(f"Could not {action}: the chat database is closed.")
            if write and self.read_only:
                raise StoreError(self._read_only_message(action))
            try:
                if write:
                    self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    if write:
                        self._conn.execute("COMMIT")
                except BaseException:
                    if write and self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise self._translate(e, action) from e

    def _translate(self, error: sqlite3.Error, action: str) -> StoreError:
        code = getattr(error, "sqlite_errorcode", 0) & 0xFF
        if code in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED
            return StoreError(
                f"Could not {action}: the chat database at {self._where} is locked by another "
                "program (is a second copy of Brisk running?). Nothing was changed; close the "
                "other program and try again."
            )
        if code == 8:  # SQLITE_READONLY
            return StoreError(self._read_only_message(action))
        if code in (11, 26):  # SQLITE_CORRUPT, SQLITE_NOTADB
            return StoreError(self._damaged_message(str(error)))
        if code == 13:  # SQLITE_FULL
            return StoreError(
                f"Could not {action}: the disk holding {self._where} is full. "
                "Nothing was changed; free some space and try again."
            )
        if code in (10, 14):  # SQLITE_IOERR, SQLITE_CANTOPEN
            return StoreError(
                f"Could not {action}: reading or writing {self._where} failed ({error}). "
                "Check that the disk is connected and that you may write to the folder."
            )
        return StoreError(f"Could not {action} in the chat database at {self._where}: {error}.")

    def _damaged_message(self, detail: str) -> str:
        return (
            f"The chat database at {self._where} is damaged ({detail}). Nothing was changed. "
            "Move the file aside (for example rename it to end in '.damaged') and restart "
            "Brisk to start a new history; keep the old file to try to recover it later."
        )

    def _read_only_message(self, action: str) -> str:
        return (
            f"Could not {action}: the chat database at {self._where} is read-only. "
            "Nothing was changed. Check the permissions of the file and its folder, "
            "then restart Brisk."
        )

    # -- conversations ------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> str:
        conversation_id = uuid.uuid4().hex
        now = time.time()
        with self._op("create a conversation", write=True) as db:
            db.execute(
                "INSERT INTO conversations (id, title, system_prompt, created, updated) "
                f"VALUES (?, ?, ?, ?, {_NEXT_UPDATED})",
                [conversation_id, title, system_prompt, now, now],
            )
        return conversation_id

    def get_conversation(self, conversation_id: str) -> Conversation:
        with self._op("read a conversation") as db:
            row = db.execute(
                "SELECT id, title, system_prompt, created, updated FROM conversations WHERE id = ?",
                [conversation_id],
            ).fetchone()
        if row is None:
            raise NotFoundError(f"No conversation with id {conversation_id!r}; was it deleted?")
        return Conversation(*row)

    def list_conversations(self) -> list[Conversation]:
        with self._op("list conversations") as db:
            rows = db.execute(
                "SELECT id, title, system_prompt, created, updated FROM conversations ORDER BY updated DESC, seq DESC"
            ).fetchall()
        return [Conversation(*row) for row in rows]

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        with self._op("rename the conversation", write=True) as db:
            self._set(db, conversation_id, "title", title, touch=True)

    def set_system_prompt(self, conversation_id: str, text: str) -> None:
        with self._op("save the system prompt", write=True) as db:
            self._set(db, conversation_id, "system_prompt", text, touch=False)

    def delete_conversation(self, conversation_id: str) -> None:
        with self._op("delete the conversation", write=True) as db:
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
            rows = db.execute(
                "SELECT id, conversation_id, role, content, status, metrics, created "
                "FROM messages WHERE conversation_id = ? ORDER BY id",
                [conversation_id],
            ).fetchall()
        return [
            Message(m_id, conv, role, text, status, json.loads(metrics), created)
            for m_id, conv, role, text, status, metrics, created in rows
        ]

    def delete_messages_from(self, conversation_id: str, message_id: int) -> None:
        """Delete that message and every later one in its conversation (regenerate / edit)."""
        with self._op("delete the messages", write=True) as db:
            found = db.execute(
                "SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                [message_id, conversation_id],
            ).fetchone()
            if found is None:
                raise NotFoundError(f"No message {message_id} in conversation {conversation_id!r}; was it deleted?")
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
            conversation = self.get_conversation(conversation_id)
            messages = self.messages(conversation_id)
        parts = ["# " + " ".join(conversation.title.split())]
        if conversation.system_prompt:
            parts.append(f"**System prompt**\n\n{conversation.system_prompt}")
        for message in messages:
            note = _STATUS_NOTES.get(message.status)
            body = f"{message.content}\n\n{note}" if note else message.content
            parts.append(f"**{_LABELS[message.role]}**\n\n{body}")
        return "\n\n".join(parts) + "\n"

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._conn.close()
                except sqlite3.Error as e:
                    raise self._translate(e, "close the chat database") from e

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


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")


def _to_json(metrics: dict[str, Any] | None) -> str:
    try:
        return json.dumps(metrics or {}, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"metrics must be plain JSON (numbers, text, lists, dicts): {e}") from e


def _writable(path: Path) -> bool:
    """False when an existing file, or the folder that holds it, may not be written."""
    if not path.exists():
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
