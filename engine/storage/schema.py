"""The chat history's tables, as a list of migrations (``HISTORY_SCHEMA``).

Each migration is a small function that takes the database one version up;
``engine.storage.db`` runs the pending ones, one transaction each, and records
the version in ``PRAGMA user_version``.  Never edit a released migration: add
a new one at the end.
"""

from __future__ import annotations

from sqlite_utils import Database

from engine.storage.db import HISTORY, Migration, Schema

TOKENIZER = "unicode61 remove_diacritics 2"  # no stemming: prefix search stays exact


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
    db.table("messages").enable_fts(["content"], create_triggers=True, tokenize=TOKENIZER)
    db.table("conversations").enable_fts(["title"], create_triggers=True, tokenize=TOKENIZER)


def _add_chat_params(db: Database) -> None:
    # a chat's own sampling values (engine.storage.params.ChatParams), only those set for it: JSON, '{}' = defaults
    db.execute("ALTER TABLE conversations ADD COLUMN params TEXT NOT NULL DEFAULT '{}'")


def _add_documents(db: Database) -> None:
    # the documents attached to a chat (engine.storage.chat_documents): a JSON list of {id, name, path, chars, tokens}
    db.execute("ALTER TABLE conversations ADD COLUMN documents TEXT NOT NULL DEFAULT '[]'")


def _add_versions(db: Database) -> None:
    # a reply asked for again keeps each answer: the message row holds the version shown (the one later turns
    # continue from; ``version`` is its number, from 1), ``message_versions`` every other one of that message
    db.execute("ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
    db.execute(
        """CREATE TABLE message_versions (
            message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            content TEXT NOT NULL,
            status TEXT NOT NULL,
            metrics TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL,
            PRIMARY KEY (message_id, number))"""
    )


def _add_branches(db: Database) -> None:
    # a chat branched off another (engine.storage.store.Store.branch_conversation, keep_last_turns): its parent
    # chat, and the parent's message it was branched after; NULL for a chat of its own (or whose parent went)
    db.execute("ALTER TABLE conversations ADD COLUMN parent_id TEXT REFERENCES conversations (id) ON DELETE SET NULL")
    db.execute("ALTER TABLE conversations ADD COLUMN branched_after INTEGER")
    db.execute("CREATE INDEX conversations_parent ON conversations (parent_id)")


def _add_projects(db: Database) -> None:
    # a folder of chats with its own system prompt, sampling values (params JSON, as a chat's) and documents (as
    # engine.storage.chat_documents checks them), which a new chat in it starts with; a chat's project, NULL for
    # none (deleting a project keeps its chats, outside any project)
    db.execute(
        """CREATE TABLE projects (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            params TEXT NOT NULL DEFAULT '{}',
            documents TEXT NOT NULL DEFAULT '[]',
            created REAL NOT NULL,
            updated REAL NOT NULL)"""
    )
    db.execute("ALTER TABLE conversations ADD COLUMN project_id TEXT REFERENCES projects (id) ON DELETE SET NULL")
    db.execute("CREATE INDEX conversations_project ON conversations (project_id)")


MIGRATIONS: list[Migration] = [
    _create_tables,
    _add_search,
    _add_chat_params,
    _add_documents,
    _add_versions,
    _add_branches,
    _add_projects,
]
HISTORY_SCHEMA = Schema(HISTORY, MIGRATIONS)
SCHEMA_VERSION = HISTORY_SCHEMA.version
