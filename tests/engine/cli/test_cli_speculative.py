"""The CLI's speculative source: the settings' value unless ``--speculative`` says otherwise.

In-process (``run_conversation`` with a recording session in place of the
engine), so each test reads the :class:`~engine.api.Request` the command would
send.  With ``--base-url``, ``--speculative`` counts as given only when it is
on the command line (its default is ``None``), so the local-only check still
refuses it there and is silent when it is left out.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from engine.api import Done, Event, Request
from engine.cli import build_parser
from engine.cli import chat as chat_cli
from engine.cli.backend import backend_problems
from engine.storage import Settings


class Recorder:
    """Stands in for a loaded client: keeps each request and answers it at once."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.warnings: list[object] = []

    def stream(self, request: Request) -> Iterator[Event]:
        self.requests.append(request)
        yield Done(request_id=request.id, t=0.0, text="ok")

    def close(self) -> None:
        pass


def sent(monkeypatch: pytest.MonkeyPatch, argv: list[str], settings: Settings | None = None) -> Request:
    """The one request ``brisk ARGV`` sends, with ``settings`` as the CLI's settings."""
    recorder = Recorder()
    monkeypatch.setattr(chat_cli, "load_client", lambda args, settings, spec: recorder)
    if settings is not None:
        monkeypatch.setattr(chat_cli, "load_settings", lambda as_json: settings)
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    (request,) = recorder.requests
    return request


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_default_is_the_settings_source(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().speculative == "auto", "the window's default, which the CLI now shares"
    assert sent(monkeypatch, ["ask", "hi", "--json"]).speculative == "auto"
    chosen = Settings(speculative="lookup")  # a user who chose another source in Settings
    assert sent(monkeypatch, ["ask", "hi", "--json"], chosen).speculative == "lookup"


def test_speculative_off_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sent(monkeypatch, ["ask", "hi", "--json", "--speculative", "off"]).speculative == "off"
    assert sent(monkeypatch, ["ask", "hi", "--speculative", "off"], Settings(speculative="auto")).speculative == "off"
    assert sent(monkeypatch, ["ask", "hi", "--speculative", "answers"]).speculative == "answers"


def test_chat_sends_the_same_source_every_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    monkeypatch.setattr(chat_cli, "load_client", lambda args, settings, spec: recorder)
    status = chat_cli.run_conversation(parse(["chat", "--json"]), iter(["one\n", "two\n"]))
    assert status == 0
    assert [r.speculative for r in recorder.requests] == ["auto", "auto"]


def test_draft_from_the_settings_needs_a_draft_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_cli, "load_settings", lambda as_json: Settings(speculative="draft"))
    monkeypatch.setattr(chat_cli, "load_client", lambda *a: pytest.fail("the request must be refused before loading"))
    assert chat_cli.cmd_ask(parse(["ask", "hi", "--json"])) == chat_cli.EXIT_REQUEST


def test_base_url_refuses_only_a_given_speculative_flag() -> None:
    url = ["--base-url", "http://127.0.0.1:9/v1"]
    assert backend_problems(parse(["ask", "hi", *url])) == [], "left out: nothing to refuse"
    for source in ("off", "auto"):  # given, even as the default's value: the server decodes its own way
        (problem,) = backend_problems(parse(["ask", "hi", *url, "--speculative", source]))
        assert problem.startswith("--speculative applies to the local engine only"), problem
