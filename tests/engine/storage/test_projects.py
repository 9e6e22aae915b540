"""Projects in the history file: made, listed with their chats, changed, deleted (chats kept), and a file of
schema 6 migrated."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from engine.storage import NotFoundError, Store
from engine.storage import store as store_module
from engine.storage.store import SCHEMA_VERSION

DOCS = [{"id": "d" * 64, "name": "guide.md", "path": "/tmp/guide.md", "chars": 900, "tokens": 210}]


def test_a_project_keeps_its_prompt_values_documents_and_chats(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        pid = store.create_project("  Trip   planning ", "Plan trips.", params={"temperature": 0.3}, attached=DOCS)
        inside = store.create_conversation("In it", "Plan trips.", project_id=pid)
        outside = store.create_conversation("Elsewhere")
        branch = store.branch_conversation(inside, None)  # a branch starts in its parent's project
        other = store.create_project("Another")
    with Store(tmp_path / "brisk.db") as store:  # read back from the file
        project = store.get_project(pid)
        assert (project.name, project.system_prompt, project.params, project.documents) == (
            "Trip planning",
            "Plan trips.",
            {"temperature": 0.3},
            DOCS,
        )
        assert [p.name for p in store.list_projects()] == ["Another", "Trip planning"]
        assert [c.id for c in store.project_chats(pid)] == [branch, inside]
        assert store.get_conversation(outside).project_id is None
        assert store.get_conversation(branch).parent_id == inside
        store.move_to_project(outside, pid)
        store.move_to_project(inside, other)
        assert {c.id for c in store.project_chats(pid)} == {branch, outside}
        store.move_to_project(outside, None)
        assert store.get_conversation(outside).project_id is None
        store.rename_project(pid, "Trips")
        store.set_project_prompt(pid, "Plan short trips.")
        store.set_project_params(pid, {"temperature": 0.0})
        store.set_project_documents(pid, [])
        changed = store.get_project(pid)
        assert (changed.name, changed.system_prompt, changed.params, changed.documents) == (
            "Trips",
            "Plan short trips.",
            {"temperature": 0.0},
            [],
        )
        assert store.get_conversation(branch).system_prompt == "Plan trips."  # its chats keep their own


def test_deleting_a_project_keeps_its_chats_outside_any_project(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        pid = store.create_project("Work")
        cid = store.create_conversation("Notes", project_id=pid)
        store.add_message(cid, "user", "keep me")
        store.delete_project(pid)
        with pytest.raises(NotFoundError):
            store.get_project(pid)
        with pytest.raises(NotFoundError):
            store.delete_project(pid)
        assert store.get_conversation(cid).project_id is None
        assert [m.content for m in store.messages(cid)] == ["keep me"]


def test_bad_project_calls_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "brisk.db") as store:
        with pytest.raises(ValueError, match="needs a name"):
            store.create_project("   ")
        with pytest.raises(NotFoundError):
            store.create_conversation("x", project_id="missing")
        cid = store.create_conversation("x")
        with pytest.raises(NotFoundError):
            store.move_to_project(cid, "missing")
        with pytest.raises(NotFoundError):
            store.set_project_prompt("missing", "text")
        assert store.list_projects() == [] and [c.id for c in store.list_conversations()] == [cid]


def test_a_history_file_of_schema_6_gains_projects_with_its_chats_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "brisk.db"
    db = sqlite_utils.Database(path)  # a history file from before projects
    for migration in store_module.MIGRATIONS[:6]:
        migration(db)
    db.execute("PRAGMA user_version = 6")
    db.execute(
        "INSERT INTO conversations (id, title, system_prompt, created, updated) VALUES ('old', 'Old', 'Hi.', 1, 1)"
    )
    db.execute("INSERT INTO conversations (id, title, parent_id, created, updated) VALUES ('kid', 'Kid', 'old', 2, 2)")
    db.close()
    with Store(path) as store:
        old = store.get_conversation("old")
        assert (old.title, old.system_prompt, old.project_id) == ("Old", "Hi.", None)
        assert store.get_conversation("kid").parent_id == "old"
        assert store.list_projects() == []
        pid = store.create_project("New")
        store.move_to_project("old", pid)
        assert [c.id for c in store.project_chats(pid)] == ["old"]
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (7,)
    raw.close()
