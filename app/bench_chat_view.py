"""Benchmark: opening a 10,000-message conversation in the real window.

``python -m app.bench_chat_view [--messages N] [--out PATH]`` writes N stored
messages (alternating questions and Markdown replies with code blocks, stats
and a few damaged, cancelled and error rows) into a real SQLite store in a
temporary data folder, opens the real :class:`~app.window.MainWindow` on it
(offscreen unless a display is set; no model is loaded), and measures:

* ``store_read_s``: ``Store.messages`` alone, for reference;
* ``open_s``: from ``open_conversation`` until the view has painted its last
  rows with their exact heights (no layout pending);
* ``reopen_s``: the same after switching to another conversation and back;
* ``scroll_top_s``: scrolling to the first message and painting it;
* RSS (resident memory) before the window, after the first open and after
  the reopen, and the number of QWidgets in the window.

It prints a table and writes JSON (default ``bench/results/chat_view.json``).
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEvent, QObject  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from app.window import MainWindow  # noqa: E402
from engine.storage import Settings, Store  # noqa: E402

REPLY = (
    "Here is one way to do it, step {i}:\n\n"
    "```python\ndef step_{i}(x):\n    return x * {i}\n```\n\n"
    "The function multiplies its input; **{i}** is the factor. See the `step_{i}` docstring."
)
METRICS = {"ttft_s": 0.21, "tokens_per_s": 38.2, "completion_tokens": 57, "prompt_tokens": 900, "cached_tokens": 880}


class _NoEngine:
    """A backend that is never loaded: the benchmark measures the view, not a model."""

    def __init__(self, on_event: Any) -> None:
        self.on_event = on_event

    def load(self, spec: Any) -> None: ...

    def submit(self, request: Any) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def shutdown(self, timeout: float = 5.0) -> None: ...


class _PaintWatch(QObject):
    """Counts paints of the chat view's viewport."""

    def __init__(self, target: QWidget) -> None:
        super().__init__()
        self.paints = 0
        target.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.Paint:
            self.paints += 1
        return False


def rss_mb() -> float:
    """Resident memory of this process now, in MB (Linux /proc; elsewhere the peak from resource)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fill(store: Store, n: int) -> str:
    """A conversation of ``n`` messages; returns its id."""
    conversation = store.create_conversation("Ten thousand messages")
    for i in range(n // 2):
        store.add_message(conversation, "user", f"Question {i}: how do I multiply by {i} in Python?")
        status = "cancelled" if i % 97 == 5 else "error" if i % 131 == 7 else "done"
        metrics = {**METRICS, "error": "The model failed."} if status == "error" else METRICS
        store.add_message(conversation, "assistant", REPLY.format(i=i), status=status, metrics=metrics)
    return conversation


def settle(app: QApplication, window: MainWindow, watch: _PaintWatch, limit_s: float = 60.0) -> None:
    """Run the event loop until the chat view has painted and no row changed its height since."""
    view = window.chat_view
    changes = 0

    def changed(*_: object) -> None:
        nonlocal changes
        changes += 1

    view.delegate.sizeHintChanged.connect(changed)
    start, settled = time.perf_counter(), False
    try:
        while not settled and time.perf_counter() - start < limit_s:
            paints, before = watch.paints, changes
            app.processEvents()  # posted layouts and updates
            view.viewport().repaint()  # and paint now: the offscreen platform may not have asked yet
            settled = watch.paints > paints and changes == before  # painted, and no row changed its height
    finally:
        view.delegate.sizeHintChanged.disconnect(changed)
    if not settled:
        raise RuntimeError(f"the chat view did not settle within {limit_s} s")


def run(n: int) -> dict[str, Any]:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    folder = Path(tempfile.mkdtemp(prefix="brisk-bench-chat-"))
    store = Store(folder / "brisk.db")
    big = fill(store, n)
    small = store.create_conversation("Short")
    store.add_message(small, "user", "Hi")
    store.add_message(small, "assistant", "Hello! How can I help?", metrics=METRICS)
    t = time.perf_counter()
    count = len(store.messages(big))
    store_read_s = time.perf_counter() - t

    rss_before = rss_mb()
    window = MainWindow(store, EngineBridge(_NoEngine), Settings())  # opens the most recent: the short one
    window.resize(1100, 740)
    window.show()
    watch = _PaintWatch(window.chat_view.viewport())
    settle(app, window, watch)
    rss_window = rss_mb()

    t = time.perf_counter()
    window.open_conversation(big)
    settle(app, window, watch)
    open_s = time.perf_counter() - t
    rss_open = rss_mb()
    shown_last = window.chat_view.bubbles()[-1].plain_text == REPLY.format(i=n // 2 - 1)

    window.open_conversation(small)
    settle(app, window, watch)
    t = time.perf_counter()
    window.open_conversation(big)
    settle(app, window, watch)
    reopen_s = time.perf_counter() - t
    rss_reopen = rss_mb()

    t = time.perf_counter()
    window.chat_view.scrollToTop()
    settle(app, window, watch)
    scroll_top_s = time.perf_counter() - t
    widgets = len(window.findChildren(QWidget))
    window.close()
    window.bridge.shutdown()
    store.close()
    return {
        "messages": count,
        "store_read_s": round(store_read_s, 4),
        "open_s": round(open_s, 4),
        "reopen_s": round(reopen_s, 4),
        "scroll_top_s": round(scroll_top_s, 4),
        "rss_before_window_mb": round(rss_before, 1),
        "rss_empty_window_mb": round(rss_window, 1),
        "rss_after_open_mb": round(rss_open, 1),
        "rss_after_reopen_mb": round(rss_reopen, 1),
        "widgets_in_window": widgets,
        "shows_last_message": shown_last,
        "platform": os.environ.get("QT_QPA_PLATFORM", ""),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench_chat_view", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="messages in the long conversation")
    parser.add_argument("--out", default="bench/results/chat_view.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    result = run(args.messages)
    rows = [
        ("messages", f"{result['messages']}"),
        ("store read (Store.messages)", f"{result['store_read_s'] * 1000:.0f} ms"),
        ("open, until painted", f"{result['open_s'] * 1000:.0f} ms"),
        ("reopen, until painted", f"{result['reopen_s'] * 1000:.0f} ms"),
        ("scroll to the top, painted", f"{result['scroll_top_s'] * 1000:.0f} ms"),
        ("RSS before the window", f"{result['rss_before_window_mb']:.0f} MB"),
        ("RSS, window on a short chat", f"{result['rss_empty_window_mb']:.0f} MB"),
        ("RSS after opening", f"{result['rss_after_open_mb']:.0f} MB"),
        ("RSS after reopening", f"{result['rss_after_reopen_mb']:.0f} MB"),
        ("QWidgets in the window", f"{result['widgets_in_window']}"),
        ("shows the last message", "yes" if result["shows_last_message"] else "NO"),
    ]
    width = max(len(name) for name, _ in rows)
    print("Chat view: a long conversation in the real window")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>10}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"scenario": "chat_view", "results": result}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
