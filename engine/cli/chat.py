"""``brisk ask PROMPT`` (one reply) and ``brisk chat`` (one user message per line of standard input).

Both check every value before the model loads (a problem exits with
``EXIT_REQUEST`` and a message naming the flag), stream each reply's events
(``--json``: one object per line; tool calls as ``{"type": "tool", ...}``
events), and end with a non-zero exit when a request failed or a line of input
was not UTF-8; a bad line ends the conversation there, after the replies to
the lines before it.  Every flag left out takes its value from the user's
settings (``engine.cli.common.apply_settings``).  A failed reply's partial text (kept in the JSON error
event's ``partial_text``) stays in the conversation's history.  The backend
(the local engine or a server at ``--base-url``) is chosen in
``engine.cli.backend``.
"""

from __future__ import annotations

import argparse
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.api import Done, Error, Request, Warning
from engine.cli.backend import load_client, mcp_problems, tool_names
from engine.cli.common import (
    EXIT_MODEL,
    EXIT_REQUEST,
    InputError,
    apply_settings,
    fail,
    fail_problems,
    load_settings,
    model_spec,
    print_event,
    print_warnings,
    request_problems,
    sampling_from,
    speculative_source,
    stdin_lines,
    system_text,
)
from engine.client import LoadError


def run_conversation(args: argparse.Namespace, lines: Iterator[str]) -> int:
    settings = load_settings(args.json)
    apply_settings(args, settings, args.json)
    problems = request_problems(args, settings)
    if problems:
        return fail_problems(problems, args.json)
    try:
        system = system_text(args.system, getattr(args, "system_is_text", False))
    except InputError as exc:
        return fail(str(exc), args.json, EXIT_REQUEST)
    problems = mcp_problems(args)
    if problems:
        return fail_problems(problems, args.json)
    documents, problems = attach_documents(getattr(args, "attach", None) or (), args.json)
    if problems:
        return fail_problems(problems, args.json)
    try:
        session = load_client(args, settings, model_spec(args))
    except LoadError as exc:
        return fail(str(exc), args.json, EXIT_MODEL)
    print_warnings(session.warnings, args.json)
    try:
        messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        conversation = uuid.uuid4().hex
        sampling = sampling_from(args, settings)
        speculative = speculative_source(args, settings)
        status = 0
        try:
            for line in lines:
                text = line.rstrip("\r\n")
                if not text.strip():
                    continue
                messages.append({"role": "user", "content": text})
                request = Request(
                    id=uuid.uuid4().hex,
                    messages=tuple(messages),
                    sampling=sampling,
                    conversation_id=conversation,
                    prefix_cache=not args.no_prefix_cache,
                    speculative=speculative,
                    tools=tool_names(args),
                    parallel_tools=not args.sequential_tools,
                    answer_cache=not args.no_answer_cache,
                    fresh=args.fresh,
                    documents=documents,
                )
                reply = ""
                seen = len(session.warnings)
                for event in session.stream(request):
                    print_event(event, args.json)
                    if isinstance(event, Done):
                        reply = event.text
                    elif isinstance(event, Error):
                        reply = event.partial_text  # the history keeps what the user saw
                        status = EXIT_REQUEST
                print_warnings(session.warnings[seen:], args.json)
                messages.append({"role": "assistant", "content": reply})
        except InputError as exc:
            return fail(str(exc), args.json, EXIT_REQUEST)
        return status
    finally:
        session.close()


def attach_documents(paths: Sequence[str], as_json: bool) -> tuple[tuple[str, ...], list[str]]:
    """Index the files of ``--attach`` (folders walked) before the model loads: their document ids, and the
    problems that stop the command (nothing could be attached).  A file that cannot be read is a warning
    naming it; the others are still attached."""
    if not paths:
        return (), []
    from engine.client import document_library

    try:
        results = document_library().attach(paths)
    except Exception as exc:  # the index cannot be opened: say so before a model loads
        return (), [f"The documents could not be attached ({exc})"]
    ids = tuple(dict.fromkeys(r.doc_id for r in results if r.ok))
    warnings = [Warning("documents", r.problem) for r in results if not r.ok]
    warnings += [Warning("documents", _named(Path(r.path).name, note)) for r in results if r.ok for note in r.notes]
    print_warnings(warnings, as_json)
    if not ids:
        return (), ["None of the attached files could be read; see the messages above"]
    return ids, []


def _named(name: str, note: str) -> str:
    """A note about the file ``name``, naming it once (most notes name it already: "x.txt is not UTF-8; …")."""
    named = re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", note)  # the name itself, not inside another
    return note if named else f"{name}: {note}"


def cmd_ask(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        return fail("The message is empty. Type something to ask.", args.json, EXIT_REQUEST)
    return run_conversation(args, iter([args.prompt]))


def cmd_chat(args: argparse.Namespace) -> int:
    return run_conversation(args, stdin_lines())
