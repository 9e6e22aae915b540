"""engine.storage.db: another table set shares the chat history's file, checks and errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from engine.storage import Schema, Store, StoreError, connect
from engine.storage.db import APPLICATION_ID


def _answers_v1(db: Database) -> None:
    db.execute("CREATE TABLE answers (question TEXT PRIMARY KEY, answer TEXT NOT NULL)")


def _answers_v2(db: Database) -> None:
    db.execute("ALTER TABLE answers ADD COLUMN hits INTEGER NOT NULL DEFAULT 0")


ANSWERS = Schema("answers", (_answers_v1, _answers_v2))


def test_a_second_schema_shares_the_file_in_either_order(tmp_path: Path) -> None:
    for first in ("answers", "history"):
        path = tmp_path / f"{first}-first.db"
        if first == "history":
            Store(path).close()
        answers = connect(path, ANSWERS)
        with answers.op("save an answer", write=True) as db:
            db.execute("INSERT INTO answers (question, answer) VALUES ('q', 'a')")
        with Store(path) as store:  # not refused as "not Brisk's"
            cid = store.create_conversation("both")
            store.add_message(cid, "user", "hello")
        answers.close()
        raw = sqlite3.connect(path)
        assert raw.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        assert raw.execute("SELECT version FROM brisk_schema WHERE name = 'answers'").fetchone() == (2,)
        assert raw.execute("SELECT question, answer, hits FROM answers").fetchall() == [("q", "a", 0)]
        raw.close()
        again = connect(path, ANSWERS)  # nothing pending: opens without writing
        assert again.version(ANSWERS) == 2
        again.close()


def test_a_schema_is_upgraded_step_by_step(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    connect(path, Schema("answers", (_answers_v1,))).close()
    file = connect(path, ANSWERS)
    with file.op("read") as db:
        assert [c.name for c in db["answers"].columns] == ["question", "answer", "hits"]
    file.close()


def test_a_newer_schema_of_a_table_set_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    connect(path, ANSWERS).close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer version of Brisk"):
        connect(path, Schema("answers", (_answers_v1,)))
    assert path.read_bytes() == before


def test_errors_are_translated_with_the_label(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    file = connect(path, ANSWERS, label="answer cache")
    with pytest.raises(StoreError, match="answer cache") as info, file.op("save an answer", write=True) as db:
        db.execute("INSERT INTO nowhere VALUES (1)")
    assert isinstance(info.value.__cause__, sqlite3.Error)
    file.close()
    with pytest.raises(StoreError, match="closed"), file.op("read"):
        pass


def test_a_failed_migration_changes_nothing(tmp_path: Path) -> None:
    def broken(db: Database) -> None:
        db.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("simulated failure")

    path = tmp_path / "brisk.db"
    with pytest.raises(StoreError, match="simulated failure"):
        connect(path, Schema("broken", (broken,)))
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
    raw.close()
