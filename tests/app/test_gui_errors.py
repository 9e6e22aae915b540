"""GUI: notices and errors: truncation, engine errors, load failures, draft warnings, store failures,
damaged history rows."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest
from pytestqt.qtbot import QtBot

from app.launch import open_store
from app.views.chat_model import DAMAGED_NOTICE
from app.views.chat_view import TRUNCATED_NOTICE
from engine.api import Loaded, ModelSpec, Warning
from engine.storage import Store, StoreError
from tests.support.gui_harness import FULL_REPLY, Harness, chat, fake, last_bubble, stored, type_and_send

# -- notices and errors ------------------------------------------------------------------------------


def test_truncated_prompt_shows_a_notice(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    fake(window).truncated = True
    chat(qtbot, window, "Hi")
    notice = last_bubble(window).notice
    assert notice.isVisible() and notice.text() == TRUNCATED_NOTICE


def test_engine_error_is_shown_and_partial_text_kept(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.fail_with = "The model failed while generating: out of memory. Try a shorter prompt."
    engine.tokens = ["Par", "tial"]
    type_and_send(qtbot, window, "Hi")
    qtbot.waitUntil(lambda: window.session.active is None)
    bubble = last_bubble(window)
    assert bubble.error.isVisible() and "out of memory" in bubble.error.text()
    assert bubble.plain_text == "Partial"
    conversation_id = window.session.conversation_id
    assert conversation_id is not None
    assistant = stored(window, conversation_id)[1]
    assert (assistant.content, assistant.status) == ("Partial", "error")
    assert "out of memory" in assistant.metrics["error"]
    assert window.composer.button.text() == "Send"


def test_load_failure_is_shown_and_another_model_can_be_picked(qtbot: QtBot, harness: Harness) -> None:
    message = "No model at /nope: the folder does not exist. Pick a model folder or a .gguf file."
    window = harness.open(load_error=message)
    banner = window.banner("load")
    assert banner is not None and message in banner.text()
    assert banner.action is not None and "Settings" in banner.action.text()
    assert message in window.status_area.message_label.text()
    assert not window.composer.button.isEnabled()
    assert "settings" in window.composer.button.toolTip().lower()

    engine = fake(window)
    engine.load_error = None
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, model="/models/good"))
    assert engine.loads[-1] == ModelSpec(source="/models/good", device="auto", dtype="auto", quant="auto")
    assert window.banner("load") is None
    assert window.composer.button.isEnabled()
    assert window.status_area.model_label.text() == "/models/good"


def test_draft_model_failure_is_a_warning_and_the_model_stays_usable(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    engine = fake(window)
    engine.draft_error = "No model at /models/draft: the folder does not exist."
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Warning)):
        window.apply_settings(replace(window.settings, draft_model="/models/draft"))
    assert engine.loads[-1].draft == "/models/draft"
    warning = window.banner("draft")
    assert warning is not None and warning.kind == "warning"
    assert "Draft model not used" in warning.text() and "/models/draft" in warning.text()
    assert window.banner("load") is None
    assert window.model_ready and window.composer.button.isEnabled()
    assert "Loading failed" not in window.status_area.message_label.text()
    chat(qtbot, window, "Still works")
    assert last_bubble(window).plain_text == FULL_REPLY

    engine.draft_error = None  # a later load that works clears the warning
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, draft_model="/models/good-draft"))
    assert window.banner("draft") is None


def test_history_seeds_the_engine_answer_memory(qtbot: QtBot, harness: Harness) -> None:
    store = Store(harness.db_path)
    older = store.create_conversation("Older")
    store.add_message(older, "user", "What is a lighthouse?")
    store.add_message(older, "assistant", "A tower with a light.")
    store.add_message(older, "user", "And a foghorn?")
    store.add_message(older, "assistant", "Half an answer", status="cancelled")
    newer = store.create_conversation("Newer")
    store.add_message(newer, "user", "Who keeps it?")
    store.add_message(newer, "assistant", "The keeper.")
    store.add_message(newer, "user", "Why?")
    store.add_message(newer, "assistant", "", status="error")
    window = harness.open(store=store)
    expected = [("What is a lighthouse?", "A tower with a light."), ("Who keeps it?", "The keeper.")]
    qtbot.waitUntil(lambda: fake(window).remembered == expected)

    engine = fake(window)
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded)):
        window.apply_settings(replace(window.settings, answer_cache=False, device="cpu"))
    assert engine.remembered == expected  # not seeded again: the user turned answer memory off


def test_damaged_database_falls_back_to_memory(qtbot: QtBot, harness: Harness) -> None:
    damaged = harness.db_path
    damaged.write_bytes(b"this is not a database, just bytes " * 200)
    before = damaged.read_bytes()
    store, warning = open_store(damaged)
    assert warning is not None and "will not be saved" in warning
    window = harness.open(store=store, store_warning=warning)
    banner = window.banner("store-fallback")
    assert banner is not None and banner.isVisible()
    assert "will not be saved" in banner.text()
    conversation_id = chat(qtbot, window, "Still works")
    assert stored(window, conversation_id)[1].content == FULL_REPLY
    assert damaged.read_bytes() == before
    assert sorted(p.name for p in damaged.parent.iterdir()) == ["brisk.db"]


def test_store_error_becomes_a_banner(qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    window = harness.open()
    conversation_id = chat(qtbot, window, "Hi")

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreError("Could not rename: the disk is full. Free some space and try again.")

    monkeypatch.setattr(window.store, "rename_conversation", fail)
    window.rename_conversation(conversation_id, "New name")
    banner = window.banner("store-error")
    assert banner is not None and "disk is full" in banner.text()
    assert window.sidebar.model.titles() == ["Hi"]

    monkeypatch.setattr(window.store, "add_message", fail)
    type_and_send(qtbot, window, "Keep this text")
    assert window.composer.editor.toPlainText() == "Keep this text"
    assert window.session.active is None and window.composer.button.text() == "Send"


def test_store_error_while_streaming_keeps_the_reply_on_screen(
    qtbot: QtBot, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = harness.open()

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreError("Could not save the message: the database is locked.")

    monkeypatch.setattr(window.store, "update_message", fail)
    type_and_send(qtbot, window, "Hi")
    qtbot.waitUntil(lambda: window.session.active is None)
    assert last_bubble(window).plain_text == FULL_REPLY
    banner = window.banner("store-error")
    assert banner is not None and "locked" in banner.text()
    assert window.composer.button.text() == "Send"


def test_damaged_rows_are_shown_as_damaged_and_the_rest_reads(qtbot: QtBot, harness: Harness) -> None:
    store = Store(harness.db_path)
    conversation_id = store.create_conversation("Damaged")
    store.add_message(conversation_id, "user", "Fine question")
    bad = store.add_message(conversation_id, "assistant", "Readable text", metrics={"ttft_s": 0.5})
    store.add_message(conversation_id, "user", "Next question")
    store.add_message(conversation_id, "assistant", "Half", status="cancelled", metrics={"completion_tokens": 2})
    store.close()
    with sqlite3.connect(harness.db_path) as db:
        db.execute("UPDATE messages SET metrics = 'not json {' WHERE id = ?", [bad])
    window = harness.open(load=False)
    [user, damaged, second, stopped] = window.chat_view.bubbles()
    assert damaged.plain_text == "Readable text"
    assert damaged.notice.isVisible() and damaged.notice.text() == DAMAGED_NOTICE
    assert not user.notice.isVisible() and not second.notice.isVisible()
    assert stopped.stats.text() == "2 tokens \u00b7 stopped"
