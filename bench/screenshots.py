"""The README's screenshots of the real window on the bundled model: ``python bench/screenshots.py [OUT_DIR]``.

Opens the window offscreen at its default size (1100x740) on a private data
folder (holding links to this user's converted models and measured weight
mode, so it starts as a usual day's start does), with the default settings
(``quant=auto``), asks two questions, and saves, into ``OUT_DIR`` (default
``docs/``):

* ``screenshot.png``: the chat with the latency panel beside the second reply;
* ``screenshot-dark.png``: the same window in the dark theme with the
  parameters panel in front;
* ``screenshot-json-parameters.png`` and ``screenshot-json.png``: a new chat
  whose reply format is a JSON schema (city and country), with the parameters
  panel, then the latency panel (forced tokens) in front;
* ``screenshot-typing.png``: a long message pasted into the composer of a new
  chat, prefilled before Send ("N tokens ready" under it);
* ``screenshot-server.png``: the Server dialog (Tools > Server) switched on,
  after two requests of another program through the ``openai`` SDK;
* ``screenshot-documents.png``: a new chat with a small handbook (whole in the
  prompt) and a long changelog (searched) attached, after two questions: the
  chips, the sources under the replies and the panel's Documents line.

Needs a display or ``QT_QPA_PLATFORM=offscreen`` (set here when there is none).  Not a benchmark (those
are in ``engine/bench/``): a script of the repository that drives the window, kept here because neither
``engine/`` (no Qt) nor ``app/`` (its import contract) may hold it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

FIRST = "Give me three tips for a good night's sleep."
SECOND = "Now write them again as a numbered list, then add one more tip."
JSON_QUESTION = "Give me a city and its country"
TYPED = (
    "Here is the release checklist our team follows. Read it and tell me which step we usually forget.\n\n"
    + "\n".join(
        f"{n}. Step {n}: check the build, tag the commit, update the notes and tell support." for n in range(1, 25)
    )
)
DOC_QUESTIONS = ("When does the north workshop open on Saturdays?", "Which version added dark mode?")
FEATURES = ["a search bar", "PDF export", "keyboard shortcuts", "a backup reminder", "tags",
            "a calendar view", "spell checking", "a trash folder", "sync over LAN", "colour labels"]  # fmt: skip
CHANGELOG = "# Changelog\n\n" + "\n\n".join(
    f"## Version {2 + n // 10}.{n % 10}\n\n- Added {'dark mode' if n == 7 else FEATURES[n % len(FEATURES)]} "
    f"to the {'settings' if n == 7 else f'editor, step {n // len(FEATURES) + 1}'}.\n"
    f"- Fixed a crash when a backup of {n * 3} files was cancelled.\n- Faster start-up on large libraries."
    for n in range(300)
)
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


def _ask_twice(url: str) -> None:
    """Two requests of another program through the openai SDK: one streamed, one not."""
    import openai

    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    question = [{"role": "user", "content": "Give me three names for a sailing boat."}]
    api.chat.completions.create(model="", messages=question, max_tokens=60)
    for _ in api.chat.completions.create(model="", messages=question, max_tokens=60, stream=True):
        pass


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "docs"
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if "BRISK_DATA_DIR" not in os.environ:  # a private folder, with this user's converted models and measured mode
        from engine.paths import cache_dir

        mine, private = cache_dir(), Path(tempfile.mkdtemp(prefix="brisk-shots-"))
        if mine.is_dir():
            shutil.copytree(mine, private / "cache", copy_function=os.link, ignore=shutil.ignore_patterns("*.lock"))
        os.environ["BRISK_DATA_DIR"] = str(private)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.window.main_window import MainWindow
    from engine.api import Done, Loaded
    from engine.client import local_backend
    from engine.storage import Settings, Store, database_path

    app = QApplication.instance() or QApplication(sys.argv)
    settings = Settings(theme="light")
    window = MainWindow(Store(database_path()), EngineBridge(local_backend()), settings)
    window.resize(1100, 740)
    window.show()
    window.reset_layout()
    seen: list[object] = []
    window.bridge.event.connect(seen.append)

    def wait_for(kind: type, count: int = 1, limit_s: float = 600.0) -> None:
        began = time.monotonic()
        while sum(isinstance(e, kind) for e in seen) < count:
            app.processEvents()
            time.sleep(0.01)
            if time.monotonic() - began > limit_s:
                raise TimeoutError(f"no {kind.__name__} within {limit_s:.0f} s")

    window.load_model()
    wait_for(Loaded)
    for n, text in enumerate((FIRST, SECOND), start=1):
        window.send(text)
        wait_for(Done, n)
    window.parameters_action.trigger()  # the latency panel's tab in front, the parameters tab beside it
    window.panel_action.trigger()
    for _ in range(50):  # the panel's timer and the layout settle
        app.processEvents()
        time.sleep(0.01)
    window.latency.panel.flush()
    out.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out / "screenshot.png"))
    window.apply_settings(dataclasses.replace(window.settings, theme="dark"))
    window.parameters_action.trigger()
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    window.grab().save(str(out / "screenshot-dark.png"))

    window.apply_settings(dataclasses.replace(window.settings, theme="light"))  # a chat that replies in JSON
    window.new_chat()
    panel = window.parameters.panel
    panel.format_box.setCurrentIndex(panel.format_box.findData("json_schema"))
    panel.format_box.activated.emit(panel.format_box.currentIndex())
    panel.schema_edit.setPlainText(json.dumps(CITY_SCHEMA, indent=2))
    panel.schema_edit.left.emit()
    window.send(JSON_QUESTION)
    wait_for(Done, 3)
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    window.grab().save(str(out / "screenshot-json-parameters.png"))
    window.panel_action.trigger()
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    window.latency.panel.flush()
    window.grab().save(str(out / "screenshot-json.png"))

    window.new_chat()  # a long message pasted into the composer: prefilled while it waits to be sent
    window.composer.editor.insertPlainText(TYPED)
    began = time.monotonic()
    while "ready" not in window.composer.prefilled.text() or " of " in window.composer.prefilled.text():
        app.processEvents()
        time.sleep(0.01)
        if time.monotonic() - began > 120:
            break
    window.grab().save(str(out / "screenshot-typing.png"))

    dialog = window.server_switch.open()  # Tools > Server: two requests of other programs, served beside the chat
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dialog.port.setValue(probe.getsockname()[1])
    dialog.switch.setChecked(True)
    asked = threading.Thread(target=_ask_twice, args=(window.server_switch.url,), daemon=True)
    asked.start()
    while asked.is_alive():
        app.processEvents()
        time.sleep(0.01)
    dialog.refresh()
    dialog.resize(820, 440)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)
    dialog.grab().save(str(out / "screenshot-server.png"))
    dialog.switch.setChecked(False)  # the server off again: the next shot is about documents
    dialog.close()

    window.new_chat()  # a chat with documents: a small one whole in the prompt, a long one searched
    folder = Path(tempfile.mkdtemp(prefix="brisk-shot-docs-"))
    from engine.bench.document_chat import handbook

    (folder / "site-handbook.md").write_text(handbook(0, 3_000), encoding="utf-8")
    (folder / "changelog.md").write_text(CHANGELOG, encoding="utf-8")
    window.documents.attach([str(folder / "site-handbook.md"), str(folder / "changelog.md")])
    began = time.monotonic()
    while window.documents.indexing and time.monotonic() - began < 300:
        app.processEvents()
        time.sleep(0.01)
    for n, text in enumerate(DOC_QUESTIONS, start=4):
        window.send(text)
        wait_for(Done, n)
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    window.latency.panel.flush()
    window.grab().save(str(out / "screenshot-documents.png"))
    print(f"wrote screenshot.png, -dark, -json, -json-parameters, -typing, -server and -documents .png in {out}")
    window.close()
    window.bridge.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
