"""GUI: remote engines (issue 18) against the replay server on 127.0.0.1: choosing a server in Settings,
replies streamed from it, its faults in the chat with the partial reply kept, Stop closing the stream,
switching back to the local model; the API key never in settings.json."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backends import fail
from pytestqt.qtbot import QtBot

from app.dialogs.engines import KEY_KEPT, KEY_SESSION, LOCAL_TEXT
from app.dialogs.settings import SettingsDialog
from app.window import MainWindow
from engine.api import Done, Error, Loaded, LoadFailed
from engine.remote import RemoteBackend, keys
from tests.support.fake_engine import FakeEngine
from tests.support.gui_harness import Harness, last_bubble, stored, type_and_send
from tests.support.keyring_support import DictKeyring
from tests.support.streams.replay import Handler, ReplayServer, events

KEY = "sk-brisk-gui-0123456789abcdef"
MODEL = "SmolLM2-135M-Instruct-Q8_0.gguf"
ANSWER = "The capital of France is Paris."
WAIT_MS = 20_000


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    keys.delete_key(s.url)  # this session's memory, where the key went without a system keyring
    s.close()


@pytest.fixture
def no_keyring() -> Iterator[None]:
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


def choose_server(qtbot: QtBot, window: MainWindow, url: str, key: str = KEY, name: str = "gpu box") -> SettingsDialog:
    """Add a server in the Settings dialog as a user does (URL, key, Refresh, pick the model) and save."""
    dialog = SettingsDialog(window.settings, window)
    qtbot.addWidget(dialog)
    engines = dialog.engines
    engines.add_server()
    assert engines.server_box.isVisibleTo(dialog)
    engines.name_edit.clear()
    qtbot.keyClicks(engines.name_edit, name)
    engines.url_edit.clear()
    qtbot.keyClicks(engines.url_edit, url)
    qtbot.keyClicks(engines.key_edit, key)
    engines.refresh_models()
    qtbot.waitUntil(lambda: engines.models_ready, timeout=WAIT_MS)
    return dialog


def save(qtbot: QtBot, window: MainWindow, dialog: SettingsDialog, expect: type = Loaded) -> object:
    with qtbot.waitSignal(
        window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded | LoadFailed), timeout=WAIT_MS
    ) as blocker:
        dialog.accept()
        assert dialog.result() == SettingsDialog.DialogCode.Accepted
        window.apply_settings(dialog.result_settings())
    assert isinstance(blocker.args[0], expect), blocker.args[0]
    return blocker.args[0]


def authorization(server: ReplayServer) -> set[str]:
    return {v for h in server.headers_seen for k, v in h.items() if k.lower() == "authorization"}


def held_stream(chunks: int) -> object:
    """A chat handler that sends ``chunks`` events of the recorded stream, then waits for release or a close."""

    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:chunks]:
            h.send(chunk)
        h.hold()
        if h.server.owner.release.is_set() and not h.server.owner.disconnected.is_set():
            for chunk in events("llamacpp.sse")[chunks:]:
                h.send(chunk)
            h.end_stream()

    return chat


def test_a_server_chosen_in_settings_streams_the_reply(
    qtbot: QtBot, harness: Harness, server: ReplayServer, brisk_data_dir: Path, no_keyring: None
) -> None:
    window = harness.open()
    local = window.bridge.backend
    assert isinstance(local, FakeEngine)
    dialog = choose_server(qtbot, window, server.url)
    engines = dialog.engines
    assert engines.model_combo.currentText() == MODEL  # picked from the server's /v1/models
    assert "1 model" in engines.models_label.text()
    qtbot.waitUntil(lambda: engines.persistent is not None)
    assert engines.key_note.text() == KEY_SESSION  # no system keyring: said, not hidden
    loaded = save(qtbot, window, dialog)
    assert isinstance(loaded, Loaded) and loaded.device == "remote" and loaded.model_name == MODEL
    assert loaded.info.endpoint == server.url
    assert isinstance(window.bridge.backend, RemoteBackend)
    assert not [t for t in threading.enumerate() if t.name == "fake-engine"]  # the local engine was shut down

    # the status bar and the latency panel say which model, where
    host = server.url.split("//")[1].split("/")[0]
    assert window.status_area.model_label.text() == MODEL
    assert window.status_area.device_label.text() == f"remote \u00b7 {host}"
    assert server.url in window.status_area.device_label.toolTip()
    numbers = window.latency.panel.numbers
    assert numbers.remote and numbers.text("model") == MODEL and host in numbers.text("mode")
    switches = window.latency.panel.switches  # what only the local model honours is greyed, and says why
    assert not switches.speculative.isEnabled() and not switches.quant.isEnabled()
    assert not switches.checks["prefix_cache"].isEnabled() and host in switches.quant.toolTip()
    assert switches.checks["stream"].isEnabled()

    # a reply streams in, token by token, and finishes
    server.chat = held_stream(4)
    type_and_send(qtbot, window, "What is the capital of France?")
    qtbot.waitUntil(lambda: last_bubble(window).plain_text == "The capital of", timeout=WAIT_MS)
    assert window.session.active is not None  # still streaming
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=WAIT_MS):
        server.release.set()
    qtbot.waitUntil(lambda: window.session.active is None)
    assert last_bubble(window).plain_text == ANSWER and not last_bubble(window).error.text()
    conversation = window.session.conversation_id
    assert conversation is not None
    reply = stored(window, conversation)[-1]
    assert (reply.content, reply.status) == (ANSWER, "done")
    assert server.requests[-1]["model"] == MODEL
    assert server.requests[-1]["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert f"Bearer {KEY}" in authorization(server)

    # the server is saved, its key is not
    text = (brisk_data_dir / "settings.json").read_text()
    saved = json.loads(text)
    assert saved["engine"] == "gpu box"
    assert saved["servers"] == [{"name": "gpu box", "base_url": server.url, "model": MODEL}]
    assert KEY not in text and KEY[:12] not in text
    assert keys.load_key(server.url) == KEY  # kept for this session


def test_a_refused_key_is_a_clear_error(qtbot: QtBot, harness: Harness, server: ReplayServer) -> None:
    window = harness.open()
    server.models = (401, {"error": {"message": f"Invalid API key {KEY}"}})
    dialog = choose_server(qtbot, window, server.url)
    assert "401 Unauthorized" in dialog.engines.models_label.text()  # Refresh says it at once
    assert KEY not in dialog.engines.models_label.text()
    failed = save(qtbot, window, dialog, expect=LoadFailed)
    assert isinstance(failed, LoadFailed) and "401 Unauthorized" in failed.message
    banner = window.banner("load")
    assert banner is not None and "API key" in banner.text() and KEY not in banner.text()
    assert not window.model_ready and not window.composer.button.isEnabled()

    # the key is good for listing but the chat endpoint refuses it: an error in the chat
    server.models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded), timeout=WAIT_MS):
        window.load_model()
    server.chat = lambda h, body: h.json(401, {"error": {"message": "Invalid API key"}})
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Error), timeout=WAIT_MS):
        type_and_send(qtbot, window, "Hello?")
    qtbot.waitUntil(lambda: window.session.active is None)
    error = last_bubble(window).error.text()
    assert "401 Unauthorized" in error and "Check the API key in Settings" in error
    assert window.composer.button.isEnabled()  # the window stays usable


def test_a_stream_cut_midway_keeps_the_partial_reply(qtbot: QtBot, harness: Harness, server: ReplayServer) -> None:
    window = harness.open()
    save(qtbot, window, choose_server(qtbot, window, server.url))

    def chat(h: Handler, body: object) -> None:
        h.start_stream()
        for chunk in events("llamacpp.sse")[:4]:
            h.send(chunk)
        h.cut()

    server.chat = chat
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Error), timeout=WAIT_MS):
        type_and_send(qtbot, window, "What is the capital of France?")
    qtbot.waitUntil(lambda: window.session.active is None)
    bubble = last_bubble(window)
    assert bubble.plain_text == "The capital of"
    assert "closed the connection in the middle of the reply" in bubble.error.text()
    conversation = window.session.conversation_id
    assert conversation is not None
    reply = stored(window, conversation)[-1]
    assert (reply.content, reply.status) == ("The capital of", "error")


def test_stop_closes_the_stream_and_keeps_the_text(qtbot: QtBot, harness: Harness, server: ReplayServer) -> None:
    window = harness.open()
    save(qtbot, window, choose_server(qtbot, window, server.url))
    server.chat = held_stream(4)
    type_and_send(qtbot, window, "What is the capital of France?")
    qtbot.waitUntil(lambda: last_bubble(window).plain_text == "The capital of", timeout=WAIT_MS)
    window.stop()
    assert server.disconnected.wait(10), "the server never saw the connection close"
    assert window.session.active is None and last_bubble(window).plain_text == "The capital of"
    conversation = window.session.conversation_id
    assert conversation is not None
    assert stored(window, conversation)[-1].status == "cancelled"

    server.chat = lambda h, body: h.replay(events("llamacpp.sse"))  # the next reply goes through
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Done), timeout=WAIT_MS):
        type_and_send(qtbot, window, "Again?")
    qtbot.waitUntil(lambda: window.session.active is None)
    assert last_bubble(window).plain_text == ANSWER


def test_servers_are_switched_and_the_local_model_comes_back(
    qtbot: QtBot, harness: Harness, server: ReplayServer
) -> None:
    other = ReplayServer()
    other.models = {"object": "list", "data": [{"id": "smollm2:135m", "object": "model"}]}
    try:
        window = harness.open()
        save(qtbot, window, choose_server(qtbot, window, server.url, name="first"))
        first = window.bridge.backend
        assert isinstance(first, RemoteBackend)
        loaded = save(qtbot, window, choose_server(qtbot, window, other.url, key="", name="second"))
        assert isinstance(loaded, Loaded) and loaded.model_name == "smollm2:135m"
        assert window.bridge.backend is not first and window.settings.engine == "second"
        assert [s["name"] for s in window.settings.servers] == ["first", "second"]
        assert f"Bearer {KEY}" not in authorization(other)  # a key is sent only to its own server

        dialog = SettingsDialog(window.settings, window)
        qtbot.addWidget(dialog)
        engines = dialog.engines
        assert engines.engine_combo.currentText() == "Server: second"
        engines.engine_combo.setCurrentIndex(engines.engine_combo.findData(0))  # back to the first server
        assert engines.url_edit.text() == server.url and engines.model_combo.currentText() == MODEL
        engines.engine_combo.setCurrentIndex(0)
        assert engines.engine_combo.currentText() == LOCAL_TEXT and not engines.server_box.isVisibleTo(dialog)
        loaded = save(qtbot, window, dialog)
        assert isinstance(loaded, Loaded) and loaded.device != "remote"
        assert isinstance(window.bridge.backend, FakeEngine) and window.settings.engine == "local"
        assert window.status_area.device_label.text().startswith(loaded.device)
        assert not window.latency.panel.numbers.remote
        assert window.latency.panel.switches.speculative.isEnabled() and window.latency.panel.switches.quant.isEnabled()
    finally:
        other.close()


def test_bad_servers_are_refused_before_saving(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    dialog = SettingsDialog(window.settings, window)
    qtbot.addWidget(dialog)
    engines = dialog.engines
    engines.add_server()
    engines.url_edit.clear()
    qtbot.keyClicks(engines.url_edit, "ftp://gpu-box/v1")
    engines.add_server()
    engines.name_edit.clear()
    qtbot.keyClicks(engines.name_edit, "Server 1")  # the first one's name again
    dialog.accept()
    assert dialog.result() != SettingsDialog.DialogCode.Accepted  # kept open, saying why
    assert engines.problem_label.isVisibleTo(dialog)
    assert "http:// or https://" in engines.problem_label.text()

    engines.remove_server()
    assert engines.engine_combo.currentText() == LOCAL_TEXT
    engines.engine_combo.setCurrentIndex(1)
    engines.url_edit.clear()
    qtbot.keyClicks(engines.url_edit, "http://gpu-box:8000/v1")
    dialog.accept()
    assert dialog.result() == SettingsDialog.DialogCode.Accepted
    assert dialog.result_settings().servers == [{"name": "Server 1", "base_url": "http://gpu-box:8000/v1", "model": ""}]


def test_keys_go_to_the_system_keyring_where_there_is_one(qtbot: QtBot, harness: Harness) -> None:
    before = keyring.get_keyring()
    ring = DictKeyring()
    keyring.set_keyring(ring)
    try:
        window = harness.open()
        dialog = SettingsDialog(window.settings, window)
        qtbot.addWidget(dialog)
        engines = dialog.engines
        engines.add_server()
        qtbot.keyClicks(engines.key_edit, KEY)
        qtbot.waitUntil(lambda: engines.persistent is not None, timeout=WAIT_MS)
        assert engines.key_note.text() == KEY_KEPT
        dialog.accept()
        assert ring.store == {("brisk", "http://127.0.0.1:8080/v1"): KEY}

        dialog = SettingsDialog(dialog.result_settings(), window)  # "Forget key" deletes it on save
        qtbot.addWidget(dialog)
        dialog.engines.engine_combo.setCurrentIndex(1)
        dialog.engines.forget_key()
        dialog.accept()
        assert ring.store == {}
    finally:
        keyring.set_keyring(before)


def test_a_server_that_cannot_be_reached_is_a_load_error_and_the_window_stays_usable(
    qtbot: QtBot, harness: Harness, server: ReplayServer
) -> None:
    url = server.url
    server.close()  # nothing listens there any more
    window = harness.open()
    servers = [{"name": "gone", "base_url": url, "model": ""}]
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, LoadFailed), timeout=WAIT_MS):
        window.apply_settings(dataclasses.replace(window.settings, engine="gone", servers=servers))
    banner = window.banner("load")
    assert banner is not None and "Connection refused" in banner.text() and "Is the server running" in banner.text()
    assert "Traceback" not in banner.text() and "RemoteError" not in banner.text()
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: isinstance(e, Loaded), timeout=WAIT_MS):
        window.apply_settings(dataclasses.replace(window.settings, engine="local"))
    assert window.model_ready and isinstance(window.bridge.backend, FakeEngine)
