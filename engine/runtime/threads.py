"""Run torch work of a passing thread in a thread of its own, so the engine's decode keeps its speed.

torch's CPU kernels run on OpenMP (libgomp).  Each thread that starts a
parallel region gets a team of helper threads that lives as long as that
thread does.  Measured here (2 cores): once any thread other than the
engine's has run one parallelised op (a 64x576 matmul, a bf16 probe of a
quantization kernel), the engine thread's decode runs at about half speed
(16 tok/s before, 7-9 after, for the rest of the process); the same op in a
thread that then exits leaves it at 16.  ``OMP_WAIT_POLICY`` and
``GOMP_SPINCOUNT`` did not help.

So code that may be called from the main thread of the CLI, a benchmark or a
test, and runs torch ops (the device report and its probes), goes through
:func:`isolated`.  The engine's own work needs nothing: it runs on the
engine thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def isolated(work: Callable[[], T]) -> T:
    """``work()`` on a new thread that ends with it; its result, or its exception re-raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller as it was
            box["error"] = exc

    thread = threading.Thread(target=run, name="brisk-isolated")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
