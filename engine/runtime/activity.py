"""One process-wide signal: whether the engine is serving a request now, for background work to yield to it.

The scheduler (``engine.runtime.scheduler``) calls :func:`serving` with true when a request is waiting for
or holds a place in the batch, false when none is; the answer cache's own hits never set it (they run no
model step).  Work that runs beside the engine and only saves time later (the weight modes' builds of a
first start, ``engine.runtime.measuring``) calls :func:`wait_idle` between its units of work: it returns at
once while no request is served and otherwise blocks until the last one ends, so a reply never shares the
CPU (nor the GIL) with it for longer than one unit.  :func:`pause_between_ops` does that between every
torch op of the calling thread, for work whose units are not its own (a model build inside transformers).

A child process cannot see this signal: background children are started at the lowest CPU priority by
their owners instead (``app.quant_probe``).  Thread-safe; no torch import unless :func:`pause_between_ops`
is used.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_idle = threading.Event()
_idle.set()
_lock = threading.Lock()
_served_s = 0.0  # seconds some request was being served, in all (for a test or a bench to read)
_since: float | None = None  # time.monotonic() when the current busy stretch began
_yields = 0  # times background work waited for a request to end


def serving(busy: bool) -> None:
    """The scheduler says whether a request is waiting for or holds a place in the batch (cheap when unchanged)."""
    global _served_s, _since
    if busy == (not _idle.is_set()):
        return
    with _lock:
        if busy:
            _since = time.monotonic()
            _idle.clear()
        else:
            if _since is not None:
                _served_s += time.monotonic() - _since
            _since = None
            _idle.set()


def busy() -> bool:
    """Whether a request is being served now."""
    return not _idle.is_set()


def wait_idle(timeout: float | None = None) -> bool:
    """Block while a request is being served (at most ``timeout`` s); true once none is.  At once when idle."""
    global _yields
    if _idle.is_set():
        return True
    with _lock:
        _yields += 1
    return _idle.wait(timeout)


def yields() -> int:
    """How many times background work waited for a request so far (this process)."""
    return _yields


@contextlib.contextmanager
def pause_between_ops(gate: Callable[[], Any] = wait_idle) -> Iterator[None]:
    """While the block runs, every torch op of the calling thread first calls ``gate`` (default: wait until no
    request is served).  A torch function mode is thread-local: other threads' ops (the engine's) are not
    touched."""
    from torch.overrides import TorchFunctionMode

    class _Gate(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            gate()
            return func(*args, **(kwargs or {}))

    with _Gate():
        yield
