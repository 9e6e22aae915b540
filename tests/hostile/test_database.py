"""One owner per database file: the CLI and the window share ``brisk.db`` in either order (issue #22, defect 1).

Each case runs the real ``brisk ask`` on the tiny model and, where it applies, the window's real start-up
(``app.launch.run_gui`` with a scripted engine, offscreen) on one data folder, and checks that nothing is
refused that is Brisk's, that a stranger's database is refused and left byte-for-byte, that the history
and the cached answers survive (``PRAGMA integrity_check``), and that the next run works.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.answer_cache import CacheError
from engine.storage import Store, StoreError
from engine.storage.db import APPLICATION_ID
from tests.hostile.conftest import BRISK, Run, integrity
from tests.support import ROOT

FLAGS = ("--dtype", "float32", "--quant", "none", "--max-tokens", "8", "--json")
LOCKED = "locked by another program"

# How the CLI made brisk.db before the answer cache used engine.storage.db: a plain connection, no
# application_id, user_version 0, the cache's version in answer_cache_meta (DDL as written then).
OLD_CLI_DDL = """
CREATE TABLE answer_cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS "answer_cache" (
   "id" INTEGER PRIMARY KEY, "model_key" TEXT NOT NULL, "model_name" TEXT, "weight_hash" TEXT,
   "dtype" TEXT, "quant" TEXT, "context_hash" TEXT NOT NULL, "question_key" TEXT NOT NULL,
   "question_norm" TEXT, "question" TEXT NOT NULL, "answer" TEXT NOT NULL, "token_ids" BLOB,
   "generation_s" REAL DEFAULT 0.0, "created" REAL NOT NULL, "last_used" REAL NOT NULL,
   "hits" INTEGER DEFAULT 0, "embedding" BLOB, "sampled" INTEGER DEFAULT 0, "tools" TEXT DEFAULT '[]');
CREATE UNIQUE INDEX answer_cache_key ON answer_cache (model_key, context_hash, question_key);
CREATE INDEX answer_cache_lru ON answer_cache (last_used);
CREATE TABLE answer_cache_stats (name TEXT PRIMARY KEY, value REAL NOT NULL);
INSERT INTO answer_cache_stats VALUES ('lookups', 1), ('exact_hits', 0), ('semantic_hits', 0), ('saved_s', 0);
CREATE INDEX answer_cache_unembedded ON answer_cache (model_key) WHERE embedding IS NULL;
INSERT INTO answer_cache_meta VALUES ('schema_version', '2');
"""

# The window's start-up with a scripted engine: reports the store it opened and any fallback banner, saves a
# conversation through that store, and quits.
WINDOW = """
import json, sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import app.launch
from app.window import MainWindow
from tests.support.fake_engine import FakeEngine

app.launch.backend_factory_for = lambda settings: FakeEngine

def check():
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if not (windows and windows[0].isVisible()):
        QTimer.singleShot(20, check)
        return
    window = windows[0]
    banner = window.banner("store-fallback")
    saved = None
    if window.store.path is not None and not window.store.read_only:
        saved = window.store.create_conversation("from the window")
    print("WINDOW " + json.dumps({
        "banner": banner.text() if banner is not None and banner.isVisible() else None,
        "path": str(window.store.path), "saved": saved}), flush=True)
    QApplication.quit()

QTimer.singleShot(0, check)
sys.exit(app.launch.run_gui(None, None))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def events(run: Run) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def ask(cli: Callable[..., Run], data: Path, tiny: Path, prompt: str = "hi") -> tuple[dict[str, Any], Run]:
    """``brisk ask PROMPT --json`` on the tiny model; returns its ``done`` event and the run."""
    run = cli("ask", "--model", str(tiny), *FLAGS, prompt, data_dir=data)
    assert run.returncode == 0, run.stderr[-3000:]
    done = [e for e in events(run) if e["type"] == "done"]
    assert len(done) == 1, run.stdout[-2000:]
    return done[0], run


def window_process(data: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BRISK_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", WINDOW]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def window_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the window did not start within 120 s")
    assert process.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("WINDOW ")]
    assert len(lines) == 1, out[-2000:] + err[-2000:]
    result: dict[str, Any] = json.loads(lines[0].removeprefix("WINDOW "))
    return result


def window_start(data: Path) -> dict[str, Any]:
    return window_result(window_process(data))


def assert_shared_file_is_whole(path: Path, conversations: int) -> None:
    assert integrity(path) == "ok"
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert raw.execute("SELECT version FROM brisk_schema WHERE name = 'answer_cache'").fetchone() == (2,)
    finally:
        raw.close()
    with Store(path) as store:
        assert not store.read_only
        assert len(store.list_conversations()) == conversations


def assert_window_opened(result: dict[str, Any], data: Path) -> None:
    assert result["banner"] is None, result["banner"]
    assert result["path"] == str(data / "brisk.db") and result["saved"]


@pytest.mark.parametrize("first", ["cli", "window"])
def test_cli_and_window_share_the_file_in_either_order(
    cli: Callable[..., Run], data: Path, tiny: Path, first: str
) -> None:
    if first == "window":
        assert_window_opened(window_start(data), data)
    done, _ = ask(cli, data, tiny)
    assert done["metrics"]["answer_cache"] is None
    assert_window_opened(window_start(data), data)
    again, _ = ask(cli, data, tiny)
    assert again["metrics"]["answer_cache"] == "exact" and again["text"] == done["text"]
    assert_shared_file_is_whole(data / "brisk.db", conversations=2 if first == "window" else 1)


def test_window_and_cli_starting_together_on_an_empty_folder(cli: Callable[..., Run], data: Path, tiny: Path) -> None:
    window = window_process(data)  # both create the file; whichever comes second opens it
    done, run = ask(cli, data, tiny)
    assert_window_opened(window_result(window), data)
    assert "warning" not in run.stderr.lower(), run.stderr[-2000:]
    again, _ = ask(cli, data, tiny)
    assert again["metrics"]["answer_cache"] == "exact" and again["text"] == done["text"]
    assert_shared_file_is_whole(data / "brisk.db", conversations=1)


def _make_old_cli_file(path: Path, rows: list[tuple[Any, ...]]) -> None:
    raw = sqlite3.connect(path)
    raw.executescript(OLD_CLI_DDL)
    raw.executemany(f"INSERT INTO answer_cache VALUES ({', '.join('?' * len(rows[0]))})", rows)
    raw.commit()
    raw.execute("PRAGMA journal_mode = WAL")
    raw.close()


@pytest.mark.parametrize("first", ["cli", "window"])
def test_a_file_from_the_old_cli_is_adopted_with_its_answers(
    cli: Callable[..., Run], data: Path, tiny: Path, first: str
) -> None:
    done, _ = ask(cli, data, tiny)
    path = data / "brisk.db"
    raw = sqlite3.connect(path)
    rows = raw.execute("SELECT * FROM answer_cache").fetchall()
    raw.close()
    assert len(rows) == 1
    for name in ("brisk.db", "brisk.db-wal", "brisk.db-shm"):
        (data / name).unlink(missing_ok=True)
    _make_old_cli_file(path, rows)  # the same answer, in a file the old CLI made

    if first == "window":
        assert_window_opened(window_start(data), data)
    again, _ = ask(cli, data, tiny)
    assert again["metrics"]["answer_cache"] == "exact" and again["text"] == done["text"]
    assert_window_opened(window_start(data), data)
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT count(*) FROM sqlite_master WHERE name = 'answer_cache_meta'").fetchone() == (0,)
    assert raw.execute("SELECT value FROM answer_cache_stats WHERE name = 'lookups'").fetchone()[0] >= 2
    raw.close()
    assert_shared_file_is_whole(path, conversations=2 if first == "window" else 1)


def test_a_strangers_database_is_refused_and_left_byte_for_byte(
    cli: Callable[..., Run], data: Path, tiny: Path
) -> None:
    path = data / "brisk.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE invoices (number INTEGER, total REAL)")
    raw.execute("INSERT INTO invoices VALUES (1, 9.5)")
    raw.commit()
    raw.close()
    before = path.read_bytes()

    done, run = ask(cli, data, tiny)  # the reply comes from the model; the cache is off and says why
    assert done["text"] and "not Brisk's" in run.stderr and "Move it aside" in run.stderr
    result = window_start(data)
    assert result["banner"] is not None and "not Brisk's" in result["banner"] and result["saved"] is None
    assert path.read_bytes() == before
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("brisk.db")) == ["brisk.db"]


def test_a_writer_in_another_process_while_the_cli_asks(cli: Callable[..., Run], data: Path, tiny: Path) -> None:
    ask(cli, data, tiny)  # the file exists; now the window writes while a second ask runs
    path = data / "brisk.db"
    env = dict(os.environ, HF_HUB_OFFLINE="1", BRISK_DATA_DIR=str(data))
    command = [*BRISK, "ask", "--model", str(tiny), *FLAGS, "a second question"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    saved = 0
    other = sqlite3.connect(path, timeout=30, isolation_level=None)  # the window's connection
    with Store(path, busy_timeout_ms=30_000) as store:
        conversation = store.create_conversation("written meanwhile")
        while process.poll() is None:  # a save holds the write lock for up to 50 ms, then leaves it 50 ms
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE conversations SET title = title || '.' WHERE id = ?", [conversation])
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
            other.execute("COMMIT")
            store.add_message(conversation, "user", f"line {saved}")
            saved += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
        other.close()
        out, err = process.communicate()
        assert process.returncode == 0, err[-3000:]
        assert LOCKED not in err, err[-2000:]
        assert [m.content for m in store.messages(conversation)] == [f"line {i}" for i in range(saved)]
        assert store.get_conversation(conversation).title == "written meanwhile" + "." * saved
    assert saved > 0
    again, _ = ask(cli, data, tiny, "a second question")  # the answer was stored despite the writer
    assert again["metrics"]["answer_cache"] == "exact"
    assert integrity(path) == "ok"


def test_a_database_locked_for_the_whole_run_costs_only_the_cache(
    cli: Callable[..., Run], data: Path, tiny: Path
) -> None:
    ask(cli, data, tiny)
    path = data / "brisk.db"
    with Store(path) as store:
        conversation = store.create_conversation("kept")
        store.add_message(conversation, "user", "precious words")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the file for as long as the ask runs
    try:
        run = cli("ask", "--model", str(tiny), *FLAGS, "asked while locked", data_dir=data, timeout=150)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert [e for e in events(run) if e["type"] == "done"], run.stdout[-2000:]
    assert LOCKED in run.stderr and "try again" in run.stderr
    waited = set(re.findall(r"Could not ([^:]+): the answer cache at", run.stdout + run.stderr))  # warnings, log
    assert len(waited) == 1, waited  # the locked file waited on once (10 s), then the cache rests for the run
    with Store(path) as store:
        assert [m.content for m in store.messages(conversation)] == ["precious words"]
    done, _ = ask(cli, data, tiny, "asked while locked")  # the next run works and stores its answer
    assert done["text"] and _cached(path, "asked while locked") == 1
    assert integrity(path) == "ok"


def _cached(path: Path, question: str) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("SELECT count(*) FROM answer_cache WHERE question = ?", [question]).fetchone()[0])
    finally:
        raw.close()


def _scribble_root_page(path: Path, table: str) -> None:
    raw = sqlite3.connect(path)
    root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    page = raw.execute("PRAGMA page_size").fetchone()[0]
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page)
        handle.write(b"\xff" * page)


def _history_file(path: Path) -> list[str]:
    from engine.answer_cache import AnswerCache, Embedder

    cache = AnswerCache(path, embedder=Embedder())
    cache.store.upsert({"model_key": "m", "context_hash": "c", "question_key": "q", "question": "q", "answer": "a"})
    cache.close()
    with Store(path) as store:
        for i in range(20):
            conversation = store.create_conversation(f"chat {i}")
            store.add_message(conversation, "user", f"words {i} " * 200)
        return [c.id for c in store.list_conversations()]


def test_a_damaged_answer_cache_never_costs_the_history(cli: Callable[..., Run], data: Path, tiny: Path) -> None:
    path = data / "brisk.db"
    kept = _history_file(path)
    _scribble_root_page(path, "answer_cache")
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        integrity(path)

    assert_window_opened(window_start(data), data)  # the cache's tables are rebuilt, the history is not touched
    assert integrity(path) == "ok"
    with Store(path) as store:
        assert [c.id for c in store.list_conversations()][1:] == kept
        assert all(len(store.messages(c)) == 1 for c in kept)
    done, _ = ask(cli, data, tiny)
    assert ask(cli, data, tiny)[0]["metrics"]["answer_cache"] == "exact"
    assert_shared_file_is_whole(path, conversations=len(kept) + 1)
    assert done["text"]


def test_damage_outside_the_cache_is_refused_and_left_byte_for_byte(data: Path) -> None:
    path = data / "brisk.db"
    _history_file(path)
    _scribble_root_page(path, "messages")
    before = path.read_bytes()
    for label, open_file in (("chat database", lambda: Store(path)), ("answer cache", lambda: _open_cache(path))):
        with pytest.raises((StoreError, CacheError), match="damaged") as info:
            open_file()
        assert str(path) in str(info.value) and "Nothing was changed" in str(info.value), label
        assert path.read_bytes() == before


def _open_cache(path: Path) -> None:
    from engine.answer_cache import AnswerCache, Embedder

    AnswerCache(path, embedder=Embedder()).close()
