"""The server over one engine: the window's switch, ``brisk serve`` and the server tests all run this.

:class:`LocalServer` is built over a backend's ``submit`` and ``cancel``; the
backend's event sink hands it every event first (:meth:`dispatch`: True for the
server's own, which the window or the CLI then never sees).  Both are wired by
``engine.client.Router``, the one place a backend meets its server (the window's
bridge and ``brisk serve`` alike).  :meth:`start` and :meth:`stop` follow the
Server switch; :meth:`set_model` follows loads (a request while no model is
loaded gets a 503 that says so).  ``backend`` gives the backend requests go to
now: the server reads the loaded model's tokenizer through it
(``engine.server.vocab``).  Each finished
request is given to ``on_served`` (from the engine's thread) as an
:class:`engine.api.ServedReply`, for the latency panel's history.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.api import Metrics, Request, Sampling, ServedReply
from engine.server.app import Service, model_id
from engine.server.hub import Entry, Hub
from engine.server.run import ServerThread
from engine.server.vocab import Vocab


class LocalServer:
    def __init__(
        self,
        submit: Callable[[Request], None],
        cancel: Callable[[str], None],
        on_served: Callable[[ServedReply], None] | None = None,
        embedder: Callable[[], Any] | None = None,
        backend: Callable[[], Any] | None = None,
    ) -> None:
        self.hub = Hub(submit, cancel)
        vocab = Vocab(backend) if backend is not None else None
        self.service = Service(hub=self.hub, embedder=embedder or _embedder, vocab=vocab)
        self.thread: ServerThread | None = None  # listening while set
        self._on_served = on_served
        self.hub.log.listeners.append(self._served)

    @property
    def url(self) -> str:
        return self.thread.url if self.thread is not None else ""

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.running()

    def start(self, host: str, port: int, api_key: str | None, defaults: Sampling, speculative: str) -> str:
        """Listen (raises ``engine.server.ServeError`` with the reason); returns the base URL."""
        self.stop()
        self.service.api_key = api_key or None
        self.configure(defaults, speculative)
        thread = ServerThread(self.service, host, port)
        thread.start()
        self.thread = thread
        self._warm()
        return thread.url

    def configure(self, defaults: Sampling, speculative: str) -> None:
        """The window's current sampling and speculation: what a request's missing fields take."""
        self.service.defaults = defaults
        self.service.speculative = speculative

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None

    def set_model(self, name: str | None, context: int = 0, loading: str = "loading the model") -> None:
        """The loaded model (None while another loads or after a failed load: requests get a 503)."""
        self.service.loading = loading
        self.service.context = context
        self.service.aliases = (name,) if name else ()
        self.service.model = model_id(name) if name else None
        self._warm()

    def _warm(self) -> None:
        """While listening with a model loaded: the server's copy of its tokenizer made now (0.5 s for SmolLM2's,
        engine.server.vocab), on a thread of its own, not at the first answer-cache hit or /tokenize."""
        vocab = self.service.vocab
        if self.thread is not None and self.service.model is not None and vocab is not None:
            threading.Thread(target=vocab.model, name="brisk-server-vocab", daemon=True).start()

    def dispatch(self, event: object) -> bool:
        """Take ``event`` when it is one of this server's requests' (True); else leave it to the caller."""
        return self.hub.dispatch(event)

    def snapshot(self) -> tuple[list[Entry], list[Entry], int]:
        return self.hub.log.snapshot()

    def _served(self, entry: Entry, metrics: Metrics | None) -> None:
        if self._on_served is not None:
            self._on_served(ServedReply(entry.client, entry.endpoint, entry.status, metrics, entry.message))


def _embedder() -> Any:
    from engine.answer_cache.embed import shared_embedder

    return shared_embedder()
