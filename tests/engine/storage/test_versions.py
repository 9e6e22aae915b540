"""A reply's versions in the history file: kept on regenerate, switched, deleted with their message, migrated."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from engine.storage import NotFoundError, Store, StoreError
from engine.storage import store as store_module
from engine.storage.store import SCHEMA_VERSION


def _chat(store: Store) -> tuple[str, int]:
    """A chat of one question and its reply (version 1, with its own timings)."""
    cid = store.create_conversation("Versions")
    store.add_message(cid, "user", "Tell me a story")
    mid = store.add_message(cid, "assistant", "Once upon a time", metrics={"ttft_s": 0.5})
    return cid, mid


def test_a_new_version_keeps_the_old_one_and_streams_in_its_place(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    with Store(path) as store:
        cid, mid = _chat(store)
        assert (store.message(mid).version, store.message(mid).versions) == (1, 1)
        assert store.new_version(mid) == 2
        shown = store.message(mid)
        assert (shown.content, shown.status, shown.metrics, shown.version, shown.versions) == (
            "",
            "streaming",
            {},
            2,
            2,
        )
        store.update_message(mid, "A long time ago", status="done", metrics={"ttft_s": 0.25})
        assert store.new_version(mid) == 3
        store.update_message(mid, "In a land far away", status="done", metrics={"ttft_s": 0.125})
    with Store(path) as store:  # all three kept across a reopen, each with its own timings
        versions = store.versions(mid)
        assert [(m.version, m.versions, m.content, m.metrics["ttft_s"]) for m in versions] == [
            (1, 3, "Once upon a time", 0.5),
            (2, 3, "A long time ago", 0.25),
            (3, 3, "In a land far away", 0.125),
        ]
        [_user, reply] = store.messages(cid)
        assert (reply.id, reply.content, reply.version, reply.versions) == (mid, "In a land far away", 3, 3)


def test_showing_a_version_swaps_it_in_and_later_turns_read_it(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, mid = _chat(store)
        store.new_version(mid)
        store.update_message(mid, "Second", status="done", metrics={"ttft_s": 0.2})
        shown = store.show_version(mid, 1)
        assert (shown.content, shown.version, shown.versions, shown.metrics) == (
            "Once upon a time",
            1,
            2,
            {"ttft_s": 0.5},
        )
        assert [m.content for m in store.messages(cid)] == ["Tell me a story", "Once upon a time"]
        assert [h.message_id for h in store.search("upon")] == [mid], "search reads the version shown"
        assert store.search("Second") == []
        assert "Once upon a time" in store.export_markdown(cid)
        assert store.show_version(mid, 2).content == "Second"
        assert [m.content for m in store.versions(mid)] == ["Once upon a time", "Second"]
        assert store.show_version(mid, 2).content == "Second", "the version shown already: nothing changes"
        with pytest.raises(NotFoundError):
            store.show_version(mid, 7)
        store.new_version(mid)  # regenerating an earlier version's place: the new one is the highest
        assert store.message(mid).version == 3
        with pytest.raises(StoreError, match="still being written"):
            store.show_version(mid, 1)


def test_versions_go_with_their_message(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    with Store(path) as store:
        cid, mid = _chat(store)
        store.new_version(mid)
        store.update_message(mid, "Again", status="done")
        other, other_mid = _chat(store)
        store.new_version(other_mid)
        store.delete_messages_from(cid, mid)
        store.delete_conversation(other)
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT count(*) FROM message_versions").fetchone() == (0,)
    raw.close()


def test_an_older_history_file_is_migrated_with_each_reply_as_its_only_version(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    db = sqlite_utils.Database(path)  # a history file of schema 4, before versions
    for migration in store_module.MIGRATIONS[:4]:
        migration(db)
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('old', 'Old chat', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('old', 'user', 'Hi', 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('old', 'assistant', 'Hey', 1)")
    db.close()
    with Store(path) as store:
        [_user, reply] = store.messages("old")
        assert (reply.content, reply.version, reply.versions) == ("Hey", 1, 1)
        assert store.new_version(reply.id) == 2
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


def test_a_damaged_version_number_reads_as_the_first(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    with Store(path) as store:
        cid, mid = _chat(store)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE messages SET version = 'x' WHERE id = ?", [mid])
    raw.commit()
    raw.close()
    with Store(path) as store:
        reply = store.messages(cid)[1]
        assert (reply.version, reply.versions, reply.damaged, reply.content) == (1, 1, True, "Once upon a time")
        assert store.new_version(mid) == 2
