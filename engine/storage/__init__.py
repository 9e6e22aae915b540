"""Storage: the chat history in SQLite and the user's settings file.  Imports no torch and no runtime.

Import from this package (``from engine.storage import Store, Settings``); the
modules inside may move.  The data folder's paths and its JSON state files
(``data_dir``, ``database_path``, ``atomic_write``, ``load_state``,
``StateError``) are offered here too: the window keeps its own state files
(the layout) the same way.  ``engine.storage.db`` (``connect``, ``Schema``,
``SQLiteFile``) opens the same database file for other table sets, such as an
answer cache, with the same checks, WAL, lock waiting and error messages.
"""

from engine.datafiles import StateError, load_state
from engine.paths import atomic_write, data_dir, database_path
from engine.storage import params
from engine.storage.db import NotFoundError, Schema, SQLiteFile, StoreError, connect
from engine.storage.settings import LOCAL, Settings
from engine.storage.store import Conversation, Message, Project, SearchHit, Store, StreamSaver

__all__ = [
    "LOCAL",
    "Conversation",
    "Message",
    "NotFoundError",
    "Project",
    "SQLiteFile",
    "Schema",
    "SearchHit",
    "Settings",
    "StateError",
    "Store",
    "StoreError",
    "StreamSaver",
    "atomic_write",
    "connect",
    "data_dir",
    "database_path",
    "load_state",
    "params",
]
