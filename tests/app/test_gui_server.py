"""The window's Server switch (Tools > Server…): the real server on a real port over the window's engine, asked
through the official openai SDK while the window chats; its replies join the latency panel's history under the
client's name, never the chat; a taken port says why; the choice is kept for the next start."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from engine.storage import Settings
from tests.support.gui_harness import FULL_REPLY, chat


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ask(url: str, content: str = "Hi from a script") -> openai.types.chat.ChatCompletion:
    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
    return api.chat.completions.create(model="", messages=[{"role": "user", "content": content}])


def test_switch_serves_the_windows_engine(harness, qtbot, brisk_data_dir: Path) -> None:  # noqa: ANN001
    window = harness.open()
    dialog = window.server_switch.open()
    port = free_port()
    dialog.port.setValue(port)
    dialog.switch.setChecked(True)
    url = f"http://127.0.0.1:{port}/v1"
    assert window.server_switch.url == url
    assert dialog.address.text() == f"Listening at <b>{url}</b>"
    assert window.status_area.server_label.text() == f"Serving at {url}"

    chat(qtbot, window, "A message of my own")  # the window chats while serving
    reply = ask(url)
    assert reply.choices[0].message.content == FULL_REPLY
    assert reply.model == window.bridge.server.service.model
    # the server's request is in the panel's history under the client's name, not in the chat
    qtbot.waitUntil(lambda: any(p.config.client for p in window.latency.panel.history.points))
    served = [p for p in window.latency.panel.history.points if p.config.client]
    assert served[0].config.short().startswith("server: OpenAI")
    assert "Hi from a script" not in [m.content for m in window._messages()]
    dialog.refresh()
    assert dialog.table.rowCount() >= 1
    assert dialog.table.item(0, 2).text() == "/v1/chat/completions"
    assert dialog.table.item(0, 3).text().startswith("done")

    assert Settings.load().serve and Settings.load().serve_port == port  # kept for the next start
    dialog.switch.setChecked(False)
    assert window.server_switch.url == "" and not window.status_area.server_label.isVisible()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    assert not Settings.load().serve


def test_a_taken_port_says_why(harness) -> None:  # noqa: ANN001
    window = harness.open()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        dialog = window.server_switch.open()
        dialog.port.setValue(port)
        dialog.switch.setChecked(True)
        assert not dialog.switch.isChecked()
        assert "in use" in dialog.status.text() and "another --port" in dialog.status.text()
        assert window.server_switch.url == ""


def test_the_server_starts_again_with_the_window(harness) -> None:  # noqa: ANN001
    port = free_port()
    window = harness.open(settings=Settings(serve=True, serve_port=port))
    assert window.server_switch.url == f"http://127.0.0.1:{port}/v1"
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["status"] == "ok"


def test_a_server_started_with_the_window_says_why(harness) -> None:  # noqa: ANN001
    """The walk: a server left on started again on the next launch, said only in a tooltip."""
    port = free_port()
    window = harness.open(settings=Settings(serve=True, serve_port=port))
    label = window.status_area.server_label
    url = f"http://127.0.0.1:{port}/v1"
    assert label.isVisible() and label.text() == f"Serving again at {url}"
    assert "on when Brisk last closed" in label.toolTip() and "Tools > Server" in label.toolTip()
    window.server_switch._left_on_said()  # what the timer does after a few seconds: the usual line stays
    assert label.text() == f"Serving at {url}" and "on when Brisk last closed" in label.toolTip()


def test_a_second_window_leaves_the_first_ones_server_alone(harness) -> None:  # noqa: ANN001
    """Launched again on the same settings while the first Brisk serves: no second server, no failure, said."""
    port = free_port()
    first = harness.open(settings=Settings(serve=True, serve_port=port))
    url = f"http://127.0.0.1:{port}/v1"
    assert first.server_switch.url == url
    second = harness.open(settings=Settings(serve=True, serve_port=port))
    assert second.server_switch.url == "" and second.banner("server") is None, "not a failure"
    assert second.status_area.server_label.text() == f"Another Brisk serves at {url}"
    assert "Another Brisk already serves" in second.server_switch.open().status.text()
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["status"] == "ok"
    assert first.bridge.server.running and second.settings.serve  # the choice is kept for the next start


def test_serving_again_on_the_same_port_keeps_the_server_running(harness) -> None:  # noqa: ANN001
    port = free_port()
    window = harness.open(settings=Settings(serve=True, serve_port=port))
    listening = window.bridge.server.thread
    window.server_switch.set(True, port)
    assert window.bridge.server.thread is listening, "not stopped and started again"
    assert window.server_switch.url == f"http://127.0.0.1:{port}/v1" and window.bridge.server.running


def test_no_model_loaded_is_a_503(harness) -> None:  # noqa: ANN001
    port = free_port()
    window = harness.open(settings=Settings(serve=True, serve_port=port), load=False)
    assert window.server_switch.url
    with pytest.raises(openai.APIStatusError) as raised:
        ask(window.server_switch.url)
    assert raised.value.status_code == 503


def test_a_switch_to_another_engine_keeps_serving_on_the_new_one(qtbot) -> None:  # noqa: ANN001
    from app.bridge import EngineBridge
    from engine.api import Loaded, ModelSpec, Sampling, ServedReply, Started
    from tests.support.fake_engine import FakeEngine

    def engine(words: list[str]) -> object:
        def make(on_event):  # noqa: ANN001, ANN202
            fake = FakeEngine(on_event)
            fake.tokens = words
            return fake

        return make

    bridge = EngineBridge(engine(["first", " engine"]))  # type: ignore[arg-type]
    seen: list[object] = []
    bridge.event.connect(seen.append)
    try:
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded), timeout=5_000):
            bridge.load(ModelSpec())
        url = bridge.serve(0, Sampling(), "off")
        server = bridge.server
        assert server is not None
        server.set_model("fake-model")
        first = bridge.backend
        assert isinstance(first, FakeEngine)
        assert ask(url).choices[0].message.content == "first engine"
        assert [r.origin for r in first.requests] == ["server"]  # straight to the backend's submit

        bridge.use_engine("other", engine(["second", " engine"]))  # type: ignore[arg-type]
        with qtbot.waitSignal(bridge.event, check_params_cb=lambda e: isinstance(e, Loaded), timeout=5_000):
            bridge.load(ModelSpec())
        second = bridge.backend
        assert isinstance(second, FakeEngine) and second is not first
        assert bridge.server is server and server.running  # the same server, still listening
        assert ask(url).choices[0].message.content == "second engine"
        assert len(first.requests) == 1 and [r.origin for r in second.requests] == ["server"]

        qtbot.waitUntil(lambda: sum(isinstance(e, ServedReply) for e in seen) == 2, timeout=5_000)
        served = [e for e in seen if isinstance(e, ServedReply)]
        assert [e.status for e in served] == ["done", "done"] and all(e.metrics is not None for e in served)
        assert not any(isinstance(e, Started) for e in seen)  # the server's replies never reach the window
    finally:
        bridge.shutdown()
    assert not server.running
