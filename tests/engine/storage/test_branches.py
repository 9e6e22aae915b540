"""Branches in the history file: a chat branched after a message, a tail fork, listing, deleting the parent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from engine.storage import NotFoundError, Store
from engine.storage import store as store_module
from engine.storage.store import SCHEMA_VERSION

DOCS = [{"id": "d" * 64, "name": "notes.txt", "path": "/tmp/notes.txt", "chars": 10, "tokens": 4}]


def _chat(store: Store, turns: int = 3) -> tuple[str, list[int]]:
    """A chat with a system prompt, its own parameters, one document and ``turns`` question-reply turns."""
    cid = store.create_conversation("Trip", "Be brief.", params={"temperature": 0.2}, attached=DOCS)
    ids = []
    for n in range(1, turns + 1):
        ids.append(store.add_message(cid, "user", f"question {n}"))
        ids.append(store.add_message(cid, "assistant", f"answer {n}", metrics={"ttft_s": n / 10}))
    return cid, ids


def _history(store: Store, cid: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(cid)]


def test_a_branch_holds_the_history_up_to_its_message_and_the_parents_settings(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, ids = _chat(store)
        store.new_version(ids[1])  # the first reply asked for again: the branch copies the version shown
        store.update_message(ids[1], "answer 1, again", status="done", metrics={"ttft_s": 0.3})
        branch = store.branch_conversation(cid, ids[3])
    with Store(tmp_path / "brisk.db") as store:  # read back from the file
        conversation = store.get_conversation(branch)
        assert (conversation.title, conversation.parent_id, conversation.branched_after) == (
            "Trip (branch)",
            cid,
            ids[3],
        )
        assert (conversation.system_prompt, conversation.params, conversation.documents) == (
            "Be brief.",
            {"temperature": 0.2},
            DOCS,
        )
        copied = store.messages(branch)
        assert [(m.role, m.content) for m in copied] == [
            ("user", "question 1"),
            ("assistant", "answer 1, again"),
            ("user", "question 2"),
            ("assistant", "answer 2"),
        ]
        assert [(m.version, m.versions) for m in copied] == [(1, 1)] * 4  # one line of history, no versions
        assert copied[3].metrics == {"ttft_s": 0.2}  # each reply keeps its own timings
        assert not {m.id for m in copied} & set(ids)
        assert len(store.messages(cid)) == 6 and store.messages(cid)[1].versions == 2  # the parent is as it was
        assert store.get_conversation(cid).parent_id is None


def test_a_branch_grows_apart_from_its_parent(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, ids = _chat(store, turns=1)
        branch = store.branch_conversation(cid, ids[1])
        store.add_message(branch, "user", "only in the branch")
        store.update_message(store.messages(branch)[1].id, "edited in the branch")
        assert _history(store, cid) == [("user", "question 1"), ("assistant", "answer 1")]
        nothing = store.branch_conversation(cid, None, title="Fresh start")
        assert (store.get_conversation(nothing).title, store.messages(nothing)) == ("Fresh start", [])
        again = store.branch_conversation(branch, None)
        assert store.get_conversation(again).title == "Trip (branch)"  # not "Trip (branch) (branch)"


def test_branching_after_a_message_of_another_chat_or_none_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, _ids = _chat(store, turns=1)
        other, other_ids = _chat(store, turns=1)
        before = len(store.list_conversations())
        with pytest.raises(NotFoundError):
            store.branch_conversation(cid, other_ids[0])
        with pytest.raises(NotFoundError):
            store.branch_conversation("gone", None)
        assert len(store.list_conversations()) == before  # nothing half made


def test_keep_last_turns_copies_the_system_prompt_and_the_newest_turns(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, ids = _chat(store, turns=4)
        tail = store.keep_last_turns(cid, 2)
        conversation = store.get_conversation(tail)
        assert (conversation.title, conversation.parent_id, conversation.branched_after) == (
            "Trip (last 2 turns)",
            cid,
            ids[-1],
        )
        assert (conversation.system_prompt, conversation.documents) == ("Be brief.", DOCS)
        assert _history(store, tail) == [
            ("user", "question 3"),
            ("assistant", "answer 3"),
            ("user", "question 4"),
            ("assistant", "answer 4"),
        ]
        assert _history(store, store.keep_last_turns(cid, 9)) == _history(store, cid)  # fewer turns: all of them
        assert store.get_conversation(store.keep_last_turns(cid, 1)).title == "Trip (last 1 turn)"
        with pytest.raises(ValueError, match="1 or more"):
            store.keep_last_turns(cid, 0)


def test_a_reply_still_streaming_is_copied_as_far_as_it_got(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid = store.create_conversation("Live")
        store.add_message(cid, "user", "Go on")
        reply = store.add_message(cid, "assistant", "half a", status="streaming")
        [_user, copied] = store.messages(store.branch_conversation(cid, reply))
        assert (copied.content, copied.status) == ("half a", "cancelled")
        assert store.messages(cid)[1].status == "streaming"


def test_listing_returns_branches_with_their_parent_and_deleting_the_parent_keeps_them(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        cid, ids = _chat(store)
        first = store.branch_conversation(cid, ids[1])
        nested = store.branch_conversation(first, store.messages(first)[0].id)
        tail = store.keep_last_turns(cid, 1)
        parents = {c.id: c.parent_id for c in store.list_conversations()}
        assert parents == {cid: None, first: cid, nested: first, tail: cid}
        assert [c.id for c in store.branches(cid)] == [tail, first]
        store.delete_conversation(cid)
    with Store(tmp_path / "brisk.db") as store:
        kept = {c.id: (c.parent_id, c.branched_after) for c in store.list_conversations()}
        assert kept == {
            first: (None, None),
            nested: (first, store.get_conversation(nested).branched_after),
            tail: (None, None),
        }
        assert _history(store, first) == [("user", "question 1"), ("assistant", "answer 1")]  # its own copies


def test_a_history_file_of_schema_5_gains_branches_with_its_chats_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    db = sqlite_utils.Database(path)  # a history file from before branches
    for migration in store_module.MIGRATIONS[:5]:
        migration(db)
    db.execute("PRAGMA user_version = 5")
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('old', 'Old chat', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('old', 'user', 'Hi', 1)")
    db.close()
    with Store(path) as store:
        old = store.get_conversation("old")
        assert (old.title, old.parent_id, old.branched_after) == ("Old chat", None, None)
        branch = store.branch_conversation("old", store.messages("old")[0].id)
        assert store.get_conversation(branch).parent_id == "old"
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) and SCHEMA_VERSION >= 6
    raw.close()


def test_each_version_of_a_reply_becomes_a_branch_of_that_message(tmp_path: Path) -> None:
    """Regenerate's versions as branches: showing a version and branching after it gives a chat that goes on
    from that version, and the parent keeps every version."""
    with Store(tmp_path / "brisk.db") as store:
        cid, ids = _chat(store, turns=1)
        store.new_version(ids[1])
        store.update_message(ids[1], "answer 1, again", status="done")
        branches = {}
        for number in (1, 2):
            store.show_version(ids[1], number)
            branches[number] = store.branch_conversation(cid, ids[1])
        assert {n: _history(store, b)[-1] for n, b in branches.items()} == {
            1: ("assistant", "answer 1"),
            2: ("assistant", "answer 1, again"),
        }
        assert all(store.get_conversation(b).parent_id == cid for b in branches.values())
        assert [m.content for m in store.versions(ids[1])] == ["answer 1", "answer 1, again"]
