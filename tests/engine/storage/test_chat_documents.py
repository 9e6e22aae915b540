"""Tests for engine.storage.chat_documents: the documents attached to a chat, kept in the history file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from engine.storage import Store, chat_documents
from engine.storage import store as store_module

DOC = {"id": "a" * 64, "name": "report.pdf", "path": "/tmp/report.pdf", "chars": 12_000, "tokens": 3012}


def test_a_chats_documents_are_kept_in_order_once_each(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    other = {"id": "b" * 64, "name": "notes.md", "path": "", "chars": 80}
    with Store(path) as store:
        cid = store.create_conversation("With files", attached=[DOC, other, DOC])
        plain = store.create_conversation("Plain")
    with Store(path) as store:  # a restart reads them back
        assert store.get_conversation(cid).documents == [DOC, other | {"tokens": None}]
        assert store.get_conversation(plain).documents == []
        store.set_documents(cid, [other])
        assert [d["id"] for d in store.get_conversation(cid).documents] == ["b" * 64]
        store.set_documents(cid, [])
        assert store.get_conversation(cid).documents == []


def test_damaged_entries_read_as_nothing_attached() -> None:
    assert chat_documents.checked("{not json") == []
    assert chat_documents.checked('{"id": "x"}') == [], "an object, not a list"
    assert chat_documents.checked([{"name": "no id"}, 3, None, {"id": ""}]) == []
    (doc,) = chat_documents.checked([{"id": "c" * 64, "chars": -5, "tokens": True, "name": 7}])
    assert doc == {"id": "c" * 64, "name": "c" * 12, "path": "", "chars": 0, "tokens": None}


def test_an_older_history_gains_the_column_and_a_damaged_value_stays_harmless(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    db = sqlite_utils.Database(path)
    for migration in store_module.MIGRATIONS[:3]:
        migration(db)
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO conversations (id, title, system_prompt, created, updated) VALUES ('c1', 'Old', '', 1, 1)")
    db.close()
    with Store(path) as store:
        assert store.get_conversation("c1").documents == []
        store.set_documents("c1", [DOC])
    raw = sqlite3.connect(path)
    raw.execute("UPDATE conversations SET documents = '[{\"id\": 5}' WHERE id = 'c1'")
    raw.commit()
    raw.close()
    with Store(path) as store:
        assert store.get_conversation("c1").documents == []
        assert [c.title for c in store.list_conversations()] == ["Old"]
