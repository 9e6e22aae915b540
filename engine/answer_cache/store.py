"""The answer cache's tables in the app's SQLite file (the same file as the chat history).

:class:`CacheStore` owns two tables and touches no other: ``answer_cache``
(one row per answer) and ``answer_cache_stats`` (hit counters).  It opens the
file through ``engine.storage.db`` with the schema :data:`ANSWERS`, exactly as
the chat history does: the same checks (a file that is not Brisk's is refused
and left as it was), markers, WAL, busy timeout and error messages, so
whichever of the CLI and the window starts first, the other opens the file.
A file the CLI made before this (the cache's tables with their version in
``answer_cache_meta``, no markers) is adopted with its answers.  Every write
runs in a ``BEGIN IMMEDIATE`` transaction, so two connections (engine and GUI,
or two processes) wait for each other instead of failing or losing rows.

A cache is disposable: when its tables are damaged (wrong columns, a corrupt
page) they are dropped and created again through
:meth:`~engine.storage.db.SQLiteFile.drop_cache`, which can drop no other
table; the conversations and messages in the same file are left as they were.
A cache written by a newer Brisk is left alone and the cache is off.  Every
failure raises :class:`CacheError`, whose message says what to do.  A store
may be shared between threads; calls are serialised by a lock.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlite_utils import Database

from engine.storage.db import CACHE, CACHE_TABLES, LEGACY_CACHE_META, Schema, SQLiteFile, StoreError, is_corrupt

ENTRIES, STATS, META = "answer_cache", "answer_cache_stats", LEGACY_CACHE_META
HUGE_CHARS = 2000  # longer normalised questions are kept only as their hash
COUNTERS = ("lookups", "exact_hits", "semantic_hits", "saved_s")
_COLUMNS = {
    "id": int,
    "model_key": str,
    "model_name": str,
    "weight_hash": str,
    "dtype": str,
    "quant": str,
    "context_hash": str,
    "question_key": str,
    "question_norm": str,
    "question": str,
    "answer": str,
    "token_ids": bytes,
    "generation_s": float,
    "created": float,
    "last_used": float,
    "hits": int,
    "embedding": bytes,
    "sampled": int,
    "tools": str,
}
_SELECT = ", ".join(_COLUMNS)
T = TypeVar("T")


class CacheError(Exception):
    """The answer cache could not do what was asked; the message says why and what to do."""


@dataclass(frozen=True)
class Entry:
    id: int
    model_key: str
    model_name: str
    weight_hash: str
    dtype: str
    quant: str
    context_hash: str
    question_key: str
    question_norm: str | None  # None for a huge question (only its hash is kept)
    question: str
    answer: str
    token_ids: tuple[int, ...]
    generation_s: float
    created: float
    last_used: float
    hits: int
    embedding: bytes | None
    sampled: bool
    tools: tuple[str, ...]

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Entry:
        values = dict(zip(_COLUMNS, row, strict=True))
        values["token_ids"] = tuple(int(i) for i in np.frombuffer(values["token_ids"] or b"", dtype="<i4"))
        values["sampled"] = bool(values["sampled"])
        values["tools"] = tuple(json.loads(values["tools"] or "[]"))
        return cls(**values)


def _v1(db: Database) -> None:
    db[ENTRIES].create(  # type: ignore[union-attr]
        {name: kind for name, kind in _COLUMNS.items()},
        pk="id",
        not_null={"model_key", "context_hash", "question_key", "question", "answer", "created", "last_used"},
        defaults={"hits": 0, "sampled": 0, "tools": "[]", "generation_s": 0.0},
    )
    db.execute(f"CREATE UNIQUE INDEX {ENTRIES}_key ON {ENTRIES} (model_key, context_hash, question_key)")
    db.execute(f"CREATE INDEX {ENTRIES}_lru ON {ENTRIES} (last_used)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {STATS} (name TEXT PRIMARY KEY, value REAL NOT NULL)")
    db.execute(f"INSERT OR IGNORE INTO {STATS} (name, value) VALUES " + ", ".join(f"('{c}', 0)" for c in COUNTERS))


def _v2(db: Database) -> None:
    # Finding the entries still to embed must not scan every stored vector.
    db.execute(f"CREATE INDEX {ENTRIES}_unembedded ON {ENTRIES} (model_key) WHERE embedding IS NULL")


def _legacy_version(db: Database) -> int:
    """The version a file from before the shared bookkeeping kept in ``answer_cache_meta`` (0: none)."""
    if not db[META].exists():
        return 0
    row = db.execute(f"SELECT value FROM {META} WHERE key = 'schema_version'").fetchone()
    try:
        return max(0, int(row[0])) if row else 0
    except (TypeError, ValueError):  # not a number: take the tables as current; the health check decides
        return len(MIGRATIONS)


MIGRATIONS: list[Callable[[Database], None]] = [_v1, _v2]
ANSWERS = Schema(CACHE, MIGRATIONS, legacy_version=_legacy_version, legacy_tables=(META,))
assert {ENTRIES, STATS, META} <= CACHE_TABLES  # engine.storage.db may drop only these when they are damaged


class CacheStore:
    def __init__(self, path: str | Path, busy_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        try:
            self.file = SQLiteFile(self.path, busy_timeout_ms=int(busy_timeout_s * 1000), label="answer cache")
        except StoreError as exc:
            raise CacheError(str(exc)) from exc
        self.db = self.file.db
        self._lock = self.file.lock
        self.rebuilt = int(self.file.cache_dropped)  # times damaged tables were rebuilt (shown to the user once)
        try:
            if self.file.read_only:
                raise CacheError(
                    f"The answer cache in {self.path} is read-only, so it is off. "
                    "Check the permissions of the file and its folder."
                )
            with self.file.op("set up the answer cache"):
                self.db.execute("PRAGMA synchronous = NORMAL")
            self._prepare()
        except BaseException:
            self.file.close()
            raise

    def close(self) -> None:
        try:
            self.file.close()
        except StoreError as exc:
            raise CacheError(str(exc)) from exc

    # -- schema --------------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Bring the tables up to date; damaged ones are dropped and built again, once."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    self.file.migrate(ANSWERS)
                    if self._healthy():
                        return
                except StoreError as exc:
                    if attempt or not is_corrupt(exc):
                        raise CacheError(str(exc)) from exc
                if attempt:
                    raise CacheError(
                        f"The answer cache in {self.path} is still damaged after it was rebuilt. "
                        "Turn the answer cache off in Settings, or move brisk.db aside to start anew."
                    )
                self._rebuild()

    def _healthy(self) -> bool:
        with self.file.op("check the answer cache"):
            columns = {row[1] for row in self.db.execute(f"PRAGMA table_info({ENTRIES})").fetchall()}
            if columns != set(_COLUMNS) or not self.db[STATS].exists():
                return False
            try:
                return all(self.db.execute(f"PRAGMA quick_check({t})").fetchone()[0] == "ok" for t in (ENTRIES, STATS))
            except sqlite3.DatabaseError:
                return False

    def _rebuild(self) -> None:
        """Drop the cache's own tables (nothing else can be dropped) and let the migrations make them again."""
        self.rebuilt += 1
        try:
            self.file.drop_cache()
        except StoreError as exc:
            raise CacheError(
                f"The answer cache in {self.path} is damaged and could not be rebuilt ({exc}). "
                "Turn the answer cache off in Settings, or close Brisk and move brisk.db aside."
            ) from exc

    def _run(self, action: str, fn: Callable[[Database], T], write: bool = False) -> T:
        """Run one operation; a damaged table is rebuilt and the operation run once more."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    with self.file.op(action, write=write) as db:
                        return fn(db)
                except StoreError as exc:
                    if attempt or not is_corrupt(exc):
                        raise CacheError(str(exc)) from exc
                self._rebuild()
                self._prepare()
            raise AssertionError("unreachable")

    # -- entries -------------------------------------------------------------------------------

    def upsert(self, values: dict[str, Any]) -> int:
        """Insert an entry, or replace the one with the same (model, context, question) key; returns its id."""
        now = time.time()
        row = {
            **values,
            "token_ids": np.asarray(values.get("token_ids", ()), dtype="<i4").tobytes(),
            "tools": json.dumps(list(values.get("tools", ()))),
            "sampled": int(bool(values.get("sampled"))),
            "created": values.get("created", now),
            "last_used": values.get("last_used", now),
            "hits": 0,
        }
        if row.get("question_norm") is not None and len(row["question_norm"]) > HUGE_CHARS:
            row["question_norm"] = None
        names = [n for n in _COLUMNS if n != "id" and n in row]
        updates = ", ".join(
            f"{n} = coalesce(excluded.{n}, {n})" if n == "embedding" else f"{n} = excluded.{n}"
            for n in names
            if n not in {"model_key", "context_hash", "question_key"}
        )
        sql = (
            f"INSERT INTO {ENTRIES} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)}) "
            f"ON CONFLICT (model_key, context_hash, question_key) DO UPDATE SET {updates} RETURNING id"
        )
        params = [row[n] for n in names]
        return self._run("save the answer in the cache", lambda db: int(db.execute(sql, params).fetchone()[0]), True)

    def _one(self, where: str, params: list[Any]) -> Entry | None:
        sql = f"SELECT {_SELECT} FROM {ENTRIES} WHERE {where}"
        row = self._run("read the answer cache", lambda db: db.execute(sql, params).fetchone())
        return Entry.from_row(row) if row else None

    def get(self, entry_id: int) -> Entry | None:
        return self._one("id = ?", [entry_id])

    def find_exact(self, model_key: str, context: str, question_key: str, since: float) -> Entry | None:
        where = "model_key = ? AND context_hash = ? AND question_key = ? AND created >= ?"
        return self._one(where, [model_key, context, question_key, since])

    def _rows(self, sql: str, params: list[Any]) -> list[Any]:
        return self._run("read the answer cache", lambda db: db.execute(sql, params).fetchall())

    def vectors(self, model_key: str) -> list[tuple[int, str, float, bytes]]:
        """(id, context hash, created, embedding) of that model's entries that have an embedding."""
        where = "model_key = ? AND embedding IS NOT NULL"
        sql = f"SELECT id, context_hash, created, embedding FROM {ENTRIES} WHERE {where}"
        return self._rows(sql, [model_key])

    def data_version(self) -> int:
        """Changes whenever another connection commits (not on this one's own writes)."""
        return int(self._rows("PRAGMA data_version", [])[0][0])

    def without_embedding(self, model_key: str, limit: int) -> list[tuple[int, str]]:
        sql = f"SELECT id, question FROM {ENTRIES} WHERE model_key = ? AND embedding IS NULL LIMIT ?"
        return self._rows(sql, [model_key, limit])

    def set_embeddings(self, pairs: list[tuple[int, bytes]]) -> None:
        sql = f"UPDATE {ENTRIES} SET embedding = ? WHERE id = ?"
        self._run("save question embeddings", lambda db: db.conn.executemany(sql, [(v, i) for i, v in pairs]), True)

    def recent(self, model_key: str, since: float, limit: int) -> list[tuple[int, str]]:
        """(id, original question) of that model's most recently used live entries."""
        sql = f"SELECT id, question FROM {ENTRIES} WHERE model_key = ? AND created >= ? ORDER BY last_used DESC LIMIT ?"
        return self._rows(sql, [model_key, since, limit])

    def questions(self, ids: list[int]) -> dict[int, str]:
        marks = ", ".join("?" for _ in ids)
        return dict(self._rows(f"SELECT id, question FROM {ENTRIES} WHERE id IN ({marks})", ids))

    def token_ids(self, ids: list[int]) -> dict[int, tuple[int, ...]]:
        marks = ", ".join("?" for _ in ids)
        rows = self._rows(f"SELECT id, token_ids FROM {ENTRIES} WHERE id IN ({marks})", ids)
        return {i: tuple(int(t) for t in np.frombuffer(b or b"", dtype="<i4")) for i, b in rows}

    # -- counters ------------------------------------------------------------------------------

    def record_lookup(self, hit_id: int | None = None, kind: str | None = None, saved_s: float = 0.0) -> None:
        """Count one lookup; for a hit, mark the entry used now and add the time it saved."""
        bumps = {"lookups": 1.0}
        if hit_id is not None and kind in ("exact", "semantic"):
            bumps[f"{kind}_hits"] = 1.0
            bumps["saved_s"] = max(0.0, saved_s)

        def write(db: Database) -> None:
            if hit_id is not None:
                db.execute(f"UPDATE {ENTRIES} SET hits = hits + 1, last_used = ? WHERE id = ?", [time.time(), hit_id])
            for name, amount in bumps.items():
                db.execute(f"UPDATE {STATS} SET value = value + ? WHERE name = ?", [amount, name])

        self._run("update the answer cache's counters", write, True)

    def counters(self) -> dict[str, float]:
        values = dict(self._rows(f"SELECT name, value FROM {STATS}", []))
        return {name: float(values.get(name, 0.0)) for name in COUNTERS}

    def count(self) -> int:
        return int(self._rows(f"SELECT count(*) FROM {ENTRIES}", [])[0][0])

    # -- removal -------------------------------------------------------------------------------

    def _delete(self, action: str, where: str, params: list[Any]) -> int:
        sql = f"DELETE FROM {ENTRIES} WHERE {where}"
        return self._run(action, lambda db: int(db.execute(sql, params).rowcount), True)

    def delete(self, entry_id: int) -> bool:
        return self._delete("delete the cached answer", "id = ?", [entry_id]) > 0

    def clear(self, reset_counters: bool = True) -> int:
        removed = self._delete("clear the answer cache", "1", [])
        if reset_counters:
            self._run("reset the answer cache's counters", lambda db: db.execute(f"UPDATE {STATS} SET value = 0"), True)
        return removed

    def delete_model(self, model_key: str, keep: bool = False) -> int:
        """Delete that model's entries (``keep``: every other model's instead)."""
        return self._delete("invalidate cached answers", f"model_key {'!=' if keep else '='} ?", [model_key])

    def delete_tool(self, tool: str) -> int:
        where = "EXISTS (SELECT 1 FROM json_each(tools) WHERE json_each.value = ?)"
        return self._delete("invalidate cached answers", where, [tool])

    def delete_older(self, before: float) -> int:
        return self._delete("remove expired answers", "created < ?", [before])

    def evict(self, max_entries: int) -> int:
        """Delete the least recently used entries beyond ``max_entries``."""
        where = f"id IN (SELECT id FROM {ENTRIES} ORDER BY last_used DESC, id DESC LIMIT -1 OFFSET ?)"
        return self._delete("evict old answers", where, [max(0, max_entries)])
