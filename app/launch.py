"""Start the desktop app: ``run_gui(model, db_path)`` returns the exit code.

Order matters for a window that appears fast: the QApplication, settings and
store come first, the window is shown, and only then (on the first turn of the
event loop) does the bridge start the engine and load the model in the
background.  The event loop is qasync's, so ``async`` code can share it.

If the chat database cannot be opened (:class:`~engine.storage.StoreError`), the
app runs on an in-memory store and says so in a banner; the damaged file is
never touched.  Settings values that could not be used (``Settings.load_with_problems``) are
said once, in a warning banner (:func:`show_settings_problems`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.window.layout import LayoutFile
from engine import client
from engine.client import BackendFactory, local_backend
from engine.storage import Settings, Store, StoreError, database_path

ICON_PATH = Path(__file__).resolve().parent.parent / "resources" / "brisk.svg"


def open_store(path: Path) -> tuple[Store, str | None]:
    """The store at ``path``, or an in-memory one plus a warning saying why."""
    try:
        store = Store(path)
    except StoreError as exc:
        warning = f"History will not be saved this session. {exc}"
        return Store(None), warning
    try:
        store.recover_streaming()
    except StoreError as exc:
        return store, f"Unfinished replies from last time could not be marked as stopped. {exc}"
    return store, None


def backend_factory_for(settings: Settings) -> BackendFactory:
    """The local engine with the prefix-cache budget, tools (granted folders, fetch, MCP servers) and
    answer-cache threshold and TTL from ``settings`` (torch is imported only when it starts)."""
    from app.state.tools import answer_cache_settings, tool_settings

    return local_backend(
        prefix_cache_bytes=settings.prefix_cache_mb << 20,
        tools=tool_settings(settings),
        answer_cache=answer_cache_settings(settings),
        defer_probe=True,  # a first start chats on float32 while the weight modes are measured
    )


def show_settings_problems(window: Any, problems: list[str]) -> None:
    """Say once, in a banner, which saved settings could not be used (each took its default)."""
    if problems:
        said = " ".join(problem.rstrip(".") + "." for problem in problems)
        text = f"Some saved settings could not be used, so their defaults apply. {said}"
        window.show_banner("settings-problems", "warning", text, "Open Settings\u2026", window.open_settings)


def app_icon() -> QIcon:
    return QIcon(str(ICON_PATH)) if ICON_PATH.exists() else QIcon.fromTheme("brisk")


def prepare_model(settings: Settings, model: str | None = None) -> None:
    """Work a first start can begin before Qt and the engine are up: hashing the model file to convert."""
    from app.engines import LOCAL, engine_choice

    choice = engine_choice(settings, model)
    if choice.key == LOCAL:
        client.prepare_model(choice.spec.source)


def run_gui(model: str | None = None, db_path: Path | None = None) -> int:
    """Open the Brisk window; ``model`` overrides Settings.model for this run."""
    import qasync

    from app.bridge import EngineBridge
    from app.window import MainWindow

    settings, problems = Settings.load_with_problems()
    prepare_model(settings, model)
    app = QApplication.instance() or QApplication(sys.argv)
    assert isinstance(app, QApplication)
    app.setApplicationName("Brisk")
    app.setDesktopFileName("brisk")
    app.setWindowIcon(app_icon())
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)

    store, warning = open_store(db_path or database_path())
    bridge = EngineBridge(backend_factory_for(settings))
    window = MainWindow(store, bridge, settings, store_warning=warning, model_override=model, layout_file=LayoutFile())
    show_settings_problems(window, problems)
    window.show()
    QTimer.singleShot(0, window.load_model)
    smoke = os.environ.get("BRISK_SMOKE_SHOT")  # the bundle's test: once loaded, save the window there and quit
    if smoke:
        from engine.api import Loaded, LoadFailed

        def shot(event: object) -> None:
            if isinstance(event, Loaded | LoadFailed):
                print(f"smoke: {type(event).__name__}", flush=True)

                def save() -> None:  # once the window has laid out what the load changed, as a user sees it
                    window.grab().save(smoke)
                    app.quit()

                QTimer.singleShot(500, save)

        bridge.event.connect(shot)

    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    try:
        with loop:
            loop.run_until_complete(closed.wait())
    finally:
        bridge.shutdown()
        try:
            store.close()
        except StoreError as exc:
            print(f"brisk: {exc}", file=sys.stderr)
    return 0
