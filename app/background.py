"""Slow calls for short-lived widgets: run on a worker thread, answer on the GUI thread.

``in_background(owner, work, on_done)`` runs ``work()`` on a daemon thread and,
once it has finished, calls ``on_done(owner, result)`` on the GUI thread, where
``result`` is what ``work`` returned or the exception it raised.  The worker
never touches a Qt object: a timer owned by ``owner`` polls the result every
``POLL_MS``.  Only a weak reference to ``owner`` is kept, and ``on_done`` is
given it as an argument, so the pending call never keeps a closed dialog alive
and never drops the last reference to it from inside its own timer (which
would delete a widget while its child is being deleted).  When ``owner`` is
destroyed first, the timer goes with it and the answer is dropped.  Daemon
threads do not hold up quitting the app.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from PySide6.QtCore import QObject, QTimer

POLL_MS = 25

Owner = TypeVar("Owner", bound=QObject)


def in_background(owner: Owner, work: Callable[[], Any], on_done: Callable[[Owner, Any], None]) -> Future[Any]:
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except Exception as exc:  # handed to on_done, which shows it
            future.set_exception(exc)

    threading.Thread(target=run, name="brisk-background", daemon=True).start()
    owner_ref = weakref.ref(owner)
    timer = QTimer(owner)
    timer.setInterval(POLL_MS)

    def poll() -> None:
        if not future.done():
            return
        timer.stop()
        timer.deleteLater()
        target = owner_ref()
        if target is not None:
            error = future.exception()
            on_done(target, error if error is not None else future.result())

    timer.timeout.connect(poll)
    timer.start()
    return future
