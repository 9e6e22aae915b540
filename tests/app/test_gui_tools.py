"""Tools in the window: the Tools dialog, requests that carry the enabled tools, calls in the chat and on the panel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.dialogs.tools import NO_TOOL_FORMAT, ToolsDialog
from app.state.tools import BUILTIN, ServerProbe, calls_from_metrics, probe_server, tool_settings
from engine.api import ToolCall
from engine.storage import Settings
from tests.support.gui_harness import Harness, chat, fake, last_bubble, stored
from tests.support.mcp_servers import DEMO

CALLS = [
    ("calculator", {"expression": "2*(3+4)"}, 0.05, True, "14"),
    ("clock", {"zone": "Asia/Tokyo"}, 0.08, True, "2025-01-01 09:00 JST"),
    ("units", {"value": "1 mile"}, 0.03, False, "unknown unit 'mile'"),
]


def test_builtin_names_match_the_engine() -> None:
    from engine.tools import BUILTIN_NAMES, DEFAULT_ENABLED

    assert tuple(BUILTIN) == BUILTIN_NAMES
    assert "fetch" not in DEFAULT_ENABLED


def test_enabling_a_tool_in_the_dialog_makes_the_next_request_carry_it(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    chat(qtbot, window, "Before")
    assert fake(window).requests[-1].tools == ()
    assert window.tools_button.text() == "Tools: off"
    dialog = window.open_tools()
    assert not dialog.checks["fetch"].isChecked(), "fetch is off by default"
    assert dialog.set_tool_enabled("calculator", True)
    dialog.accept()
    assert window.settings.tools_enabled == ["calculator"]
    assert window.tools_button.text() == "Tools: 1 on"
    chat(qtbot, window, "/calculator 2*(3+4)")
    request = fake(window).requests[-1]
    assert request.tools == ("calculator",)
    assert request.parallel_tools is True
    window.latency.panel.switches.checks["parallel_tools"].setChecked(False)
    chat(qtbot, window, "Again")
    assert fake(window).requests[-1].parallel_tools is False


def test_tool_settings_persist_across_a_reopen(qtbot: QtBot, harness: Harness, tmp_path: Path) -> None:
    window = harness.open()
    dialog = window.open_tools()
    dialog.set_tool_enabled("clock", True)
    dialog.set_tool_enabled("fetch", True)
    dialog.private.setChecked(True)
    dialog.grant(str(tmp_path))
    dialog.grant(str(tmp_path))  # once only
    dialog.accept()
    window.latency.panel.switches.checks["parallel_tools"].setChecked(False)
    harness.close(window)
    saved = Settings.load()
    assert saved.tools_enabled == ["clock", "fetch"]
    assert saved.granted_dirs == [str(tmp_path)] and saved.fetch_allow_private
    assert saved.parallel_tools is False
    assert tool_settings(saved).granted_dirs == (str(tmp_path),)
    again = harness.open(settings=saved)
    reopened = again.open_tools()
    assert reopened.checks["clock"].isChecked() and reopened.checks["fetch"].isChecked()
    assert not reopened.checks["calculator"].isChecked()
    assert reopened.granted() == [str(tmp_path)]
    reopened.revoke(str(tmp_path))
    assert reopened.result_settings().granted_dirs == []
    reopened.reject()
    assert again.latency.panel.switches.checks["parallel_tools"].isChecked() is False
    chat(qtbot, again, "Hi")
    assert fake(again).requests[-1].parallel_tools is False


def test_a_changed_folder_says_when_it_applies(qtbot: QtBot, harness: Harness, tmp_path: Path) -> None:
    window = harness.open()
    dialog = window.open_tools()
    dialog.grant(str(tmp_path))
    dialog.accept()
    banner = window.banner("tools-restart")
    assert banner is not None and "next starts" in banner.text()


def test_calls_appear_in_the_chat_collapsible_and_on_the_timeline(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open(settings=Settings(tools_enabled=["calculator", "clock", "units"]))
    engine = fake(window)
    engine.tool_calls = list(CALLS)
    conversation = chat(qtbot, window, "/calculator 2*(3+4)")
    bubble = last_bubble(window)
    shown = bubble.tools.text()
    assert shown.startswith("\u25b8 3 tool calls")
    assert "one after another" in shown and "1 failed" in shown
    assert '\u2713 calculator {"expression": "2*(3+4)"}' in shown
    assert "\u2717 units" in shown
    # folded: a short result stays on its call's line (the walk: /calculator's 7006652 was hidden while the
    # reply said 7006.65); an error and anything longer wait for the section to open
    line = next(line for line in shown.splitlines() if line.startswith('\u2713 calculator {"expression": "2*(3+4)"}'))
    assert line.endswith(" ms \u2192 14")
    assert "error" not in shown
    box = window.chat_view.row_layout(bubble.message_id)
    assert box is not None and box.tools_header is not None
    window.chat_view.scrollTo(window.chat_view.index_of(bubble.message_id))
    box = window.chat_view.row_layout(bubble.message_id)
    from PySide6.QtCore import Qt

    qtbot.mouseClick(window.chat_view.viewport(), Qt.MouseButton.LeftButton, pos=box.tools_header.center())
    opened = bubble.tools.text()
    assert opened.startswith("\u25be") and "\u2192 14" in opened and "\u2192 error: unknown unit 'mile'" in opened
    assert window.chat_view.toggle_tools(bubble.message_id) is False

    panel = window.latency.panel
    panel.flush()
    assert [c.name for c in panel.trace.tools] == ["units", "calculator", "clock"]
    tool_bars = [s.name for s in panel.waterfall.spans if s.name.startswith("tool:")]
    assert sorted(tool_bars) == ["tool:calculator", "tool:clock", "tool:units"]
    wall, saved = panel.numbers.text("tools").split(" \u00b7 ")
    assert float(wall.split()[0]) < 0.16 and float(saved.split()[0]) > 0.0  # 0.16 s if they ran one by one

    reply = stored(window, conversation)[-1]
    calls = calls_from_metrics(reply.metrics)
    assert [c["name"] for c in calls] == ["units", "calculator", "clock"] and calls[0]["ok"] is False
    harness.close(window)
    again = harness.open()
    again.open_conversation(conversation)
    assert last_bubble(again).tools.text().startswith("\u25b8 3 tool calls"), "reopening shows the calls"


def test_the_tools_section_survives_damaged_records() -> None:
    good = {"name": "clock", "arguments": {}, "start": 0.1, "end": 0.2, "ok": True, "result": "now"}
    raw = {"tool_calls": [good, {"name": 3}, "x", {"name": "a", "start": "0", "end": 1}]}
    assert calls_from_metrics(raw) == [good]
    assert calls_from_metrics({"tool_calls": "nope"}) == [] and calls_from_metrics(None) == []


def test_mcp_servers_are_listed_with_their_state(qtbot: QtBot, harness: Harness) -> None:
    answers = {
        "good-server": ServerProbe("good-server", "running", "", (("add", "Add two numbers"), ("echo", "Echo"))),
        "bad-server": ServerProbe("bad-server", "failed", "exited at start: cannot open its database"),
    }
    settings = Settings(mcp_servers=["bad-server"], tools_enabled=["calculator", "kept_from_before"])
    dialog = ToolsDialog(settings, probe=lambda target: answers[target])
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.server_state("bad-server").startswith("failed"))
    assert "cannot open its database" in dialog.server_state("bad-server")
    with qtbot.waitSignal(dialog.probed, timeout=5000):
        assert dialog.add_server("good-server")
    assert not dialog.add_server("good-server"), "listed once"
    assert dialog.server_state("good-server") == "running \u00b7 2 tools"
    dialog.set_tool_enabled("echo", False)
    result = dialog.result_settings()
    assert result.mcp_servers == ["bad-server", "good-server"]
    assert result.tools_enabled == ["calculator", "add"], "a new server's tools start on; stale names go"
    dialog.remove_server("good-server")
    assert dialog.result_settings().tools_enabled == ["calculator"]
    assert dialog.result_settings().mcp_servers == ["bad-server"]


@pytest.mark.skipif(not DEMO.exists(), reason="the demo MCP server is missing")
def test_a_real_stdio_server_is_probed_and_a_crashing_one_reported() -> None:
    good = probe_server(f"{sys.executable} {DEMO}")
    assert good.status == "running", good.message
    assert {"add", "slow_echo"} <= {name for name, _ in good.tools}
    bad = probe_server(f"{sys.executable} {DEMO} --crash-at-start", timeout_s=10)
    assert bad.status == "failed" and bad.message
    assert probe_server("").status == "failed"


def test_a_tools_warning_from_the_engine_is_a_banner(qtbot: QtBot, harness: Harness) -> None:
    from engine.api import Warning

    window = harness.open()
    window.bridge.event.emit(Warning("tools", "The MCP server 'x' is not available: it exited."))
    banner = window.banner("tools")
    assert banner is not None and "not available" in banner.text()


def test_a_tool_call_event_is_folded_into_the_reply() -> None:
    from app.state.reply import ReplyState

    reply = ReplyState("r", 1, "c")
    assert reply.apply(ToolCall("r", 0.3, "clock", {"zone": "UTC"}, 0.1, 0.3, True, "12:00"))
    assert reply.stored_metrics()["tool_calls"][0]["result"] == "12:00"


def test_enter_in_the_server_field_adds_it_and_a_broken_new_server_is_not_saved(qtbot: QtBot) -> None:
    answers = {
        "good-server": ServerProbe("good-server", "running", "", (("add", "Add two numbers"),)),
        "broken-server": ServerProbe("broken-server", "failed", "exited at start: no such command"),
    }
    dialog = ToolsDialog(Settings(), probe=lambda target: answers[target])
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.server_edit.setFocus()
    qtbot.keyClicks(dialog.server_edit, "broken-server")
    with qtbot.waitSignal(dialog.probed, timeout=5000):
        qtbot.keyClick(dialog.server_edit, Qt.Key.Key_Return)
    assert dialog.isVisible() and dialog.result() == 0, "Enter added the server; it did not save and close"
    assert dialog.server_targets() == ["broken-server"] and dialog.server_edit.text() == ""
    dialog.accept()
    assert dialog.isVisible() and dialog.problem.isVisible()
    assert "broken-server did not start (exited at start: no such command)" in dialog.problem.text()
    dialog.remove_server("broken-server")
    with qtbot.waitSignal(dialog.probed, timeout=5000):
        dialog.add_server("good-server")
    dialog.accept()
    assert not dialog.isVisible() and dialog.result() == 1, "a new server that runs is saved"


def reload(qtbot: QtBot, window, **info: object) -> None:  # noqa: ANN001
    fake(window).load_info |= info
    with qtbot.waitSignal(window.bridge.event, check_params_cb=lambda e: type(e).__name__ == "Loaded"):
        window.load_model()


def test_a_model_without_a_tool_format_is_said_where_tools_are_enabled(qtbot: QtBot, harness: Harness) -> None:
    window = harness.open()
    reload(qtbot, window, tool_template=False)
    dialog = window.open_tools()
    assert dialog.tool_format.isVisible() and dialog.tool_format.text() == NO_TOOL_FORMAT
    assert dialog.tool_prompt.isVisible() and dialog.tool_prompt.isChecked(), "Brisk's tool prompt: on by default"
    label = dialog.tool_format
    qtbot.waitExposed(dialog)
    # the walk, on an 800-pixel screen: the dialog was shorter than its groups and this line was cut in half
    assert label.height() >= label.heightForWidth(label.width()), "the line is shown whole, every wrapped line"
    dialog.tool_prompt.setChecked(False)
    assert "not told about the tools" in dialog.tool_format.text()
    dialog.set_tool_enabled("calculator", True)
    dialog.accept()
    assert window.settings.tool_prompt is False
    chat(qtbot, window, "What is 17*23?")
    assert fake(window).requests[-1].tool_prompt is False
    reload(qtbot, window, tool_template=True)
    dialog = window.open_tools()
    assert not dialog.tool_format.isVisible() and not dialog.tool_prompt.isVisible(), "a model with a tool format"
