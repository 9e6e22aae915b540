"""The one door between the GUI and the engine.

:class:`EngineBridge` owns a backend (an :class:`engine.api.Backend`: the
local engine thread or a remote server, :mod:`app.engines`) and re-emits every event the
backend sends on its single ``event = Signal(object)``, always on the GUI
thread.  The backend calls back from its own thread; the bridge keeps those
events in a queue and wakes the GUI thread once per batch, which re-emits them
in order for at most ``SLICE_S`` before yielding to the event loop, so a fast
token stream never starves timers and repaints.  Widgets never call the
backend: they call the bridge, whose methods are everything the window needs:

* :meth:`load` (an :class:`engine.api.ModelSpec`), :meth:`submit`, :meth:`cancel`,
  :meth:`shutdown`: the ``Backend`` protocol;
* :meth:`use_engine(key, factory) <EngineBridge.use_engine>`: which backend the
  next :meth:`load` runs on (``factory=None``: the local one given to the
  constructor).  When ``key`` differs from the current backend's, that load
  first shuts the old backend down (on the worker thread; a reply still
  streaming there ends with it) and builds the new one; :attr:`engine_key`
  is the key last asked for;
* :meth:`hint`: the draft being typed, prefilled by a local engine while idle (``Engine.hint``);
* :meth:`count_tokens`: the loaded model's token counts of some texts (attached
  documents' chips); blocking, so the window calls it on a worker thread;
* :meth:`seed_answers`: hand earlier (question, answer) pairs to the engine's
  answer memory; :meth:`set_prefix_budget`: a new prefix-cache byte budget.
  Both answer how much was taken (0 / False when the backend cannot);
* :meth:`serve` / :meth:`stop_serving`: the built-in OpenAI-compatible server.
  It lives with the backend in ``engine.client.Router``: its requests go to the
  same ``Backend.submit`` as the window's and their events back to it there,
  so the bridge sees only the window's events and, for the latency panel, an
  ``engine.api.ServedReply`` per finished server request;
* :func:`machine_report`: ``engine.doctor``'s facts about this machine.

``backend_factory(on_event)`` builds the backend (default:
``engine.client.local_backend()``, which imports torch only when called).  It
is called on the bridge's worker thread at the first :meth:`load`, so the
window appears before the heavy import finishes; if the import or
construction fails the bridge emits ``LoadFailed`` with the reason (an
``engine`` exception's message as it is: those are written for the user).
:attr:`backend` is ``None`` until then (tests read it); a request submitted
before the backend exists gets an ``Error`` event at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from engine import client
from engine.api import Backend, Error, LoadFailed, LoadProgress, ModelSpec, Request
from engine.client import BackendFactory, local_backend

if TYPE_CHECKING:
    from engine.client import LocalServer


def machine_report() -> Mapping[str, Any]:
    """What this machine offers (``brisk doctor``'s facts; imports torch, so call it off the GUI thread)."""
    return client.machine_report()


def _reason(exc: Exception) -> str:
    """An engine exception's message is for the user; anything else also says what kind of failure it was."""
    if type(exc).__module__.startswith("engine."):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


LOCAL_KEY = "local"
SLICE_S = 0.008  # the longest the GUI thread spends re-emitting queued events before the event loop runs


class EngineBridge(QObject):
    event = Signal(object)
    _wake = Signal()  # backend thread -> GUI thread: events are waiting

    def __init__(self, backend_factory: BackendFactory | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._local_factory = backend_factory or local_backend()
        self._factory = self._local_factory
        self.engine_key = LOCAL_KEY  # the engine the next load runs on (see use_engine)
        self._backend_key = LOCAL_KEY  # the engine the router's backend was built for
        self._lock = threading.Lock()
        # builds the backend and holds it; the built-in server (serve) takes its own requests' events there
        self._router = client.Router()
        self._closed = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brisk-bridge")
        self._pending: deque[object] = deque()
        self._queue_lock = threading.Lock()  # guards _pending and _woken
        self._woken = False  # a wake-up (or a drain) is on its way
        self._wake.connect(self._drain)  # queued: emitted from other threads

    @property
    def backend(self) -> Backend | None:
        return self._router.backend

    @property
    def server(self) -> LocalServer | None:
        """The OpenAI-compatible server over this bridge's engine (:meth:`serve`), once made."""
        return self._router.server

    def _on_backend_event(self, event: object) -> None:
        """Called on the backend's thread with the window's events (the router keeps the server's) and the
        server's ``ServedReply`` records: queue the event and wake the GUI thread once per batch."""
        with self._queue_lock:
            self._pending.append(event)
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(RuntimeError):  # the Qt side is already gone (shutting down)
            self._wake.emit()

    def _drain(self) -> None:
        """On the GUI thread: re-emit queued events in order, for at most SLICE_S, then let the loop run."""
        deadline = time.perf_counter() + SLICE_S
        while True:
            with self._queue_lock:
                if not self._pending:
                    self._woken = False
                    return
                event = self._pending.popleft()
            self.event.emit(event)
            if time.perf_counter() > deadline:
                QTimer.singleShot(0, self._drain)  # more later: timers and repaints go first
                return

    def use_engine(self, key: str, factory: BackendFactory | None = None) -> None:
        """Run the next :meth:`load` on the backend ``factory`` builds (None: the local one), known as ``key``."""
        with self._lock:
            self.engine_key = key
            self._factory = factory or self._local_factory

    # -- the Backend protocol --------------------------------------------------------------
    def load(self, spec: ModelSpec) -> None:
        """Start loading a model; returns at once.  Events: LoadProgress..., Loaded | LoadFailed."""
        if self._closed:
            return
        self._on_backend_event(LoadProgress(0.0, "Starting the engine\u2026"))
        self._worker.submit(self._load, spec)

    def _load(self, spec: ModelSpec) -> None:
        try:
            with self._lock:
                if self._closed:
                    return
                old = self._router.drop() if self._backend_key != self.engine_key else None
                key, factory = self.engine_key, self._factory
            if old is not None:  # another engine: the old one goes first (outside the lock: it may take a while)
                old.shutdown()
            with self._lock:
                if self._closed:
                    return
                backend = self._router.backend
                if backend is None:
                    self._backend_key = key
                    backend = self._router.build(factory, self._on_backend_event)
            backend.load(spec)
        except Exception as exc:  # an import or constructor failure: tell the user
            self._on_backend_event(LoadFailed(f"Could not start the engine: {_reason(exc)}"))

    def submit(self, request: Request) -> None:
        backend = self._router.backend
        if backend is None or self._closed:
            self.event.emit(Error(request.id, 0.0, "The engine is not running yet. Wait for the model to load."))
            return
        backend.submit(request)

    def hint(self, request: Request) -> bool:
        """The request Send would make now (the draft last), for the engine to prefill while the user types;
        False when the backend cannot (a remote server, or none yet)."""
        backend = self._router.backend
        if backend is None or self._closed:
            return False
        return backend.hint(request)

    def cancel(self, request_id: str) -> None:
        backend = self._router.backend
        if backend is not None and not self._closed:
            backend.cancel(request_id)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            backend = self._router.drop()
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()
        if backend is not None:
            backend.shutdown()

    # -- what the window needs beyond the protocol --------------------------------------------
    def serve(self, port: int, defaults: Any, speculative: str, host: str = "127.0.0.1", api_key: str = "") -> str:
        """Serve the engine to other programs (OpenAI-compatible, ``engine.server``); returns the base URL.
        Raises the server's ``ServeError`` (its message says why) when the address cannot be used.  Each
        finished server request comes back as an ``engine.api.ServedReply`` on :attr:`event`.  Its requests
        reach the backend through the router, never through the bridge (a backend switch keeps it serving)."""
        server = self._router.serve(self._on_backend_event)
        return server.start(host, port, api_key or None, defaults, speculative)

    def stop_serving(self) -> None:
        if self.server is not None:
            self.server.stop()

    def seed_answers(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Give the engine's answer memory these (question, answer) pairs; how many it took.

        The local engine queues the work on its own thread and returns at once;
        a backend without answer memory (a remote server) takes none.
        """
        backend = self._router.backend
        if backend is None or self._closed:
            return 0
        return sum(backend.remember_answer(question, answer) for question, answer in pairs)

    def count_tokens(self, texts: list[str]) -> list[int] | None:
        """Tokens of each of ``texts`` in the loaded model's tokenizer; None when the backend cannot say (a
        remote server, no model yet).  Blocking and thread-safe: call it off the GUI thread."""
        backend = self._router.backend
        if backend is None or self._closed:
            return None
        return backend.count_tokens(texts)

    def set_prefix_budget(self, budget_bytes: int) -> bool:
        """Apply a new prefix-cache budget now; False when the backend cannot (it applies at the next start)."""
        backend = self._router.backend
        if backend is None or self._closed:
            return False
        return backend.set_prefix_budget(budget_bytes)

    @staticmethod
    def machine_report() -> Mapping[str, Any]:
        return machine_report()
