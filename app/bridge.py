"""The one door between the GUI and the engine.

:class:`EngineBridge` owns an engine object (anything with the
``load``/``submit``/``cancel``/``shutdown`` methods of ``engine.runtime.engine.Engine``)
and re-emits every engine event on its single ``event = Signal(object)``.  The
engine calls back from its own thread; the signal crosses to the GUI thread as
a queued connection, so slots always run on the GUI thread.  Widgets never
call the engine: they call the bridge.

``engine_factory(on_event)`` builds the engine (default: ``engine.runtime.engine.Engine``,
imported inside the function).  It is called on the bridge's worker thread at
the first :meth:`load`, so the window appears before the heavy import (torch)
finishes; if the import or construction fails the bridge emits ``LoadFailed``
with the reason.  ``load`` builds the model spec on that same worker with
``spec_factory`` (default: ``engine.runtime.engine.ModelSpec``).  :attr:`engine` is
``None`` until then; a request submitted before the engine exists gets an
``Error`` event at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from PySide6.QtCore import QObject, Signal

from engine.api import Error, LoadFailed, LoadProgress, Request

OnEvent = Callable[[object], None]


class EngineLike(Protocol):
    def load(self, spec: Any) -> None: ...
    def submit(self, request: Request) -> None: ...
    def cancel(self, request_id: str) -> None: ...
    def shutdown(self) -> None: ...


EngineFactory = Callable[[OnEvent], EngineLike]
SpecFactory = Callable[..., Any]


def default_engine_factory(on_event: OnEvent) -> EngineLike:
    from engine.runtime.engine import Engine  # heavy: imports torch

    return Engine(on_event)


def default_spec_factory(**fields: str) -> Any:
    from engine.api import ModelSpec

    return ModelSpec(**fields)


class EngineBridge(QObject):
    event = Signal(object)

    def __init__(
        self,
        engine_factory: EngineFactory | None = None,
        spec_factory: SpecFactory | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._factory = engine_factory or default_engine_factory
        self._spec_factory = spec_factory or default_spec_factory
        self._lock = threading.Lock()
        self._engine: EngineLike | None = None
        self._closed = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brisk-bridge")

    @property
    def engine(self) -> EngineLike | None:
        return self._engine

    def _on_engine_event(self, event: object) -> None:
        """Called on the engine thread: only emit."""
        with contextlib.suppress(RuntimeError):  # the Qt side is already gone (shutting down)
            self.event.emit(event)

    def load(
        self,
        source: str = "",
        device: str = "auto",
        dtype: str = "auto",
        quant: str = "none",
        draft: str = "",
        draft_quant: str = "none",
    ) -> None:
        """Start loading a model; returns at once.  Events: LoadProgress..., Loaded | LoadFailed."""
        if self._closed:
            return
        self._on_engine_event(LoadProgress(0.0, "Starting the engine\u2026"))
        fields = {"source": source, "device": device, "dtype": dtype, "quant": quant}
        if draft:  # only engines with speculative decoding know these fields
            fields["draft"] = draft
            if draft_quant != "none":
                fields["draft_quant"] = draft_quant
        self._worker.submit(self._load, fields)

    def _load(self, fields: dict[str, str]) -> None:
        try:
            with self._lock:
                if self._closed:
                    return
                if self._engine is None:
                    self._engine = self._factory(self._on_engine_event)
                engine = self._engine
            spec = self._spec_factory(**fields)
            engine.load(spec)
        except Exception as exc:  # an import or constructor failure: tell the user
            self._on_engine_event(LoadFailed(f"Could not start the engine: {type(exc).__name__}: {exc}"))

    def submit(self, request: Request) -> None:
        engine = self._engine
        if engine is None or self._closed:
            self.event.emit(Error(request.id, 0.0, "The engine is not running yet. Wait for the model to load."))
            return
        engine.submit(request)

    def cancel(self, request_id: str) -> None:
        engine = self._engine
        if engine is not None and not self._closed:
            engine.cancel(request_id)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            engine = self._engine
        self._worker.shutdown(wait=False, cancel_futures=True)
        if engine is not None:
            engine.shutdown()
