"""Which engine a reply runs on: the local model or a saved server (no Qt).

``Settings.engine`` is ``"local"`` or the name of one of ``Settings.servers``
(``{name, base_url, model}``; an API key is never a settings field: it lives
in the system keyring, or for this session only, through
:mod:`engine.remote.keys`).  :func:`engine_choice` turns the settings into an
:class:`EngineChoice`: the key the bridge knows it by, the backend factory
(``None``: the bridge's local one) and the :class:`~engine.api.ModelSpec` to
load.  A server's key changes when its URL, model or API key does
(:func:`save_key` counts each key change), so the window rebuilds the backend
exactly when something it was built with changed.

The server's backend is :class:`engine.remote.RemoteBackend`, imported only
when a server is chosen (the ``openai`` SDK is not needed for the local
model); its key is read from the keyring on the bridge's worker thread, never
on the GUI thread.  Its ``Loaded`` event gets ``ModelInfo.endpoint`` (the
server's base URL) where the backend leaves it empty, so the status bar and
the latency panel can say where replies come from.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.state.session import model_spec
from engine import client
from engine.api import Backend, Loaded, ModelSpec, OnEvent
from engine.client import BackendFactory
from engine.storage import Settings
from engine.storage.settings import LOCAL

Server = Mapping[str, str]  # {name, base_url, model}

_generation: dict[str, int] = {}  # base URL -> how many times its key was changed this session
_generation_lock = threading.Lock()


@dataclass(frozen=True)
class EngineChoice:
    key: str  # EngineBridge.use_engine's key: equal keys share one backend
    factory: BackendFactory | None  # None: the bridge's local engine
    spec: ModelSpec
    server: Server | None = None


def server_named(servers: Sequence[Server], name: str) -> Server | None:
    return next((s for s in servers if s.get("name") == name), None)


def active_server(settings: Settings) -> Server | None:
    """The server replies go to, or None for the local model."""
    return None if settings.engine == LOCAL else server_named(settings.servers, settings.engine)


def engine_choice(settings: Settings, model_override: str | None = None) -> EngineChoice:
    server = active_server(settings)
    if server is None:
        return EngineChoice(LOCAL, None, model_spec(settings, model_override))
    base_url, model = server["base_url"], server.get("model", "")
    with _generation_lock:
        generation = _generation.get(_normal(base_url), 0)
    key = f"server\n{server['name']}\n{base_url}\n{model}\n{generation}"
    return EngineChoice(key, server_factory(base_url, model), ModelSpec(source=model), server)


def server_factory(base_url: str, model: str = "") -> BackendFactory:
    """A factory for the bridge: a :class:`engine.remote.RemoteBackend` with the key kept for ``base_url``."""

    def make(on_event: OnEvent) -> Backend:
        api_key = client.server_key(base_url) or None  # the keyring may be slow: this runs on the bridge's worker
        where: list[str] = []  # the backend's checked base URL, once it is built

        def forward(event: object) -> None:
            if isinstance(event, Loaded) and event.device == "remote" and not event.info.endpoint and where:
                event = dataclasses.replace(event, info=dataclasses.replace(event.info, endpoint=where[0]))
            on_event(event)

        backend = client.server_backend(forward, base_url, model or None, api_key)
        where.append(backend.base_url)
        return backend

    return make


def save_key(base_url: str, api_key: str) -> bool:
    """Keep ``api_key`` for ``base_url`` ("" forgets it); True when it outlives this session (the keyring)."""
    persistent = client.keep_server_key(base_url, api_key)
    with _generation_lock:
        name = _normal(base_url)
        _generation[name] = _generation.get(name, 0) + 1
    return persistent


def load_key(base_url: str) -> str:
    """The key kept for ``base_url`` ("" when none or the URL is not valid)."""
    return client.server_key(base_url)


def keys_persist() -> bool:
    """True when API keys go to the system keyring; False: they last this session only."""
    return client.server_keys_persist()


def list_server_models(base_url: str, api_key: str) -> list[str]:
    """The model ids the server lists at /v1/models (slow: call it off the GUI thread); RemoteError says why not."""
    return client.server_models(base_url, api_key)


def _normal(base_url: str) -> str:
    """The URL as the key generation counts it (no import of the SDK: this runs on the GUI thread)."""
    return base_url.strip().rstrip("/").lower()
