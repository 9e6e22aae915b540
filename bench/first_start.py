"""First start of the window as a new user meets it: time to a usable chat, and what the status bar said.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/python bench/first_start.py [ROUNDS]``; prints a
table and writes ``bench/results/first_start.json``.  Each run is a new process that opens the real window
offscreen on the bundled model (as ``brisk`` with no arguments does), interleaved round by round:

* ``empty data folder``: a new data folder, the native step already built (``make run`` builds it first);
* ``empty, no native step yet``: a new data folder and a new torch extensions folder, so the native decode
  step is compiled in the background while the user chats (a source install where ``make`` did not build
  it, or a new torch version);
* ``restart``: the data folder of the previous ``empty data folder`` run.

Measured from the process's start: when the window showed, when Send became usable (a model is loaded
and the composer takes a message), the first reply's TTFT (asked the moment Send is usable), when the
background measurement of the weight modes ended (``tuned``; a first start only), and the status line's
texts with their times; ``backwards`` counts the times the progress bar went back.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    from engine.paths import database_path
    from engine.storage import Settings

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


def run(data: Path, extensions: Path | None) -> dict[str, object]:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BRISK_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}
    if extensions is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    started = time.time()
    subprocess.run([sys.executable, __file__, "--child", str(out), repr(started)], env=env, check=False)
    record = json.loads(out.read_text() or "{}")
    out.unlink()
    return record


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows: dict[str, list[dict[str, object]]] = {"empty data folder": [], "empty, no native step yet": [], "restart": []}
    scratch = Path(tempfile.mkdtemp(prefix="brisk-first-start-"))
    try:
        for i in range(rounds):
            data = scratch / f"data-{i}"
            rows["empty data folder"].append(run(data, None))
            rows["restart"].append(run(data, None))
            rows["empty, no native step yet"].append(run(scratch / f"data-native-{i}", scratch / f"ext-{i}"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    print(f"{'variant':28} {'window s':>16} {'usable s':>16} {'first TTFT ms':>18} {'tuned s':>16} {'backwards':>9}")
    for name, records in rows.items():
        window = [float(r["window_s"]) for r in records if "window_s" in r]  # type: ignore[arg-type]
        usable = [float(r["usable_s"]) for r in records if "usable_s" in r]  # type: ignore[arg-type]
        ttft = [1000 * float(r["ttft_s"]) for r in records if r.get("ttft_s") is not None]  # type: ignore[arg-type]
        tuned = [float(r["tuned_s"]) for r in records if "tuned_s" in r]  # type: ignore[arg-type]
        back = sum(int(r.get("backwards", 0)) for r in records)  # type: ignore[call-overload]
        print(f"{name:28} {median(window):>16} {median(usable):>16} {median(ttft):>18} {median(tuned):>16} {back:>9}")
        for r in records:
            if "error" in r:
                print(f"  error: {r['error']}")
    print("\nstatus line of the last run of each variant (seconds from process start):")
    for name, records in rows.items():
        print(f"  {name}:")
        for t, text in records[-1].get("statuses", []):  # type: ignore[attr-defined]
            print(f"    {t:7.2f}  {text}")
    results = Path(__file__).with_name("results")
    results.mkdir(exist_ok=True)
    (results / "first_start.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], float(sys.argv[3])))
    main()
