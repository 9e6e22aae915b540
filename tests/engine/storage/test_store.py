"""Tests for engine.storage.store: CRUD, search, export, migrations, streaming saves and failure modes."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils

from engine.storage import NotFoundError, Store, StoreError, StreamSaver
from engine.storage import store as store_module
from engine.storage.store import MARK_CLOSE, MARK_OPEN, SCHEMA_VERSION


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(None)
    yield s
    s.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "brisk.db"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def _filled(path: Path) -> tuple[str, int]:
    """A closed file store holding one conversation with one message."""
    with Store(path) as s:
        cid = s.create_conversation("Kept")
        mid = s.add_message(cid, "user", "precious words")
    return cid, mid


# -- conversations -----------------------------------------------------------------


def test_create_and_get_conversation(store: Store) -> None:
    cid = store.create_conversation("Trip", system_prompt="be brief")
    assert len(cid) == 32 and int(cid, 16) >= 0
    conv = store.get_conversation(cid)
    assert (conv.id, conv.title, conv.system_prompt) == (cid, "Trip", "be brief")
    assert conv.created <= conv.updated
    assert store.get_conversation(store.create_conversation()).title == "New chat"


def test_missing_conversation_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="No conversation") as info:
        store.get_conversation("nope")
    assert isinstance(info.value, StoreError) and isinstance(info.value, KeyError)
    for call in (
        lambda: store.rename_conversation("nope", "x"),
        lambda: store.set_system_prompt("nope", "x"),
        lambda: store.delete_conversation("nope"),
        lambda: store.add_message("nope", "user", "hi"),
        lambda: store.messages("nope"),
        lambda: store.update_message(12345, "x"),
    ):
        with pytest.raises(NotFoundError):
            call()


def test_list_is_most_recently_updated_first(store: Store) -> None:
    a, b, c = (store.create_conversation(t) for t in "abc")
    assert [x.id for x in store.list_conversations()] == [c, b, a]
    mid = store.add_message(a, "user", "hi")
    assert [x.id for x in store.list_conversations()] == [a, c, b]
    store.rename_conversation(b, "bee")
    assert [x.id for x in store.list_conversations()] == [b, a, c]
    store.update_message(mid, "hello")
    assert [x.id for x in store.list_conversations()] == [a, b, c]


def test_rename_and_system_prompt(store: Store) -> None:
    cid = store.create_conversation("old")
    store.rename_conversation(cid, "new")
    store.set_system_prompt(cid, "You are terse.")
    conv = store.get_conversation(cid)
    assert (conv.title, conv.system_prompt) == ("new", "You are terse.")


def test_delete_conversation_removes_its_messages(db_path: Path) -> None:
    with Store(db_path) as s:
        gone, kept = s.create_conversation("gone"), s.create_conversation("kept")
        s.add_message(gone, "user", "zebra one")
        s.add_message(gone, "assistant", "zebra two")
        s.add_message(kept, "user", "zebra three")
        s.delete_conversation(gone)
        assert [c.id for c in s.list_conversations()] == [kept]
        assert [h.conversation_id for h in s.search("zebra")] == [kept]
        with pytest.raises(NotFoundError):
            s.messages(gone)
    raw = _raw(db_path)
    assert raw.execute("SELECT count(*) FROM messages WHERE conversation_id = ?", [gone]).fetchone() == (0,)
    assert raw.execute("SELECT count(*) FROM messages").fetchone() == (1,)
    raw.close()


# -- messages ----------------------------------------------------------------------


def test_messages_round_trip_in_order(store: Store) -> None:
    cid = store.create_conversation()
    ids = [
        store.add_message(cid, "system", "rules"),
        store.add_message(cid, "user", "question"),
        store.add_message(cid, "assistant", "answer", status="error", metrics={"tps": 12.5, "tokens": 3}),
    ]
    got = store.messages(cid)
    assert [m.id for m in got] == ids == sorted(ids)
    assert [(m.role, m.content, m.status) for m in got] == [
        ("system", "rules", "done"),
        ("user", "question", "done"),
        ("assistant", "answer", "error"),
    ]
    assert got[2].metrics == {"tps": 12.5, "tokens": 3} and got[0].metrics == {}
    assert all(m.conversation_id == cid for m in got)


def test_add_message_rejects_bad_input(store: Store) -> None:
    cid = store.create_conversation()
    with pytest.raises(ValueError, match="role"):
        store.add_message(cid, "robot", "hi")
    with pytest.raises(ValueError, match="status"):
        store.add_message(cid, "user", "hi", status="finished")
    with pytest.raises(ValueError, match="metrics"):
        store.add_message(cid, "user", "hi", metrics={"bad": object()})
    assert store.messages(cid) == []


def test_update_message_keeps_what_is_not_given(store: Store) -> None:
    cid = store.create_conversation()
    mid = store.add_message(cid, "assistant", "", status="streaming", metrics={"a": 1})
    store.update_message(mid, "partial")
    (m,) = store.messages(cid)
    assert (m.content, m.status, m.metrics) == ("partial", "streaming", {"a": 1})
    store.update_message(mid, "full", status="done", metrics={"b": 2})
    (m,) = store.messages(cid)
    assert (m.content, m.status, m.metrics) == ("full", "done", {"b": 2})
    with pytest.raises(ValueError):
        store.update_message(mid, "x", status="bogus")


def test_delete_messages_from(store: Store) -> None:
    cid, other = store.create_conversation(), store.create_conversation()
    ids = [store.add_message(cid, role, str(i)) for i, role in enumerate(["user", "assistant"] * 3)]
    other_id = store.add_message(other, "user", "elsewhere")
    store.delete_messages_from(cid, ids[3])
    assert [m.id for m in store.messages(cid)] == ids[:3]
    assert [m.id for m in store.messages(other)] == [other_id]
    with pytest.raises(NotFoundError):  # a message of another conversation is refused
        store.delete_messages_from(cid, other_id)
    with pytest.raises(NotFoundError):
        store.delete_messages_from(cid, ids[4])  # already deleted
    assert [m.id for m in store.messages(cid)] == ids[:3]


def test_recover_streaming(store: Store) -> None:
    cid = store.create_conversation()
    done = store.add_message(cid, "assistant", "ok")
    stuck = [store.add_message(cid, "assistant", "half", status="streaming") for _ in range(2)]
    assert store.recover_streaming() == 2
    statuses = {m.id: m.status for m in store.messages(cid)}
    assert statuses == {done: "done", stuck[0]: "cancelled", stuck[1]: "cancelled"}
    assert store.recover_streaming() == 0


# -- search and export -------------------------------------------------------------------


def test_search_messages_and_titles(store: Store) -> None:
    trip = store.create_conversation("Trip to Zürich")
    code = store.create_conversation("Python help")
    m1 = store.add_message(trip, "user", "Which trains leave for the mountains?")
    m2 = store.add_message(code, "assistant", "Use a list comprehension for the trains example.")

    (hit,) = store.search("zurich")  # diacritics folded, title match
    assert (hit.conversation_id, hit.message_id, hit.title) == (trip, None, "Trip to Zürich")
    assert f"{MARK_OPEN}Zürich{MARK_CLOSE}" in hit.snippet

    assert {(h.conversation_id, h.message_id) for h in store.search("train")} == {(trip, m1), (code, m2)}
    (hit,) = store.search("mount trai")  # every word, each as a prefix
    assert (hit.message_id, hit.title) == (m1, "Trip to Zürich")
    assert f"{MARK_OPEN}mountains{MARK_CLOSE}" in hit.snippet
    assert len(store.search("train", limit=1)) == 1
    assert store.search("submarine") == []


def test_search_follows_edits_and_deletes(store: Store) -> None:
    cid = store.create_conversation()
    mid = store.add_message(cid, "assistant", "", status="streaming")
    store.update_message(mid, "quokka facts")
    assert [h.message_id for h in store.search("quokka")] == [mid]
    store.update_message(mid, "wombat facts")
    assert store.search("quokka") == []
    store.delete_messages_from(cid, mid)
    assert store.search("wombat") == []


@pytest.mark.parametrize(
    "query",
    ['"', '""', "AND OR", "OR", "NOT", "*", "NEAR(", "NEAR(a b", "a AND", "(", ")", "^", "-x", "col:x",
     "content:x", "a\x00b", "'; DROP TABLE messages; --", "\\", "{a b}", "+", "x*y", "é\"*"],
)  # fmt: skip
def test_hostile_queries_never_raise(store: Store, query: str) -> None:
    cid = store.create_conversation("NEAR and far")
    store.add_message(cid, "user", "a AND b OR c NOT d; x y z")
    hits = store.search(query)
    assert isinstance(hits, list)
    assert [m.content for m in store.messages(cid)] == ["a AND b OR c NOT d; x y z"]


def test_operator_words_are_searched_literally(store: Store) -> None:
    cid = store.create_conversation()
    mid = store.add_message(cid, "user", "cats AND dogs")
    store.add_message(cid, "user", "cats only")
    assert [h.message_id for h in store.search("cats AND dogs")] == [mid]
    assert [h.message_id for h in store.search('"dogs')] == [mid]


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_returns_nothing(store: Store, query: str) -> None:
    store.add_message(store.create_conversation(), "user", "anything")
    assert store.search(query) == []


def test_export_markdown(store: Store) -> None:
    cid = store.create_conversation("Greeting", system_prompt="Be kind.")
    store.add_message(cid, "user", "Hi **there**")
    store.add_message(cid, "assistant", "Hello!")
    store.add_message(cid, "assistant", "Half a", status="cancelled")
    assert store.export_markdown(cid) == (
        "# Greeting\n\n**System prompt**\n\nBe kind.\n\n**User**\n\nHi **there**\n\n"
        "**Assistant**\n\nHello!\n\n**Assistant**\n\nHalf a\n\n*(stopped before the end)*\n"
    )
    bare = store.create_conversation("Empty")
    assert store.export_markdown(bare) == "# Empty\n"


# -- files, migrations, WAL -----------------------------------------------------------


def test_fresh_file_is_migrated_and_in_wal_mode(db_path: Path) -> None:
    Store(db_path).close()
    raw = _raw(db_path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "messages", "messages_fts", "conversations_fts"} <= tables
    raw.close()


def test_reopen_keeps_data_and_changes_no_schema(db_path: Path) -> None:
    cid, mid = _filled(db_path)
    raw = _raw(db_path)
    schema = raw.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    raw.close()
    for _ in range(2):
        with Store(db_path) as s:
            assert [m.id for m in s.messages(cid)] == [mid]
            assert [h.message_id for h in s.search("precious")] == [mid]
    raw = _raw(db_path)
    assert raw.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() == schema
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


def test_old_schema_is_upgraded_with_data_kept(db_path: Path) -> None:
    db = sqlite_utils.Database(db_path)
    store_module.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('c1', 'Old chat', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('c1', 'user', 'ancient', 1)")
    db.close()
    with Store(db_path) as s:
        assert [m.content for m in s.messages("c1")] == ["ancient"]
        assert [(h.conversation_id, h.message_id) for h in s.search("ancient")] == [("c1", 1)]
        assert [h.message_id for h in s.search("old")] == [None]
    raw = _raw(db_path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


def test_creates_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "brisk.db"
    with Store(path) as s:
        assert s.path == path
        s.create_conversation()
    assert path.is_file()


def test_closed_store_raises(store: Store) -> None:
    store.close()
    store.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        store.list_conversations()


def test_sqlite_errors_are_wrapped(db_path: Path) -> None:
    with Store(db_path) as s:
        cid = s.create_conversation()
        raw = _raw(db_path)
        raw.execute("DROP TABLE messages")
        raw.close()
        with pytest.raises(StoreError, match="messages") as info:
            s.messages(cid)
        assert isinstance(info.value.__cause__, sqlite3.Error)


# -- streaming saves ---------------------------------------------------------------------


def test_stream_saver_writes_at_most_once_per_interval(db_path: Path) -> None:
    s = Store(db_path)
    cid = s.create_conversation()
    mid = s.add_message(cid, "assistant", "", status="streaming")
    clock = FakeClock()
    writes: list[tuple[float, str]] = []
    real_update = s.update_message

    def spy(message_id: int, content: str, **kwargs: object) -> None:
        writes.append((clock.now, content))
        real_update(message_id, content, **kwargs)  # type: ignore[arg-type]

    s.update_message = spy  # type: ignore[method-assign]
    saver = StreamSaver(s, mid, interval=1.0, clock=clock)
    appended: list[tuple[float, str]] = []
    for i in range(23):
        clock.now = i * 0.25
        saver.append(f"w{i} ")
        appended.append((clock.now, f"w{i} "))
    assert [t for t, _ in writes] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # first at once, then one per interval
    assert saver.text == "".join(chunk for _, chunk in appended)

    # Crash: the saver is dropped without finish(); a new Store reads the file.
    del saver
    with Store(db_path) as after:
        (m,) = after.messages(cid)
        assert m.status == "streaming"
        last_write = writes[-1][0]
        assert m.content == "".join(chunk for t, chunk in appended if t <= last_write)
        lost = [t for t, _ in appended if t > last_write]
        assert lost and max(lost) - last_write < 1.0  # at most one interval behind
        assert after.recover_streaming() == 1
        assert after.messages(cid)[0].status == "cancelled"
    s.close()


def test_stream_saver_finish_writes_everything(store: Store) -> None:
    cid = store.create_conversation()
    mid = store.add_message(cid, "assistant", "", status="streaming")
    clock = FakeClock()
    saver = StreamSaver(store, mid, clock=clock)
    for word in ["a", "b", "c"]:
        saver.append(word)
    assert store.messages(cid)[0].content == "a"  # only the first append wrote
    saver.finish(metrics={"tokens": 3})
    (m,) = store.messages(cid)
    assert (m.content, m.status, m.metrics) == ("abc", "done", {"tokens": 3})
    with pytest.raises(RuntimeError):
        saver.append("d")


def test_stream_saver_keeps_text_when_a_write_fails(db_path: Path) -> None:
    s = Store(db_path, busy_timeout_ms=20)
    cid = s.create_conversation()
    mid = s.add_message(cid, "assistant", "", status="streaming")
    clock = FakeClock()
    saver = StreamSaver(s, mid, clock=clock)
    saver.append("one ")
    other = _raw(db_path)
    other.execute("BEGIN EXCLUSIVE")
    clock.now = 1.0
    with pytest.raises(StoreError, match="locked"):
        saver.append("two ")
    clock.now = 1.5
    saver.append("three")  # within the interval of the failed try: no new attempt, no error
    other.execute("ROLLBACK")
    other.close()
    saver.finish(status="cancelled")
    (m,) = s.messages(cid)
    assert (m.content, m.status) == ("one two three", "cancelled")
    s.close()


# -- damaged, locked, read-only, newer ---------------------------------------------------------


@pytest.fixture(scope="module")
def damaged_variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    path = tmp_path_factory.mktemp("good") / "brisk.db"
    _filled(path)
    with Store(path) as s:  # make the file a few pages long
        cid = s.create_conversation()
        for i in range(10):
            s.add_message(cid, "user", f"message {i} " * 600)
    good = path.read_bytes()
    assert len(good) > 5 * 4096
    return {
        "garbage": bytes(range(256)) * 20,
        "text": b"this is a text file, not a database\n" * 50,
        "truncated_half": good[: len(good) // 2],
        "truncated_header": good[:100],
        "scribbled_pages": good[:8192] + b"\xff" * 8192 + good[16384:],
    }


@pytest.mark.parametrize("kind", ["garbage", "text", "truncated_half", "truncated_header", "scribbled_pages"])
def test_damaged_file_is_reported_and_left_untouched(
    tmp_path: Path, damaged_variants: dict[str, bytes], kind: str
) -> None:
    blob = damaged_variants[kind]
    path = tmp_path / "brisk.db"
    path.write_bytes(blob)
    with pytest.raises(StoreError) as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message and "damaged" in message
    assert "Nothing was changed" in message and "Move the file aside" in message
    assert path.read_bytes() == blob


def test_foreign_database_is_refused_and_left_untouched(db_path: Path) -> None:
    raw = _raw(db_path)
    raw.execute("CREATE TABLE invoices (n)")
    raw.execute("INSERT INTO invoices VALUES (1)")
    raw.close()
    before = db_path.read_bytes()
    with pytest.raises(StoreError, match="not Brisk's"):
        Store(db_path)
    assert db_path.read_bytes() == before


def test_newer_schema_is_refused_and_left_untouched(db_path: Path) -> None:
    _filled(db_path)
    raw = _raw(db_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    before = db_path.read_bytes()
    with pytest.raises(StoreError, match="newer version of Brisk") as info:
        Store(db_path)
    assert "Update Brisk" in str(info.value) and str(db_path) in str(info.value)
    assert db_path.read_bytes() == before


def test_locked_database_refuses_writes_and_keeps_data(db_path: Path) -> None:
    cid, mid = _filled(db_path)
    s = Store(db_path, busy_timeout_ms=20)
    other = _raw(db_path)
    other.execute("BEGIN EXCLUSIVE")
    for write in (
        lambda: s.add_message(cid, "user", "lost?"),
        lambda: s.rename_conversation(cid, "renamed"),
        lambda: s.create_conversation(),
        lambda: s.delete_conversation(cid),
    ):
        with pytest.raises(StoreError, match="locked by another program") as info:
            write()
        assert str(db_path) in str(info.value)
    assert [m.id for m in s.messages(cid)] == [mid]  # reads still work in WAL mode
    other.execute("ROLLBACK")
    other.close()
    assert [(c.id, c.title) for c in s.list_conversations()] == [(cid, "Kept")]
    s.add_message(cid, "user", "after the lock")
    assert [m.content for m in s.messages(cid)] == ["precious words", "after the lock"]
    s.close()


def test_open_while_locked_is_a_clear_error(db_path: Path) -> None:
    other = _raw(db_path)
    other.execute("BEGIN EXCLUSIVE")  # a new file, locked before Brisk could set it up
    with pytest.raises(StoreError, match="locked by another program"):
        Store(db_path, busy_timeout_ms=20)
    other.execute("ROLLBACK")
    other.close()
    assert db_path.read_bytes() == b""


def _assert_read_only(s: Store, cid: str, mid: int, path: Path, before: bytes) -> None:
    assert s.read_only
    assert [m.id for m in s.messages(cid)] == [mid]
    assert [h.message_id for h in s.search("precious")] == [mid]
    assert s.recover_streaming() == 0  # nothing to do, so no write is attempted
    for write in (
        lambda: s.add_message(cid, "user", "x"),
        lambda: s.update_message(mid, "x"),
        lambda: s.rename_conversation(cid, "x"),
        lambda: s.delete_messages_from(cid, mid),
        lambda: s.delete_conversation(cid),
        lambda: s.create_conversation(),
    ):
        with pytest.raises(StoreError, match="read-only") as info:
            write()
        assert str(path) in str(info.value)
    s.close()
    assert path.read_bytes() == before


def test_read_only_flag(db_path: Path) -> None:
    cid, mid = _filled(db_path)
    before = db_path.read_bytes()
    _assert_read_only(Store(db_path, read_only=True), cid, mid, db_path, before)


def test_read_only_connection_refuses_writes_itself(db_path: Path) -> None:
    # Bypass the up-front check: SQLite's own refusal must also become a clear StoreError.
    cid, mid = _filled(db_path)
    s = Store(db_path, read_only=True)
    s.read_only = False
    with pytest.raises(StoreError, match="read-only"):
        s.add_message(cid, "user", "x")
    assert [m.id for m in s.messages(cid)] == [mid]
    s.close()


def test_unwritable_file_opens_read_only(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cid, mid = _filled(db_path)
    db_path.chmod(0o444)
    if os.geteuid() == 0:  # root ignores file modes; make os.access answer as for a normal user
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: not mode & os.W_OK and real_access(p, mode, **kw))
    before = db_path.read_bytes()
    _assert_read_only(Store(db_path), cid, mid, db_path, before)


def test_read_only_needs_an_existing_current_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no chat database"):
        Store(tmp_path / "missing.db", read_only=True)
    old = tmp_path / "old.db"
    db = sqlite_utils.Database(old)
    store_module.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.close()
    with pytest.raises(StoreError, match="read-only"):
        Store(old, read_only=True)


def test_folder_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a folder"):
        Store(tmp_path)


# -- damaged rows ---------------------------------------------------------------------------------


def test_damaged_rows_are_marked_and_the_others_load(db_path: Path) -> None:
    with Store(db_path) as s:
        cid = s.create_conversation("Mixed")
        good = s.add_message(cid, "user", "fine", metrics={"tokens_per_s": 3.5})
        bad_ids = [s.add_message(cid, "assistant", f"bad {i}") for i in range(6)]
        last = s.add_message(cid, "assistant", "also fine")
    raw = _raw(db_path)
    breakage = [
        ("metrics", "{not json"),
        ("metrics", "[1, 2]"),
        ("metrics", "null"),
        ("role", "robot"),
        ("status", "exploded"),
        ("content", b"\xff\xfe bytes"),
    ]
    for mid, (column, value) in zip(bad_ids, breakage, strict=True):
        raw.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", [value, mid])
    raw.close()
    with Store(db_path) as s:
        messages = s.messages(cid)
        assert [m.id for m in messages] == [good, *bad_ids, last]
        by_id = {m.id: m for m in messages}
        assert not by_id[good].damaged and by_id[good].metrics == {"tokens_per_s": 3.5}
        assert not by_id[last].damaged and by_id[last].content == "also fine"
        assert all(by_id[mid].damaged for mid in bad_ids)
        assert all(by_id[mid].metrics == {} for mid in bad_ids[:3])
        assert by_id[bad_ids[0]].content == "bad 0", "what could be read is kept"
        assert by_id[bad_ids[4]].status == "error"
        assert isinstance(by_id[bad_ids[5]].content, str)
        markdown = s.export_markdown(cid)
        assert "also fine" in markdown and "**Robot**" in markdown and "damaged" in markdown
        assert [c.id for c in s.list_conversations()] == [cid]
