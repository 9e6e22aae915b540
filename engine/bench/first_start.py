"""First start as a new user meets it: the timeline to a usable chat, and the first reply's speed beside the next ones'.

Run from the repository root: ``HF_HUB_OFFLINE=1 .venv/bin/brisk bench first-start --runs 3`` (or
``python -m engine.bench.first_start [ROUNDS]``, 3 unless given); prints two tables and writes
``bench/results/first-start.json`` (``first_start.json`` from ``python -m``).  ``--model PATH`` starts on
that model (a ``.gguf`` file, a folder) instead of the bundled one; ``--only TEXT`` runs only the variants
whose name contains TEXT.  With ``BRISK_BENCH_BEFORE=DIR`` (another checkout, e.g. ``git worktree`` of an
older commit) every variant also runs on DIR's code, round by round beside this tree's, for a before/after
table on the same machine at the same time.

Each run is a new process, interleaved round by round:

* ``window, empty data folder``: ``python -m app.first_start_probe`` (the window's side: this engine-side
  module cannot open a window) opens the real window offscreen, as ``brisk`` with no arguments does, on a
  new data folder (the native step already built: ``make run`` builds it first), asks a question the moment
  Send is usable and two more, each the moment the reply before it ended;
* ``window, no native step yet``: the same with a new torch extensions folder too, so the native decode step
  is compiled in the background while the user chats (a source install where ``make`` did not build it);
* ``window, restart``: the data folder of the previous ``window, empty data folder`` run;
* ``brisk chat, empty data folder``: the same three questions through ``brisk chat --json`` on a new data
  folder (the command line measures the weight modes before its first reply).

Replies stop at :data:`MAX_TOKENS` new tokens (written into the new data folder's settings).  The first table
is the timeline, in seconds from the process's start: the window shown, Send usable (a model
loaded and the composer taking a message), the first token, and the background measurement of the weight
modes ended (``tuned``); then each reply's decode tokens/s (the mode it ran in is in the JSON) and
``backwards``, the times the progress bar went back.  The second says what ran beside each reply: the CPU
seconds of every thread of the window's process other than the engine's and the GUI's while the reply was
made (``native`` is every thread Python did not start: the engine's OpenMP helpers, Qt's), and the
measurement's own messages with their times for the last run of each variant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.bench.common import BRISK, markdown_table, median, save, spread

ROOT = Path(__file__).resolve().parents[2]  # the repository, where ``python -m app.first_start_probe`` runs
QUESTIONS = (  # as app.first_start_probe.QUESTIONS (that module imports Qt)
    "Write a haiku about rain.",
    "Describe a busy market in the morning.",
    "What makes a good cup of tea?",
)
REPLIES = len(QUESTIONS)
MAX_TOKENS = 64  # new tokens per reply at most (the window's setting in a new data folder, the CLI's flag)
OWN_THREADS = ("brisk-engine", "MainThread", "native")  # the reply's own work; the rest ran beside it
BEFORE_ENV = "BRISK_BENCH_BEFORE"


def _env(data: Path, code: Path, extensions: Path | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BRISK_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)
    if extensions is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    return env


def window(data: Path, code: Path, model: str, extensions: Path | None = None) -> dict[str, Any]:
    """One start of the window on ``data`` with ``code``'s modules; the probe's timeline."""
    if not (data / "settings.json").exists():  # a new data folder: the model, and replies of a bounded length
        data.mkdir(parents=True, exist_ok=True)
        (data / "settings.json").write_text(json.dumps({"model": model, "max_tokens": MAX_TOKENS}))
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    probe = ROOT / "app" / "first_start_probe.py"  # this tree's probe, on ``code``'s app and engine
    started = time.time()
    command = [sys.executable, str(probe), str(out), repr(started)]
    subprocess.run(command, env=_env(data, code, extensions), check=False, cwd=code)
    try:
        record: dict[str, Any] = json.loads(out.read_text() or "{}")
    except ValueError:
        record = {"error": "the window's side wrote no timeline"}
    out.unlink()
    return record


def chat(data: Path, code: Path, model: str) -> dict[str, Any]:
    """``brisk chat --json`` on ``data`` with the three questions; launch to the first token and each reply."""
    flags = ["--max-tokens", str(MAX_TOKENS), *(["--model", model] if model else [])]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*BRISK, "chat", "--json", *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(data, code, None),
        cwd=code,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(q + "\n" for q in QUESTIONS))
    proc.stdin.close()
    record: dict[str, Any] = {"replies": []}
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("type") == "started" and "usable_s" not in record:
            record["usable_s"] = round(time.perf_counter() - started, 3)
        elif event.get("type") == "done":
            metrics = event["metrics"]
            reply = {"ttft_s": metrics.get("ttft_s"), "tok_s": metrics.get("tokens_per_s")}
            reply["tokens"], reply["done_s"] = metrics.get("completion_tokens"), time.perf_counter() - started
            record["replies"].append(reply)
    if proc.wait() != 0 or len(record["replies"]) < REPLIES:
        record["error"] = f"brisk chat exited with {proc.returncode} after {len(record['replies'])} replies"
    if record["replies"] and "usable_s" in record:
        record["ttft_s"] = record["replies"][0]["ttft_s"]
    return record


VARIANTS = (
    "window, empty data folder",
    "window, restart",
    "window, no native step yet",
    "brisk chat, empty data folder",
)


def _one(name: str, code: Path, scratch: Path, i: int, model: str) -> dict[str, Any]:
    tag = "before-" if code != ROOT else ""
    if name == "window, empty data folder":
        return window(scratch / f"{tag}data-{i}", code, model)
    if name == "window, restart":
        return window(scratch / f"{tag}data-{i}", code, model)  # the folder the run before it left
    if name == "window, no native step yet":
        return window(scratch / f"{tag}native-{i}", code, model, scratch / f"{tag}ext-{i}")
    return chat(scratch / f"{tag}chat-{i}", code, model)


def _tok_s(records: list[dict[str, Any]], n: int) -> list[float | None]:
    return [r["replies"][n].get("tok_s") if len(r.get("replies", [])) > n else None for r in records]


def _first_token(record: dict[str, Any]) -> float | None:
    if record.get("usable_s") is None or record.get("ttft_s") is None:
        return None
    return float(record["usable_s"]) + float(record["ttft_s"])


def _beside(record: dict[str, Any], n: int) -> float | None:
    """CPU seconds the threads other than the reply's own used while reply ``n`` was made (window only)."""
    replies = record.get("replies", [])
    if len(replies) <= n or "cpu" not in replies[n]:
        return None
    return sum(v for k, v in replies[n]["cpu"].items() if k not in OWN_THREADS)


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``brisk bench first-start``: ``--runs`` rounds of the variants; the tables and the timelines."""
    rounds = max(1, int(getattr(args, "runs", None) or 3))
    model = str(Path(args.model).expanduser().resolve()) if getattr(args, "model", None) else ""
    only = getattr(args, "only", "") or ""
    codes = [("", ROOT)]
    before = os.environ.get(BEFORE_ENV)
    if before:
        codes.insert(0, ("before: ", Path(before).resolve()))
    names = [n for n in VARIANTS if only in n]
    rows: dict[str, list[dict[str, Any]]] = {label + n: [] for n in names for label, _ in codes}
    scratch = Path(tempfile.mkdtemp(prefix="brisk-first-start-"))
    try:
        for i in range(rounds):
            for name in names:
                for label, code in codes if i % 2 == 0 else codes[::-1]:  # who goes first alternates
                    rows[label + name].append(_one(name, code, scratch, i, model))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    body = []
    for name, records in rows.items():
        usable = [r.get("usable_s") for r in records]
        first = [_first_token(r) for r in records]
        tuned = [r.get("tuned_s") for r in records]
        speeds = [_tok_s(records, n) for n in range(REPLIES)]
        first_vs_later = [
            s1 / median([s for s in (s2, s3) if s]) if s1 and (s2 or s3) else None
            for s1, s2, s3 in zip(*speeds, strict=True)
        ]
        window_s = [r.get("window_s") for r in records]
        back = sum(int(r.get("backwards", 0)) for r in records)
        cells = [spread(v, "{:.1f}") for v in (window_s, usable, first, tuned)]
        cells += [spread(v, "{:.1f}") for v in speeds] + [spread(first_vs_later, "{:.2f}"), str(back)]
        body.append([name, *cells])
    head = ["variant", "window s", "usable s", "first token s", "tuned s", "reply 1 tok/s", "reply 2 tok/s"]
    head += ["reply 3 tok/s", "1st / later", "backwards"]
    print(markdown_table(head, body))

    beside = []
    for name, records in rows.items():
        if any("cpu" in reply for r in records for reply in r.get("replies", [])):
            beside.append([name, *(spread([_beside(r, n) for r in records], "{:.2f}") for n in range(REPLIES))])
    if beside:
        print("\nCPU seconds of the other threads while each reply was made (not the engine's, the GUI's, OpenMP's):")
        print(markdown_table(["variant", "reply 1", "reply 2", "reply 3"], beside))
    for name, records in rows.items():
        for r in records:
            if "error" in r:
                print(f"  {name}: error: {r['error']}")
    print("\nthe last run of each window variant, seconds from process start:")
    for name, records in rows.items():
        if not records or "chat" in name:
            continue
        last = records[-1]
        print(f"  {name}:")
        for n, reply in enumerate(last.get("replies", [])):
            others = {k: v for k, v in reply.get("cpu", {}).items() if k not in OWN_THREADS}
            asked, mode = reply.get("asked_s", 0), reply.get("mode", "?")
            print(f"    {asked:7.2f}  reply {n + 1} asked ({mode}); the other threads' CPU s meanwhile: {others}")
        for t, text in last.get("background", []):
            print(f"    {t:7.2f}  background: {text}")
    return rows


if __name__ == "__main__":
    found = run(argparse.Namespace(runs=int(sys.argv[1]) if len(sys.argv) > 1 else 3))
    print(f"\nwrote {save('first_start', found)}")
