"""One synchronous client over a :class:`~engine.api.Backend`: the CLI, the benchmarks and the tests share it.

``Client(backend_factory)`` builds the backend with a queue as its event sink.
``load(spec)`` blocks until ``Loaded`` (warnings seen on the way are kept in
``warnings``) and raises :class:`LoadError` on ``LoadFailed``; ``stream(request)``
yields that request's events up to and including its ``Done`` or ``Error``;
``ask(messages, ...)`` returns the ``Done`` or raises :class:`RequestError`.
The default backend is the local engine thread (imported only then: it needs torch).

Every backend is built through a :class:`Router` (the client's, the window's bridge's): where the built-in
OpenAI-compatible server meets the backend, so that ``brisk serve`` and the window's Server switch submit
to the one ``Backend.submit`` and take their events back the same way.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from engine.api import (
    Backend,
    Done,
    DraftPrefill,
    Error,
    Event,
    Loaded,
    LoadFailed,
    ModelSpec,
    OnEvent,
    Request,
    Sampling,
    ServedReply,
    Warning,
)

if TYPE_CHECKING:
    from engine.documents.library import DocumentLibrary
    from engine.library.pull import PullProgress, PullResult
    from engine.library.scan import Library, ModelEntry
    from engine.remote import RemoteBackend
    from engine.server.control import LocalServer
    from engine.tools.registry import Tool

BackendFactory = Callable[[OnEvent], Backend]


class LoadError(Exception):
    """The model could not be loaded; the message is meant for the user."""


class RequestError(Exception):
    """A request ended with an ``Error`` event."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


def local_backend(prefix_cache_bytes: int | None = None, **options: Any) -> BackendFactory:
    """A factory for the local engine thread with these ``EngineOptions``."""

    def make(on_event: OnEvent) -> Backend:
        from engine.runtime.engine import Engine, EngineOptions

        if prefix_cache_bytes is not None:
            options["prefix_cache_bytes"] = prefix_cache_bytes
        return Engine(on_event, EngineOptions(**options))

    return make


class Router:
    """Where the window's (or the CLI's) requests and the built-in server's meet one backend.

    :meth:`build` makes the backend with :meth:`route` as its ``on_event``: each event goes to the built-in
    server first (it keeps the events of the requests it submitted, ``Request.origin == "server"``), every
    other event to the ``sink`` given to ``build`` (the window's queue, a client's).  :meth:`serve` makes that
    server once (``engine.server.control.LocalServer``, not listening until its ``start``); its requests go
    straight to the current backend's ``submit``, as the window's do.  Another ``build`` after :meth:`drop`
    (a switch to another engine) puts a new backend under a server that keeps running; while there is none,
    a server request is refused with ``RuntimeError`` (the server answers 500 with its message).
    """

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.server: LocalServer | None = None
        self._sink: OnEvent = _nowhere

    def build(self, factory: BackendFactory, sink: OnEvent) -> Backend:
        """The backend ``factory`` makes, its events routed here; the events not the server's go to ``sink``."""
        self._sink = sink
        self.backend = factory(self.route)
        return self.backend

    def drop(self) -> Backend | None:
        """Stop routing requests to the current backend and return it (to shut down; its last events still
        arrive here)."""
        backend, self.backend = self.backend, None
        return backend

    def route(self, event: object) -> None:
        """A backend's ``on_event`` (called on its thread): the server's own events to it, the rest to the sink."""
        server = self.server
        if server is not None and server.dispatch(event):
            return
        self._sink(event)

    def serve(self, on_served: Callable[[ServedReply], None] | None = None) -> LocalServer:
        """The built-in server over this router's backend, made at the first call; ``on_served`` is given each
        finished server request (from the engine's thread), for the window's latency panel."""
        if self.server is None:
            from engine.server.control import LocalServer

            self.server = LocalServer(self.submit, self.cancel, on_served, backend=lambda: self.backend)
        return self.server

    def submit(self, request: Request) -> None:
        backend = self.backend
        if backend is None:
            raise RuntimeError("The engine is not running yet. Wait for the model to load.")
        backend.submit(request)

    def cancel(self, request_id: str) -> None:
        backend = self.backend
        if backend is not None:
            backend.cancel(request_id)


def _nowhere(event: object) -> None:
    """The sink of a router that has built no backend yet (no events can come)."""


class Client:
    def __init__(
        self, factory: BackendFactory | None = None, timeout: float | None = None, router: Router | None = None
    ) -> None:
        """``router``: one made before the backend, when its server must listen during the load (``brisk
        serve``); the client's events are the ones the server leaves."""
        self.events: queue.Queue[object] = queue.Queue()
        self.router = router or Router()
        self.backend = self.router.build(factory or local_backend(), self.events.put)
        self.timeout = timeout  # seconds to wait for any one event (None: forever)
        self.loaded: Loaded | None = None
        self.warnings: list[Warning] = []

    def _next(self) -> object:
        return self.events.get(timeout=self.timeout)

    def load(self, spec: ModelSpec) -> Loaded:
        self.backend.load(spec)
        while True:
            event = self._next()
            if isinstance(event, Warning):
                self.warnings.append(event)
            elif isinstance(event, Loaded):
                self.loaded = event
                self._drain_warnings()
                return event
            elif isinstance(event, LoadFailed):
                raise LoadError(event.message)

    def _drain_warnings(self) -> None:
        """Take the warnings a load sends right after ``Loaded`` (the engine thread sends them in order)."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, Warning):
                self.warnings.append(event)

    def stream(self, request: Request, cancel_after: int | None = None) -> Iterator[Event]:
        """Yield ``request``'s events through its ``Done`` or ``Error``; cancel after ``cancel_after`` events."""
        self.backend.submit(request)
        seen = 0
        while True:
            event = self._next()
            if isinstance(event, Warning):
                self.warnings.append(event)
            if isinstance(event, Event) and event.request_id == request.id:
                seen += 1
                yield event
                if isinstance(event, Done | Error):
                    return
                if cancel_after is not None and seen == cancel_after:
                    self.backend.cancel(request.id)

    def prefill_draft(self, request: Request, timeout: float = 600.0) -> bool:
        """Hand ``request`` to the engine as a draft being typed (``Engine.hint``) and wait until its stable
        part is prefilled; False when the backend cannot (a remote server).  For one caller at a time."""
        if not self.backend.hint(request):
            return False
        conversation = request.conversation_id or ""
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                return False
            if isinstance(event, Warning):
                self.warnings.append(event)
            if isinstance(event, DraftPrefill) and event.conversation_id == conversation and event.ready >= event.total:
                return True

    def ask(
        self,
        messages: list[dict[str, str]] | tuple[dict[str, str], ...],
        sampling: Sampling | None = None,
        **request_fields: Any,
    ) -> Done:
        request = Request(
            id=uuid.uuid4().hex, messages=tuple(messages), sampling=sampling or Sampling(), **request_fields
        )
        last: Event | None = None
        for event in self.stream(request):
            last = event
        if isinstance(last, Error):
            raise RequestError(last)
        assert isinstance(last, Done)
        return last

    def close(self) -> None:
        self.backend.shutdown()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- The rest a front end asks of the engine: machine facts, OpenAI-compatible servers, MCP tool sources. ------
# Each imports what it needs when called (torch, the openai SDK, the mcp SDK), so importing the client stays cheap;
# the window reaches the engine through engine.api, this module and engine.storage only (pyproject's contracts).


def prepare_model(source: str) -> None:
    """What a local ``source`` (empty: the bundled model) will need can begin at launch: its file's hash,
    on a background thread (``engine.model.source.hash_ahead``).  Cheap: no torch."""
    from engine.model.source import hash_ahead

    hash_ahead(source)


def format_problems(format_json: str) -> list[str]:
    """What is wrong with a reply format (``engine.api.reply_format``): an invalid schema, regex or grammar,
    in the grammar library's words; empty when it can be used.  Needs no model (imports llguidance)."""
    from engine.runtime.grammar import format_problems as problems

    return problems(format_json)


def machine_report() -> dict[str, Any]:
    """What this machine offers (``brisk doctor``'s facts; imports torch: call it off a GUI thread)."""
    from engine.doctor import report

    return dict(report())


def server_backend(on_event: OnEvent, base_url: str, model: str | None, api_key: str | None) -> RemoteBackend:
    """A backend on an OpenAI-compatible server (``engine.remote.RemoteBackend``; its ``base_url`` is checked)."""
    from engine.remote import RemoteBackend

    return RemoteBackend(on_event, base_url, model, api_key)


def server_key(base_url: str) -> str:
    """The API key kept for ``base_url`` ("" when none, or when the URL is not valid)."""
    from engine.remote import RemoteError, keys

    try:
        return keys.load_key(base_url) or ""
    except RemoteError:
        return ""


def keep_server_key(base_url: str, api_key: str) -> bool:
    """Keep ``api_key`` for ``base_url`` ("" forgets it); True when it outlives this session (the keyring)."""
    from engine.remote import keys

    if api_key:
        return bool(keys.save_key(base_url, api_key))
    keys.delete_key(base_url)
    return bool(keys.persistent())


def server_keys_persist() -> bool:
    """True when API keys go to the system keyring; False: they last this session only."""
    from engine.remote import keys

    return bool(keys.persistent())


def server_models(base_url: str, api_key: str | None) -> list[str]:
    """The model ids a server lists at /v1/models (slow); raises ``engine.remote.RemoteError`` saying why not."""
    from engine.remote import list_models

    return list_models(base_url, api_key or None)


def probe_tool_server(target: str, timeout_s: float, taken: Callable[[str], bool]) -> tuple[str, str, list[Tool]]:
    """Start the MCP server ``target`` (a command line or an http(s) URL), list its tools, stop it.

    Returns ``(status, message, tools)``: ``"running"`` with the tools (``.name``, ``.description``), or
    ``"failed"`` with what went wrong in words.  ``taken(name)``: a tool name already used (it is renamed)."""
    try:
        from engine.tools.mcp_client import McpHub, ServerSpec

        spec = ServerSpec.parse(target)
    except Exception as exc:  # a line that is no command and no URL
        return "failed", f"Not a command line or an http(s) URL ({exc}).", []
    hub = McpHub(connect_timeout_s=timeout_s)
    try:
        state = hub.add(spec)
        if state.status != "ready":
            return "failed", state.message or f"The server is {state.status}.", []
        return "running", "", list(hub.tools(taken=taken))
    except Exception as exc:  # the hub reports failures in its state; anything else is said here
        return "failed", f"{type(exc).__name__}: {exc}", []
    finally:
        hub.close(timeout_s=2.0)


_library: DocumentLibrary | None = None
_library_lock = threading.Lock()


def document_library() -> DocumentLibrary:
    """The process's :class:`engine.documents.library.DocumentLibrary` (the window and the CLI attach files
    through it; opened at the first call: the index and its converters are imported only then)."""
    global _library
    with _library_lock:
        if _library is None:
            from engine.documents.library import DocumentLibrary

            _library = DocumentLibrary()
        return _library


def model_library(folders: list[str] | tuple[str, ...] = ()) -> Library:
    """The models on disk (``engine.library.scan.Library``: entries with what each needs; reads headers only)."""
    from engine.library.scan import scan

    return scan(list(folders))


def models_elsewhere(folders: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether a library scan could find more than the bundled model (a user's folder, the hub cache, another
    app's folder exists); cheap: a few ``stat`` calls."""
    from engine.library.scan import elsewhere

    return elsewhere(list(folders))


def model_drafts(target: ModelEntry, library: Library) -> list[ModelEntry]:
    """The library's models that can draft for ``target`` (same vocabulary, smaller), smallest first."""
    from engine.library.scan import drafts_for

    return drafts_for(target, library)


def pull_model(
    repo: str,
    file: str | None,
    quant: str | None,
    progress: Callable[[PullProgress], None] | None,
    cancel: threading.Event,
) -> PullResult:
    """Download ``repo`` from the Hugging Face hub (``engine.library.pull.pull``); raises its ``PullError``."""
    from engine.library.pull import pull

    return pull(repo, file, quant, progress=progress, cancel=cancel)


def model_note(source: str) -> str:
    """One line on the model ``source`` names (empty: the bundled one), read from its headers (no torch): its
    architecture, size, format, the memory it needs in fp16-cpu and which of Brisk's paths runs it, or why it
    cannot load.  "" for a hub id or a path that is not there."""
    from engine.model.headers import HeaderError, describe, memory_needs
    from engine.model.source import ModelLoadError, model_path

    try:
        path = model_path(source)
        if path is None:
            return ""
        facts = describe(path, vocab=False)
    except (HeaderError, ModelLoadError, OSError) as exc:
        return f"Cannot be read: {exc}"
    if facts.problem:
        return f"Cannot load: {facts.problem}"
    verdict = facts.support()
    params = f"{facts.parameters / 1e9:.1f}B" if facts.parameters >= 1e9 else f"{facts.parameters / 1e6:.0f}M"
    need = memory_needs(facts).get("fp16-cpu", 0)
    parts = [facts.architecture or "unknown architecture", f"{params} parameters", f"{facts.format} {facts.quant}"]
    if need:
        parts.append(f"needs about {need / 2**30:.1f} GB in fp16")
    if verdict.fast_path and verdict.native_step:
        parts.append("fast path and native decode step")
    line = " \u00b7 ".join(parts)
    return f"{line}. {verdict.reason}" if verdict.reason else line


def finish_writes() -> None:
    """Wait for files this process is still writing behind a load (a converted model's copy) or a reply (the
    answer cache's vectors, at most a few seconds), so that a fast exit keeps them; nothing to do (and nothing
    imported) when no model was loaded."""
    import sys

    source = sys.modules.get("engine.model.source")
    if source is not None:
        source.wait_all_written()
    answers = sys.modules.get("engine.runtime.answer_lookup")
    if answers is not None:  # the last answer's question vector, being kept on the embedder's thread
        answers.wait_all_kept()
