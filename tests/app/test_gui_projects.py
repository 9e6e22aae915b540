"""Projects in the window (issue 52): "New project…", a new chat in it taking its prompt, values and documents,
grouped under it in the sidebar, its prefix hinted to the engine when opened, moving and deleting."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from unittest.mock import patch

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.bridge import EngineBridge
from app.dialogs.project import ProjectDialog
from app.views.conversation_list import KIND_ROLE, LEVEL_ROLE, PROJECT, PROJECT_MARK
from app.window.main_window import MainWindow
from app.window.projects import WARM_DRAFT
from engine.api import Done, DraftPrefill, Loaded, LoadFailed
from engine.bench import project as project_bench
from engine.client import local_backend
from engine.storage import Settings, Store
from tests.support.gui_harness import Harness, chat, fake

DOCS = [{"id": "d" * 64, "name": "guide.md", "path": "/tmp/guide.md", "chars": 900, "tokens": 210}]


def rows(window) -> list[tuple[str, str, int]]:  # noqa: ANN001
    model = window.sidebar.model
    return [
        (model.index(r).data(KIND_ROLE), model.index(r).data(), model.index(r).data(LEVEL_ROLE))
        for r in range(model.rowCount())
    ]


def test_a_new_chat_in_a_project_takes_its_prompt_and_sits_under_it_warm(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    chat(qtbot, window, "Outside question")
    engine = fake(window)
    before = len(engine.hints)
    project_id = window.projects.new_project("Trips", "You plan trips.")
    assert project_id is not None
    window.store.set_project_params(project_id, {"temperature": 0.0})
    window.store.set_project_documents(project_id, DOCS)
    window.sidebar.new_chat_in_project_requested.emit(project_id)  # its header's "New chat in project"

    # opened: a new chat with the project's prompt, values and documents, its prefix hinted as the Send would be
    assert window.session.conversation_id is None and window.session.pending_project == project_id
    assert window.session.chat_params() == ("You plan trips.", {"temperature": 0.0})
    assert window.session.documents() == DOCS
    warm = engine.hints[-1]
    assert len(engine.hints) > before and warm.conversation_id == window.session.draft_id
    assert [(m["role"], m["content"]) for m in warm.messages] == [("system", "You plan trips."), ("user", WARM_DRAFT)]
    assert warm.documents == (DOCS[0]["id"],) and warm.sampling.temperature == 0.0
    assert project_bench.WARM_DRAFT == WARM_DRAFT, "the bench hints what the window hints"

    inside = chat(qtbot, window, "Where to in May?")
    assert window.store.get_conversation(inside).project_id == project_id
    assert window.store.get_conversation(inside).system_prompt == "You plan trips."
    assert engine.requests[-1].messages[0] == {"role": "system", "content": "You plan trips."}
    assert rows(window) == [
        (PROJECT, f"{PROJECT_MARK}Trips", 0),
        ("chat", "Where to in May?", 1),
        ("chat", "Outside question", 0),
    ]

    # a plain new chat is in no project, and leaves the project's documents behind
    window.new_chat()
    assert window.session.pending_project is None and window.session.documents() == []
    assert window.session.chat_params()[0] == window.settings.system_prompt


def test_selecting_a_project_opens_its_new_chat_and_settings_move_and_delete(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    outside = chat(qtbot, window, "Loose chat")
    project_id = window.projects.new_project("Work", "Be formal.")
    assert project_id is not None
    window.open_conversation(outside)
    row = window.sidebar.model.project_row(project_id)
    assert row is not None
    window.sidebar.list_view.setCurrentIndex(window.sidebar.model.index(row))  # a click on its header
    assert window.session.conversation_id is None and window.session.pending_project == project_id

    dialog = ProjectDialog(window, name="Office", system_prompt="Be terse.", settings=True)
    dialog.temperature.setValue(0.5)
    assert window.projects.edit_project(project_id, dialog)
    assert (window.store.get_project(project_id).name, window.store.get_project(project_id).params) == (
        "Office",
        {"temperature": 0.5},
    )
    assert window.session.chat_params() == ("Be terse.", {"temperature": 0.5}), "its open new chat follows"

    with patch.object(QInputDialog, "getItem", return_value=("Office", True)):
        assert window.projects.move_to_project(outside)
    assert window.store.get_conversation(outside).project_id == project_id
    assert [r[1] for r in rows(window)] == [f"{PROJECT_MARK}Office", "Loose chat"]

    with patch.object(QMessageBox, "question", return_value=QMessageBox.StandardButton.Yes) as asked:
        assert window.projects.delete_project(project_id)
    assert "stay, outside any project" in asked.call_args.args[2]
    assert window.store.get_conversation(outside).project_id is None
    assert rows(window) == [("chat", "Loose chat", 0)]


def test_on_the_real_engine_a_new_chat_in_an_opened_project_reuses_its_prefilled_prefix(
    qtbot: QtBot, brisk_data_dir: Path, tiny_dir: Path
) -> None:
    settings = Settings(
        model=str(tiny_dir), device="cpu", dtype="float32", quant="none", max_tokens=4, speculative="off"
    )
    settings = dataclasses.replace(settings, answer_cache=False, temperature=0.0)
    bridge = EngineBridge(local_backend(persist_prefixes=False))
    window = MainWindow(Store(brisk_data_dir / "brisk.db"), bridge, settings)
    qtbot.addWidget(window)
    try:
        with qtbot.waitSignal(
            bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=60_000
        ):
            window.load_model()
        assert window.model_ready
        draft = window.session.draft_id
        with qtbot.waitSignal(  # the project's prefix prefilled in the background, all of it
            bridge.event,
            check_params_cb=lambda e: (
                isinstance(e, DraftPrefill) and e.conversation_id == draft and e.ready == e.total > 0
            ),
            timeout=60_000,
        ):
            window.projects.new_project("Trips", "You plan trips by train for a family of four, two nights a town.")
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=60_000) as done:
            window.composer.editor.setPlainText("Where to in May?")
            qtbot.keyClick(window.composer.editor, Qt.Key.Key_Return)
        metrics = done.args[0].metrics
        assert metrics.cached_tokens > 60 and metrics.typed_tokens == metrics.cached_tokens
        assert metrics.computed_tokens < metrics.cached_tokens
        qtbot.waitUntil(lambda: window.session.active is None)
        assert window.store.get_conversation(window.session.conversation_id or "").project_id is not None
    finally:
        window.close()
        bridge.shutdown()
        window.store.close()
