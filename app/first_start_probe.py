"""The window's side of ``brisk bench first-start`` (``engine.bench.first_start``): one first start, timed.

``python -m app.first_start_probe OUT STARTED`` opens the real window (offscreen unless a display is set) on
the data folder in ``BRISK_DATA_DIR``, as ``brisk`` with no arguments does, polls it every 20 ms, asks the
first of :data:`QUESTIONS` the moment Send is usable and each next one the moment the reply before it
ended, and writes the timeline as JSON to ``OUT``, in seconds since ``STARTED`` (the parent's
``time.time()`` at launch).  Each reply's record has its TTFT, decode tokens/s, the weight mode it ran in
and the CPU seconds every thread of this process spent meanwhile (by thread name; ``native`` is every thread
Python did not start: the engine's OpenMP helpers, Qt's).  The background's own timeline is the ``Tuning``
events (the weight modes' measurement) with their times.  The table is the parent's: the engine side
cannot open a window, and the window side does not print benchmarks.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

QUESTIONS = (
    "Write a haiku about rain.",
    "Describe a busy market in the morning.",
    "What makes a good cup of tea?",
)
LIMIT_S = 900.0


def thread_cpu() -> dict[str, float]:
    """CPU seconds each live thread of this process has used, summed by name (``native``: not a Python thread)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        name = names.get(int(tid), "native")
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def cpu_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if v - before.get(k, 0.0) >= 0.01}


def child(out: str, started: float) -> int:
    """In the child: open the window, poll it every 20 ms, ask one question once usable, write the timeline."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.launch import backend_factory_for, open_store, prepare_model
    from app.window import MainWindow
    from engine.api import Done, Error, Loaded, Tuning
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
    replies: list[dict[str, object]] = []
    background: list[tuple[float, str]] = []  # the Tuning events: what the measurement did, when
    record["replies"], record["background"] = replies, background
    last = {"progress": -1, "asked": 0.0}
    mode = {"quant": ""}
    has_cpu = os.path.isdir("/proc/self/task")

    def since() -> float:
        return round(time.time() - started, 3)

    def finished() -> bool:  # every reply is in and nothing is being measured in the background any more
        done = len(replies) == len(QUESTIONS) and all("done_s" in r for r in replies)
        return done and (not record.get("measuring") or "tuned_s" in record)

    def ask(question: str) -> None:
        replies.append({"question": question, "asked_s": since(), "cpu0": thread_cpu() if has_cpu else {}})
        window.composer.editor.setPlainText(question)
        window.composer.submit()

    def on_event(event: object) -> None:
        if isinstance(event, Loaded):
            mode["quant"] = event.info.quant if event.info is not None else ""
            record.setdefault("loaded", []).append((since(), mode["quant"]))  # type: ignore[attr-defined]
        if isinstance(event, Tuning):
            record["measuring"] = True
            if not background or background[-1][1] != event.message:  # said again while it polls: kept once
                background.append((since(), event.message))
            if event.done:
                record["tuned_s"], record["tuned"] = since(), event.message
        if isinstance(event, Done) and replies and "done_s" not in replies[-1]:
            reply = replies[-1]
            metrics = event.metrics
            cpu0 = reply.pop("cpu0")
            reply.update(
                done_s=since(),
                ttft_s=metrics.ttft_s,
                tok_s=metrics.tokens_per_s,
                tokens=metrics.completion_tokens,
                mode=mode["quant"],
                cpu=cpu_since(cpu0, thread_cpu()) if has_cpu else {},  # type: ignore[arg-type]
            )
            if len(replies) == 1:
                record["ttft_s"] = metrics.ttft_s
                record["spans"] = [(span.name, round(span.start_s, 3), round(span.end_s, 3)) for span in metrics.spans]
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
            ask(QUESTIONS[0])
        elif replies and "done_s" in replies[-1] and len(replies) < len(QUESTIONS) and not window.composer.busy:
            ask(QUESTIONS[len(replies)])  # the next question the moment the reply before it ended
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
