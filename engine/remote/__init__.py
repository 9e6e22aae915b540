"""Remote engines: a :class:`~engine.api.Backend` over any OpenAI-compatible streaming server.

``RemoteBackend(on_event, base_url, model=None, api_key=None, ...)`` (see
:mod:`engine.remote.backend`), ``remote_backend(...)`` as a factory for
:class:`engine.client.Client`, ``list_models(base_url, api_key)`` for a
settings dialog, ``check_base_url(url)``, :class:`Limits` (deadlines and size caps for a
reply, overridable by ``BRISK_REMOTE_*``), :class:`RemoteError` (its message is
for the user and never holds the key), and :mod:`engine.remote.keys` for API
keys in the system keyring.
"""

from __future__ import annotations

from .backend import RemoteBackend, RemoteResult, list_models, remote_backend
from .errors import RemoteError, check_base_url
from .limits import Limits

__all__ = [
    "Limits",
    "RemoteBackend",
    "RemoteError",
    "RemoteResult",
    "check_base_url",
    "list_models",
    "remote_backend",
]
