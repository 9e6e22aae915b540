"""One SQLite file shared by Brisk's tables: opening, checks, migrations, error translation.

:func:`connect` opens (or creates) a database file and brings one
:class:`Schema` up to date; the chat history (``engine.storage.store``) and any
later table set (an answer cache, ...) each call it with their own schema on
the same file, and each gets the same handling:

* The file is checked before anything is written (``PRAGMA quick_check``); a
  damaged file, a database that is not Brisk's, or one whose schema is newer
  than this Brisk knows is refused with :class:`StoreError` and left
  byte-for-byte as it was.  One exception: damage confined to the answer
  cache's tables (:data:`CACHE_TABLES`, rows that can be made again) is
  repaired by dropping those tables (:meth:`SQLiteFile.drop_cache`), never
  any other table, so a damaged cache cannot cost the history.
* A file is Brisk's when ``PRAGMA application_id`` says so, when it has a
  ``user_version`` (history files from before the marker), or when its only
  tables are the answer cache's (files the CLI made before the cache used this
  module): such a file is adopted, its version recorded here and its rows kept.
* A writable file is switched to WAL; writes wait ``busy_timeout_ms`` for
  another program's lock.  A file or folder the user may not write is opened
  read-only: reads work, writes raise.
* A schema is a list of small migration functions, applied in order, one
  transaction each; each step looks at the version again inside its
  transaction, so two processes opening a new file at once build it once.
  The chat history's version is ``PRAGMA user_version`` (as in every Brisk so
  far); any other schema's version is a row of the ``brisk_schema`` table.
  ``PRAGMA application_id`` marks the file as Brisk's.
* :meth:`SQLiteFile.op` serialises calls (a file may be shared between
  threads), runs writes in ``BEGIN IMMEDIATE`` transactions (a failed write
  changes nothing), and turns every ``sqlite3`` error into a :class:`StoreError`
  whose message says what happened and what to do.

Example for a new table set::

    ANSWERS = Schema("answers", (create_answer_tables,))
    file = connect(database_path(), ANSWERS)
    with file.op("save the answer", write=True) as db:
        db.execute("INSERT INTO answers ...")
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database

APPLICATION_ID = 0x42524B31  # "BRK1" in the file header: this file is Brisk's
HISTORY = "history"  # the schema whose version is PRAGMA user_version
CACHE = "answer_cache"  # the answer cache's schema (engine.answer_cache.store)
# The answer cache's tables: their rows can be made again, so damage there is repaired by dropping them
# (never any other table), and an unmarked file holding only these is one the CLI made before markers.
CACHE_TABLES = frozenset({"answer_cache", "answer_cache_stats", "answer_cache_meta"})
LEGACY_CACHE_META = "answer_cache_meta"  # where those files kept the cache's version

Migration = Callable[[Database], None]


class StoreError(Exception):
    """The database could not do what was asked; the message says why and what to do."""


class NotFoundError(StoreError, KeyError):
    """No row with that id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Schema:
    """A named set of tables and the migrations that build them; the version is how many ran."""

    name: str
    migrations: Sequence[Migration]
    # For a file with no record of this schema: the version its tables already have, read from an
    # older bookkeeping (0: none).  Once recorded here, the tables in ``legacy_tables`` are dropped.
    legacy_version: Callable[[Database], int] | None = None
    legacy_tables: tuple[str, ...] = ()

    @property
    def version(self) -> int:
        return len(self.migrations)


class SQLiteFile:
    """An open, checked database file (``path=None``: in memory, for tests).

    Opening checks the file but writes nothing; :meth:`migrate` brings a schema up to date.
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        read_only: bool = False,
        busy_timeout_ms: int = 2000,
        label: str = "chat database",
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.read_only = read_only or (self.path is not None and not _writable(self.path))
        self.label = label
        self.where = str(self.path) if self.path is not None else "(in memory)"
        self.lock = threading.RLock()
        self.closed = False
        self.cache_dropped = False  # opening found the answer cache's tables damaged and dropped them
        self.conn = self._connect()
        self.db = Database(self.conn, execute_plugins=False)
        try:
            with self.op(f"set up the {label}"):
                self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                self._check()
        except BaseException:
            self.conn.close()
            raise

    # -- opening and checking ---------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
        try:
            if self.path is None:
                return sqlite3.connect(":memory:", **kwargs)
            if self.path.is_dir():
                raise StoreError(f"{self.where} is a folder, not a {self.label} file.")
            if not self.read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                return sqlite3.connect(str(self.path), **kwargs)
            if not self.path.exists():
                raise StoreError(f"There is no {self.label} at {self.where} to open read-only.")
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
                f"Could not open the {self.label} at {self.where}: {e}. "
                "Check that the folder exists and that you may write to it."
            ) from e
        except sqlite3.Error as e:
            raise self.translate(e, f"open the {self.label}") from e

    def _check(self) -> None:
        db = self.db
        ours = (
            db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            or db.execute("PRAGMA user_version").fetchone()[0] > 0  # files from before application_id
            or _only_cache_tables(db)  # files the CLI made before the answer cache used this module
        )
        if not ours and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(
                f"The file at {self.where} is a database, but not Brisk's {self.label}. "
                "Nothing was changed. Move it aside or choose another location."
            )
        check = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if check != "ok" and not self.read_only and _damage_only_in_cache(db):
            self.drop_cache()
            self.cache_dropped = True
            check = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if check != "ok":
            raise StoreError(self.damaged_message(check))
        db.execute("PRAGMA foreign_keys = ON")

    def _recorded(self, schema: Schema) -> int | None:
        """The version this file records for ``schema`` (None: no record)."""
        if schema.name == HISTORY:
            return int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if not self.db["brisk_schema"].exists():
            return None
        row = self.db.execute("SELECT version FROM brisk_schema WHERE name = ?", [schema.name]).fetchone()
        return int(row[0]) if row else None

    def _found(self, schema: Schema) -> tuple[int, bool]:
        """(version, adopted): the recorded version, else the one an older bookkeeping holds."""
        recorded = self._recorded(schema)
        if recorded is not None or schema.legacy_version is None:
            return recorded or 0, False
        legacy = schema.legacy_version(self.db)
        return legacy, legacy > 0

    def version(self, schema: Schema) -> int:
        """The version of ``schema`` in this file (0: none of its tables yet)."""
        with self.op(f"read the {self.label}'s version"):
            return self._found(schema)[0]

    def migrate(self, schema: Schema) -> None:
        """Run ``schema``'s pending migrations, one transaction each; refuse a newer file.

        A version found only in an older bookkeeping (``Schema.legacy_version``) is recorded first,
        with the marker, so the file is adopted with its rows."""
        with self.op(f"read the {self.label}'s version"):
            version, adopt = self._found(schema)
        if version > schema.version:
            raise StoreError(
                f"The {self.label} at {self.where} was written by a newer version of Brisk "
                f"(schema {version}; this version knows up to {schema.version}). "
                "Nothing was changed. Update Brisk to open it."
            )
        if version == schema.version and (not adopt or self.read_only):
            return
        if self.read_only:
            raise StoreError(self.read_only_message(f"upgrade the {self.label}"))
        if self.path is not None:
            with self.op(f"set up the {self.label}"):
                self.db.enable_wal()
        if adopt:
            with self.op(f"adopt the {self.label} made by an older Brisk", write=True) as db:
                found, still = self._found(schema)  # another process may have adopted it meanwhile
                if still:
                    self._record(db, schema, found)
        for number, step in enumerate(schema.migrations[version:], start=version + 1):
            with self.op(f"upgrade the {self.label} to schema {number}", write=True) as db:
                if self._found(schema)[0] >= number:  # done before, or by another process just now
                    continue
                step(db)
                self._record(db, schema, number)

    def _record(self, db: Database, schema: Schema, number: int) -> None:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        if schema.name == HISTORY:
            db.execute(f"PRAGMA user_version = {number}")
            return
        db.execute("CREATE TABLE IF NOT EXISTS brisk_schema (name TEXT PRIMARY KEY, version INTEGER)")
        db.execute("INSERT OR REPLACE INTO brisk_schema (name, version) VALUES (?, ?)", [schema.name, number])
        for table in schema.legacy_tables:
            db.execute(f"DROP TABLE IF EXISTS [{table}]")

    def drop_cache(self) -> None:
        """Drop the answer cache's tables (:data:`CACHE_TABLES`, no other) and forget its version.

        A table SQLite cannot drop (a corrupt b-tree it cannot walk) is unlinked from the schema
        and the file vacuumed: VACUUM copies only what the schema still names (every other table,
        row for row) into a clean file.  Raises :class:`StoreError` if neither works.
        """
        names = sorted(CACHE_TABLES)
        marks = ", ".join("?" for _ in names)
        forget = "DELETE FROM brisk_schema WHERE name = ?"
        try:
            with self.op("clear the damaged answer cache", write=True) as db:
                for name in names:
                    db.execute(f"DROP TABLE IF EXISTS [{name}]")
                if db["brisk_schema"].exists():
                    db.execute(forget, [CACHE])
            return
        except StoreError as exc:
            if not is_corrupt(exc):
                raise
        with self.op("clear the damaged answer cache"):
            self.conn.execute("PRAGMA writable_schema = ON")
            try:
                with self.op("clear the damaged answer cache", write=True) as db:
                    db.execute(f"DELETE FROM sqlite_master WHERE tbl_name IN ({marks})", names)
                    if db["brisk_schema"].exists():
                        db.execute(forget, [CACHE])
            finally:
                self.conn.execute("PRAGMA writable_schema = OFF")
            self.conn.execute("VACUUM")

    # -- errors and transactions ------------------------------------------------------------

    @contextmanager
    def op(self, action: str, *, write: bool = False) -> Iterator[Database]:
        """Serialise, translate sqlite errors, and (for writes) run one transaction."""
        with self.lock:
            if self.closed:
                raise StoreError(f"Could not {action}: the {self.label} is closed.")
            if write and self.read_only:
                raise StoreError(self.read_only_message(action))
            try:
                if write:
                    self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.db
                    if write:
                        self.conn.execute("COMMIT")
                except BaseException:
                    if write and self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise self.translate(e, action) from e

    def translate(self, error: sqlite3.Error, action: str) -> StoreError:
        """A :class:`StoreError` saying what ``error`` means for the user and what to do."""
        code = getattr(error, "sqlite_errorcode", 0) & 0xFF
        if code in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED
            return StoreError(
                f"Could not {action}: the {self.label} at {self.where} is locked by another "
                "program (is a second copy of Brisk running?). Nothing was changed; close the "
                "other program and try again."
            )
        if code == 8:  # SQLITE_READONLY
            return StoreError(self.read_only_message(action))
        if code in (11, 26):  # SQLITE_CORRUPT, SQLITE_NOTADB
            return StoreError(self.damaged_message(str(error)))
        if code == 13:  # SQLITE_FULL
            return StoreError(
                f"Could not {action}: the disk holding {self.where} is full. "
                "Nothing was changed; free some space and try again."
            )
        if code in (10, 14):  # SQLITE_IOERR, SQLITE_CANTOPEN
            return StoreError(
                f"Could not {action}: reading or writing {self.where} failed ({error}). "
                "Check that the disk is connected and that you may write to the folder."
            )
        return StoreError(f"Could not {action} in the {self.label} at {self.where}: {error}.")

    def damaged_message(self, detail: str) -> str:
        return (
            f"The {self.label} at {self.where} is damaged ({detail}). Nothing was changed. "
            "Move the file aside (for example rename it to end in '.damaged') and restart "
            "Brisk to start a new history and answer cache; keep the old file to try to "
            "recover it later."
        )

    def read_only_message(self, action: str) -> str:
        return (
            f"Could not {action}: the {self.label} at {self.where} is read-only. "
            "Nothing was changed. Check the permissions of the file and its folder, "
            "then restart Brisk."
        )

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                try:
                    self.conn.close()
                except sqlite3.Error as e:
                    raise self.translate(e, f"close the {self.label}") from e


def connect(
    path: str | Path | None,
    schema: Schema,
    *,
    read_only: bool = False,
    busy_timeout_ms: int = 2000,
    label: str = "chat database",
) -> SQLiteFile:
    """Open and check the file at ``path`` and bring ``schema`` up to date (see the module docstring)."""
    file = SQLiteFile(path, read_only=read_only, busy_timeout_ms=busy_timeout_ms, label=label)
    try:
        file.migrate(schema)
    except BaseException:
        file.conn.close()
        raise
    return file


def _writable(path: Path) -> bool:
    """False when an existing file, or the folder that holds it, may not be written."""
    if not path.exists():
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _tables(db: Database) -> set[str]:
    """The names of the file's tables (and what indexes and triggers belong to), SQLite's own left out."""
    rows = db.execute("SELECT DISTINCT tbl_name FROM sqlite_master WHERE tbl_name NOT LIKE 'sqlite%'")
    return {str(row[0]) for row in rows.fetchall()}


def _only_cache_tables(db: Database) -> bool:
    """True for a file the CLI made before markers: the answer cache's tables and its version table only."""
    names = _tables(db)
    return LEGACY_CACHE_META in names and names <= CACHE_TABLES


def _table_ok(db: Database, name: str) -> bool:
    try:
        return bool(db.execute(f"PRAGMA quick_check([{name}])").fetchone()[0] == "ok")
    except sqlite3.DatabaseError:
        return False


def _damage_only_in_cache(db: Database) -> bool:
    """True when an answer-cache table fails its own check and every other table passes its own."""
    names = _tables(db)
    if all(_table_ok(db, name) for name in names & CACHE_TABLES):
        return False  # no cache table is damaged (or there is none): the damage is elsewhere
    return all(_table_ok(db, name) for name in names - CACHE_TABLES)


def is_corrupt(error: BaseException) -> bool:
    """True when ``error`` (or the ``sqlite3`` error behind it) says the file's pages are damaged."""
    cause = error if isinstance(error, sqlite3.Error) else error.__cause__
    code = getattr(cause, "sqlite_errorcode", 0) & 0xFF
    return code in (11, 26) or "malformed" in str(cause)
