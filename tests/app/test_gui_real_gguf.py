"""Opt-in: the window loads both real GGUF files from the Models view and answers on each (issue 47).

Set ``BRISK_REAL_MODELS`` to the folder ``shared/models/get-real-models.sh`` filled (both Qwen2.5-Coder files);
CI does not (the files are 1.5 GB).  The real window, the real engine and the real files: the folder added in
the Models view, each file picked and loaded with the Load button, run on its own blocks, then a question
answered.  The process's peak memory after both is printed beside the files' sizes.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.window.main_window import MainWindow
from engine.api import Done, Loaded, LoadFailed
from engine.client import local_backend
from engine.storage import Settings, Store

FILES = ("qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
REAL = Path(os.environ.get("BRISK_REAL_MODELS", "/nonexistent"))
pytestmark = pytest.mark.skipif(
    not all((REAL / name).is_file() for name in FILES),
    reason="opt-in: set BRISK_REAL_MODELS to the folder of shared/models/get-real-models.sh",
)


def test_the_models_view_loads_both_real_gguf_files_and_each_answers(qtbot: QtBot, brisk_data_dir: Path) -> None:
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    settings = Settings(device="cpu", max_tokens=12, answer_cache=False)
    window = MainWindow(Store(brisk_data_dir / "real.db"), bridge, settings)
    qtbot.addWidget(window)
    window.show()
    dialog = window.open_models()
    dialog.add_folder_path(str(REAL))
    for name in FILES:
        stem = name.removesuffix(".gguf")
        qtbot.waitUntil(lambda s=stem: any(r.entry.name.endswith(s) for r in dialog.rows), timeout=60_000)
        row = next(i for i, r in enumerate(dialog.rows) if r.entry.name.endswith(stem))
        dialog.table.selectRow(row)
        assert dialog.load_button.isEnabled()
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed),
                              timeout=180_000) as loaded:  # fmt: skip
            dialog.load_button.click()
        event = loaded.args[0]
        assert isinstance(event, Loaded), getattr(event, "message", event)
        assert event.info.quant == "gguf" and window.settings.model.endswith(name)  # its own blocks, remembered
        window.new_chat()
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=180_000) as done:
            window.composer.editor.setPlainText("Write a Python function that adds two numbers.")
            qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
        assert done.args[0].metrics.completion_tokens > 0
        qtbot.waitUntil(lambda: window.session.active is None)
        assert window.session.messages()[-1].content.strip()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sizes = [(REAL / n).stat().st_size for n in FILES]
    print(f"peak RSS {peak / 1e9:.2f} GB; files {', '.join(f'{s / 1e9:.2f} GB' for s in sizes)}")
    window.close()
    bridge.shutdown()
    window.store.close()
