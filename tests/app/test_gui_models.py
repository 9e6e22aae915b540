"""The Models view: models from LM Studio, Ollama and the Hugging Face cache listed, loaded, drafted, downloaded."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.dialogs.models import ModelsDialog
from engine.api import Loaded
from engine.library.scan import system_folder_problem
from tests.support.gui_harness import fake
from tests.support.model_library import build_library, hf_cache_add_folder
from tests.support.tiny import make_tiny_model


def scanned(qtbot, dialog: ModelsDialog) -> ModelsDialog:  # noqa: ANN001
    qtbot.waitUntil(lambda: dialog.library is not None and dialog.table.rowCount() > 0, timeout=30_000)
    return dialog


def row_named(dialog: ModelsDialog, name: str) -> int:
    return next(i for i, row in enumerate(dialog.rows) if row.entry.name == name)


def test_models_view_lists_every_app_and_says_why_one_cannot_load(qtbot, library_home: Path, tiny_dir: Path) -> None:  # noqa: ANN001
    build_library(library_home, tiny_dir)
    dialog = scanned(qtbot, ModelsDialog("", [], None))
    qtbot.addWidget(dialog)
    names = [dialog.table.item(r, 0).text() for r in range(dialog.table.rowCount())]
    assert "SmolLM2-135M-Instruct (bundled) (in use)" in names
    assert {"Org/tiny-chat", "smollm2:135m", "ghost:latest"} <= set(names)
    sources = {dialog.table.item(r, 1).text() for r in range(dialog.table.rowCount())}
    assert {"Hugging Face cache", "LM Studio", "Ollama", "GPT4All", "Bundled with Brisk"} <= sources
    assert "models on this computer" in dialog.summary.text() and "memory free" in dialog.summary.text()

    dialog.table.selectRow(row_named(dialog, "ghost:latest"))
    assert not dialog.load_button.isEnabled()
    assert "ollama pull ghost:latest" in dialog.details.text()
    assert dialog.table.item(row_named(dialog, "ghost:latest"), 7).text() == "Cannot load"

    dialog.table.selectRow(row_named(dialog, "Org/tiny-chat"))
    assert dialog.load_button.isEnabled()
    with qtbot.waitSignal(dialog.load_requested) as loaded:
        dialog.load_button.click()
    assert loaded.args[0].endswith("snapshots/" + "a" * 40)
    assert dialog.table.item(row_named(dialog, "Org/tiny-chat"), 0).text() == "Org/tiny-chat (in use)"

    dialog.filter_edit.setText("ollama")
    assert sorted(row.entry.name for row in dialog.rows) == ["ghost:latest", "smollm2:135m"]


def test_a_smaller_model_of_the_same_vocabulary_is_offered_as_draft(qtbot, library_home: Path, tmp_path: Path) -> None:  # noqa: ANN001
    import os

    hub = Path(os.environ["HF_HUB_CACHE"])
    big = hf_cache_add_folder(hub, "Org/big", make_tiny_model(tmp_path / "big", seed=1, layers=3, hidden=96))
    hf_cache_add_folder(hub, "Org/small", make_tiny_model(tmp_path / "small", seed=2, layers=1))
    dialog = scanned(qtbot, ModelsDialog(str(big), [], None))
    qtbot.addWidget(dialog)
    dialog.table.selectRow(row_named(dialog, "Org/big"))
    assert "Can draft for it" in dialog.details.text() and "Org/small" in dialog.details.text()
    assert not dialog.draft_button.isEnabled()  # the loaded model cannot draft for itself
    dialog.table.selectRow(row_named(dialog, "SmolLM2-135M-Instruct (bundled)"))
    assert not dialog.draft_button.isEnabled()  # another vocabulary
    dialog.table.selectRow(row_named(dialog, "Org/small"))
    assert dialog.draft_button.isEnabled()
    with qtbot.waitSignal(dialog.draft_requested) as drafted:
        dialog.draft_button.click()
    assert drafted.args[0].endswith("snapshots/" + "a" * 40) and "models--Org--small" in drafted.args[0]


def test_window_loads_the_model_picked_in_the_models_view(harness, library_home: Path, tiny_dir: Path) -> None:  # noqa: ANN001
    build_library(library_home, tiny_dir)
    window = harness.open()
    assert "Models\u2026" in [a.text() for a in window.menuBar().actions()[3].menu().actions()]
    dialog = scanned(harness.qtbot, window.open_models())
    dialog.table.selectRow(row_named(dialog, "Org/tiny-chat"))
    with harness.qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded), timeout=10_000):
        dialog.load_button.click()
    assert window.settings.model.endswith("snapshots/" + "a" * 40)
    assert fake(window).loads[-1].source == window.settings.model
    reopened = harness.open(settings=type(window.settings).load(), load=False)
    assert reopened.settings.model == window.settings.model  # remembered
    folder = library_home / "more"
    folder.mkdir()
    dialog.add_folder_path(str(folder))
    assert window.settings.model_folders == [str(folder)]
    for system in ("/proc", "/proc/self/cwd", "/"):  # another process's files, or the whole disk: refused, said
        dialog.add_folder_path(system)
        assert window.settings.model_folders == [str(folder)]
        assert dialog.details.text() == system_folder_problem(system) != ""
    dialog._list_folders()
    removing = [a for a in dialog.folders_menu.actions() if a.text() == f"Remove {folder}"]
    assert len(removing) == 1
    removing[0].trigger()
    assert window.settings.model_folders == []
    dialog._list_folders()
    assert [a.text() for a in dialog.folders_menu.actions()] == ["No folders of yours yet"]
    QApplication.processEvents()


def test_download_shows_progress_and_lists_the_model(qtbot, empty_hub, tmp_path: Path) -> None:  # noqa: ANN001
    from tests.support.model_library import write_gguf

    data = write_gguf(tmp_path / "q.gguf", "qwen2", [f"w{i}" for i in range(4000)], hidden=256).read_bytes()
    empty_hub.add_repo("Org/Tiny-Qwen-GGUF", {"tiny-qwen-Q4_K_M.gguf": data, "tiny-qwen-Q8_0.gguf": data[:-1]})
    empty_hub.delay["tiny-qwen-Q4_K_M.gguf"] = 0.002  # slow enough for the bar to move
    dialog = scanned(qtbot, ModelsDialog("", [], None))
    qtbot.addWidget(dialog)
    seen: list[int] = []
    dialog.progress.valueChanged.connect(seen.append)
    dialog.repo_edit.setText("Org/Tiny-Qwen-GGUF")
    dialog.quant_edit.setText("Q4_K_M")
    dialog.download_button.click()
    assert dialog.cancel_button.isEnabled() and not dialog.download_button.isEnabled()
    qtbot.waitUntil(lambda: dialog._cancel is None, timeout=60_000)
    assert dialog.progress_label.text().startswith("Downloaded Org/Tiny-Qwen-GGUF")
    assert seen == sorted(seen) and seen[-1] == 1000
    qtbot.waitUntil(lambda: any(r.entry.name.startswith("Org/Tiny-Qwen-GGUF/") for r in dialog.rows), timeout=30_000)
    row = next(r for r in dialog.rows if r.entry.name.startswith("Org/Tiny-Qwen-GGUF/"))
    assert row.entry.quant == "Q4_K_M" and row.entry.source == "huggingface"


def test_a_cancelled_download_says_it_resumes(qtbot, empty_hub, tmp_path: Path) -> None:  # noqa: ANN001
    from tests.support.model_library import write_gguf

    data = write_gguf(tmp_path / "q.gguf", "qwen2", [f"w{i}" for i in range(4000)], hidden=256).read_bytes()
    empty_hub.add_repo("Org/Stalled-GGUF", {"stalled-Q4_K_M.gguf": data})
    release = empty_hub.hold_after("stalled-Q4_K_M.gguf", len(data) // 2)
    dialog = scanned(qtbot, ModelsDialog("", [], None))
    qtbot.addWidget(dialog)
    dialog.repo_edit.setText("Org/Stalled-GGUF")
    dialog.download_button.click()
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=30_000)
    dialog.cancel_button.click()
    release.set()
    qtbot.waitUntil(lambda: dialog._cancel is None, timeout=30_000)
    assert "cancel" in dialog.progress_label.text().lower() or "stopped" in dialog.progress_label.text().lower()
    assert dialog.download_button.isEnabled() and not dialog.cancel_button.isEnabled()


def test_settings_say_what_the_model_is_and_which_path_runs_it(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    from app.dialogs.settings import SettingsDialog
    from engine.storage import Settings
    from tests.support.model_library import write_gguf

    dialog = SettingsDialog(Settings(), None)
    qtbot.addWidget(dialog)
    assert "llama" in dialog.model_note.text() and "fast path and native decode step" in dialog.model_note.text()
    starcoder = write_gguf(tmp_path / "starcoder.gguf", "starcoder2")
    dialog.model_edit.setText(str(starcoder))
    dialog.model_edit.editingFinished.emit()
    assert "starcoder2" in dialog.model_note.text() and "transformers' forward" in dialog.model_note.text()
    assert "fast path and native decode step" not in dialog.model_note.text()
    rwkv = write_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    dialog.model_edit.setText(str(rwkv))
    dialog.model_edit.editingFinished.emit()
    assert dialog.model_note.text().startswith("Cannot load:") and "rwkv6" in dialog.model_note.text()


def test_greyed_draft_source_names_a_model_on_disk_that_could_draft(
    harness, library_home: Path, tmp_path: Path
) -> None:  # noqa: ANN001
    import os

    from engine.storage import Settings

    hub = Path(os.environ["HF_HUB_CACHE"])
    big = hf_cache_add_folder(hub, "Org/big", make_tiny_model(tmp_path / "big", seed=1, layers=3, hidden=96))
    hf_cache_add_folder(hub, "Org/small", make_tiny_model(tmp_path / "small", seed=2, layers=1))
    window = harness.open(settings=Settings(model=str(big)))
    switches = window.latency.panel.switches
    item = switches.speculative.model().item(switches.speculative.findData("draft"))
    harness.qtbot.waitUntil(lambda: "Org/small" in item.toolTip(), timeout=30_000)
    assert not item.isEnabled() and "Tools > Models offers Org/small" in item.toolTip()
