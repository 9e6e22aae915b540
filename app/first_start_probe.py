"""The window's side of ``brisk bench first-start`` (``engine.bench.first_start``): one first start, timed.

``python -m app.first_start_probe OUT STARTED`` opens the real window (offscreen unless a display is set) on
the data folder in ``BRISK_DATA_DIR``, as ``brisk`` with no arguments does, polls it every 20 ms, asks one
question the moment Send is usable, and writes the timeline as JSON to ``OUT``, in seconds since
``STARTED`` (the parent's ``time.time()`` at launch).  The table is the parent's: the engine side cannot
open a window, and the window side does not print benchmarks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

QUESTION = "Write a haiku about rain."
LIMIT_S = 240.0


def child(out: str, started: float) -> int:
    """In the child: open the window, poll it every 20 ms, ask one question once usable, write the timeline."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.launch import backend_factory_for, open_store, prepare_model
    from app.window import MainWindow
    from engine.api import Done, Error, Tuning
    from engine.storage import Settings, database_path

    settings, _problems = Settings.load_with_problems()
    prepare_model(settings)  # as run_gui does
    app = QApplication(sys.argv)
    store, _warning = open_store(database_path())
    bridge = EngineBridge(backend_factory_for(settings))
    window = MainWindow(store, bridge, settings)
    window.resize(1100, 740)
    window.show()
    record: dict[str, object] = {"window_s": time.time() - started, "statuses": [], "backwards": 0}
    statuses: list[tuple[float, str]] = record["statuses"]  # type: ignore[assignment]
    last = {"progress": -1, "asked": 0.0}

    def since() -> float:
        return round(time.time() - started, 3)

    def finished() -> bool:  # the reply is in and nothing is being measured in the background any more
        return "reply_s" in record and (not record.get("measuring") or "tuned_s" in record)

    def on_event(event: object) -> None:
        if isinstance(event, Tuning):
            record["measuring"] = True
            if event.done:
                record["tuned_s"], record["tuned"] = since(), event.message
        if isinstance(event, Done) and "ttft_s" not in record:
            record["ttft_s"] = event.metrics.ttft_s
            record["spans"] = [
                (span.name, round(span.start_s, 3), round(span.end_s, 3)) for span in event.metrics.spans
            ]
            record["reply_s"] = since()
        elif isinstance(event, Error):
            record["error"] = event.message
            app.quit()
        if finished():
            app.quit()

    bridge.event.connect(on_event)

    def poll() -> None:
        text = window.status_area.message_label.text()
        if not statuses or statuses[-1][1] != text:
            statuses.append((since(), text))
        bar = window.status_area.progress
        if bar.isVisible():
            if bar.value() < last["progress"]:
                record["backwards"] = int(record["backwards"]) + 1  # type: ignore[call-overload]
            last["progress"] = bar.value()
        if "usable_s" not in record and window.model_ready and window.composer.ready:
            record["usable_s"] = since()
            window.new_chat()  # a restart opens the last chat: the question starts a new one, as a first one did
            window.composer.editor.setPlainText(QUESTION)
            window.composer.submit()
        if time.time() - started > LIMIT_S:
            record["error"] = f"not done in {LIMIT_S:.0f} s"
            app.quit()

    timer = QTimer()
    timer.timeout.connect(poll)
    timer.start(20)
    QTimer.singleShot(0, window.load_model)
    app.exec()
    record["statuses"] = statuses
    window.close()
    bridge.shutdown()
    store.close()
    Path(out).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1], float(sys.argv[2])))
