"""Settings' "This chat" group: the open chat's overflow policy, shown and saved with the chat."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.dialogs.settings import SettingsDialog
from engine.storage import Settings
from tests.support.gui_harness import Harness, chat


def test_settings_sets_the_open_chats_overflow_policy(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Hi")
    dialog = SettingsDialog(Settings(), window, overflow=window.session.overflow())
    qtbot.addWidget(dialog)
    combo = dialog.overflow_combo
    assert combo is not None and combo.currentData() == "drop-middle"
    combo.setCurrentIndex(combo.findData("stop"))
    window.set_overflow(dialog.result_overflow())
    assert window.store.get_conversation(conversation_id).params["overflow"] == "stop"
    chat(qtbot, window, "Again")
    assert window.bridge.backend.requests[-1].overflow == "stop"
    assert SettingsDialog(Settings(), window).overflow_combo is None, "no chat option without a chat's policy"
