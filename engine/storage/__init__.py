"""Storage: the chat history in SQLite and the user's settings file.  Imports no torch and no runtime.

Import from this package (``from engine.storage import Store, Settings``); the
modules inside may move.
"""

from engine.storage.settings import Settings
from engine.storage.store import Conversation, Message, NotFoundError, SearchHit, Store, StoreError, StreamSaver

__all__ = ["Conversation", "Message", "NotFoundError", "SearchHit", "Settings", "Store", "StoreError", "StreamSaver"]
