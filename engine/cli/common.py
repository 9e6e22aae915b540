"""What the headless commands share: flags, input checks, the model, printing.

Every value a command line gives is checked here before a model is loaded, and
a problem is a message that names the flag to change (``request_problems``).
Text from the user (an argument, a line of standard input, a ``--system
@FILE``) must be UTF-8: text that is not is refused with a message saying which
input it was and how to convert it, rather than decoded with replacement
characters, because a silently altered prompt gives a reply to something the
user never wrote (and the refusal costs one ``iconv``).

The flags default to the user's ``settings.json`` (read by
``engine.storage.Settings``; :func:`load_settings`, :func:`apply_settings`):
every flag left out takes the setting's value (model, device, dtype, quant,
system prompt, sampling, prefix cache, speculative source, draft model, tools,
granted folders, MCP servers, answer cache), and a flag given wins.  Two
exceptions, as documented: the CLI is greedy and unseeded unless
``--temperature``/``--seed`` say otherwise, and without a settings file there is
no system prompt.  A bad or unreadable settings file is one warning and the
defaults, never a stopped command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from engine.api import (
    DEVICES,
    DTYPES,
    QUANT_CHOICES,
    QUANT_MODES,
    SOURCES,
    Done,
    Error,
    Event,
    Metrics,
    ModelSpec,
    Sampling,
    Token,
    ToolCall,
    Warning,
    prompt_counts,
    reply_format,
)
from engine.cli.backend import add_cache_args, add_server_args, add_tool_args, backend_problems, is_remote
from engine.client import format_problems
from engine.documents.render import sources_line
from engine.paths import settings_path
from engine.runtime.format_limits import MAX_BYTES as MAX_FORMAT_BYTES
from engine.safe_read import NotRegularFile, read_regular
from engine.storage import Settings
from engine.tools.run import clip, echo_arguments

EXIT_MODEL = 2
EXIT_REQUEST = 3
SYSTEM_FILE_LIMIT = 1 << 20  # bytes; a system prompt has to fit a context of a few thousand tokens
RESULT_ECHO_CHARS = 2_000  # of a tool's result in the printed [tool ...] line (--json carries it whole)
CONVERT_HINT = "Convert it to UTF-8 (for example with `iconv -f latin1 -t utf-8`) and try again."


class InputError(Exception):
    """Input the command cannot use; the message says what to change."""


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder, .gguf file or hub id (default: bundled)")
    parser.add_argument("--device", default=None, choices=DEVICES)
    parser.add_argument("--dtype", default=None, choices=DTYPES)
    parser.add_argument(
        "--quant",
        default=None,
        help=f"weight quantization: {', '.join(QUANT_CHOICES)} (default auto: the fastest mode that keeps "
        "99 %% of answers, measured at first load; see `brisk doctor`)",
    )


def add_request_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--system", default=None, help="system prompt TEXT, or @FILE to read it from a file")
    parser.add_argument(
        "--attach",
        action="append",
        default=None,
        metavar="PATH",
        help="attach a file or a folder to the conversation (repeatable): text, Markdown, code, HTML, PDF, DOCX; "
        "small ones go whole into the prompt (their KV kept for the next question, in any chat), larger ones "
        "are searched for each question",
    )
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", default=None, help="reply as JSON matching this schema: a FILE or the JSON")
    shape.add_argument("--json-object", action="store_true", help="reply as one JSON object (any keys)")
    shape.add_argument("--regex", default=None, help="reply with text matching this regular expression")
    shape.add_argument("--choice", default=None, help="reply with exactly one of these comma-separated texts")
    shape.add_argument("--grammar", default=None, help="reply in this Lark grammar: a FILE or the grammar's text")
    parser.add_argument("--no-prefix-cache", action="store_true", help="turn KV/prefix caching off")
    parser.add_argument(
        "--speculative",
        default=None,
        choices=SOURCES,
        help="speculative decoding source (default auto: each source drafts only while it "
        "pays and is paused when it does not; off turns it off; greedy output is the same either way)",
    )
    parser.add_argument("--draft-model", default="", help="draft model for --speculative draft/auto")
    parser.add_argument("--draft-quant", default=None, help="the draft model's quantization (as --quant)")
    add_server_args(parser)
    add_tool_args(parser)
    add_cache_args(parser)
    parser.add_argument("--json", action="store_true", help="one JSON event per line")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model the command line asks for (defaults for what it leaves out)."""
    return ModelSpec(
        source=library_source(getattr(args, "model", None) or ""),
        device=getattr(args, "device", None) or "auto",
        dtype=getattr(args, "dtype", None) or "auto",
        draft=getattr(args, "draft_model", "") or "",
        draft_quant=getattr(args, "draft_quant", None) or "none",
        quant=getattr(args, "quant", None) or "auto",
    )


def library_source(source: str) -> str:
    """``source`` as given, or the path of the library's model of that name (``brisk models`` lists them) when
    it is not a file or folder: a hub id that is in the Hugging Face cache loads from there, offline."""
    if not source or Path(source).expanduser().exists():
        return source
    from engine.library.scan import lookup, scan

    try:
        entry = lookup(source, scan(Settings.load().model_folders))
    except Exception:  # noqa: BLE001 - a library that cannot be scanned: the source is used as given
        return source
    return entry.path if entry is not None and entry.source != "bundled" else source


def load_settings(as_json: bool) -> Settings:
    """The user's settings; what was wrong in the file is printed as warnings (defaults used), never raised."""
    try:
        settings, problems = Settings.load_with_problems()
    except Exception as exc:  # a file the loader chokes on must not stop the command line
        problems = [f"{settings_path().name} could not be read ({type(exc).__name__}); using the default settings"]
        settings = Settings()
    print_warnings([Warning("settings", problem) for problem in problems], as_json)
    return settings


def apply_settings(args: argparse.Namespace, settings: Settings, as_json: bool) -> None:
    """Give every flag the command line left out the value ``settings`` has for it (flags given win).

    Settings of the local engine (model, quantization, caches, tools) apply only without
    ``--base-url``.  A granted folder from the settings that no longer exists is left out with a warning.
    """

    def default(name: str, value: object, unset: object = None) -> None:
        if hasattr(args, name) and getattr(args, name) in (unset, None) and value not in (None, "", []):
            setattr(args, name, value)

    if getattr(args, "system", None) is None and settings_path().is_file():
        args.system = settings.system_prompt or None
        args.system_is_text = True  # the window's prompt is text, even when it starts with "@"
    if is_remote(args):
        return
    for name in ("model", "device", "dtype", "quant", "draft_quant"):
        default(name, getattr(settings, name))
    default("draft_model", settings.draft_model, "")
    if getattr(args, "tools", None) is None and settings.tools_enabled:
        args.tools = ",".join(settings.tools_enabled)
        args.tools_from_settings = True  # names no server lists enable nothing, as in the window
    default("mcp", list(settings.mcp_servers))
    flags = {
        "no_prefix_cache": not settings.prefix_cache,
        "sequential_tools": not settings.parallel_tools,
        "allow_private_fetch": settings.fetch_allow_private,
        "no_answer_cache": not settings.answer_cache,
    }
    for name, on in flags.items():
        if hasattr(args, name) and on:
            setattr(args, name, True)
    if getattr(args, "grant", None) is None and settings.granted_dirs:
        folders = [d for d in settings.granted_dirs if Path(d).expanduser().is_dir()]
        gone = [d for d in settings.granted_dirs if d not in folders]
        if gone:
            print_warnings(
                [
                    Warning("settings", f"granted folder {d!r} in the settings does not exist; it is left out")
                    for d in gone
                ],
                as_json,
            )
        args.grant = folders or None


def speculative_source(args: argparse.Namespace, settings: Settings) -> str:
    """``--speculative`` when given, else the settings' source (``auto`` unless the user chose otherwise)."""
    return getattr(args, "speculative", None) or settings.speculative


def sampling_from(args: argparse.Namespace, settings: Settings) -> Sampling:
    """The settings' sampling with the flags given on top, unchecked (see ``request_problems``).

    The CLI is greedy and unseeded unless told, whatever the window's settings say.
    """
    flags = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_tokens")
    given = {name: value for name in flags if (value := getattr(args, name, None)) is not None}
    base = dataclasses.replace(settings.sampling(), temperature=0.0, seed=None)
    return dataclasses.replace(base, **given, stop=tuple(getattr(args, "stop", None) or ()), format=format_from(args))


def format_from(args: argparse.Namespace) -> str:
    """``Sampling.format`` from ``--json-schema``/``--json-object``/``--regex``/``--choice``/``--grammar``
    ("" for free text); raises :class:`InputError` for a schema file or text that is not JSON."""
    if getattr(args, "json_object", False):
        return reply_format("json_object")
    if getattr(args, "regex", None) is not None:
        return reply_format("regex", args.regex)
    if getattr(args, "choice", None) is not None:
        return reply_format("choice", [c.strip() for c in args.choice.split(",") if c.strip()])
    if getattr(args, "grammar", None) is not None:
        return reply_format("lark", _file_or_text(args.grammar, "--grammar"))
    if getattr(args, "json_schema", None) is None:
        return ""
    text = _file_or_text(args.json_schema, "--json-schema")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--json-schema: not a JSON schema ({exc}); give a file or the schema's JSON.") from None
    except RecursionError:
        raise InputError("--json-schema: the schema is nested too deeply to read; flatten it or use $defs.") from None
    if not isinstance(schema, dict):
        raise InputError('--json-schema: a schema is a JSON object, such as {"type": "object", ...}.')
    return reply_format("json_schema", schema)


def _file_or_text(value: str, flag: str) -> str:
    """The text of the file ``value`` names, or ``value`` itself (a schema must be JSON text or a file)."""
    stripped = value.strip()
    if stripped.startswith(("{", "[")) or "\n" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        try:
            data, more = read_regular(path, MAX_FORMAT_BYTES)  # no more than a format may be: never a whole big file
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{flag}: cannot read {path} ({exc}).") from None
        if more:
            raise InputError(f"{flag}: {path} is over {MAX_FORMAT_BYTES // 1024} KB, the most a reply format may be.")
        return text
    if flag == "--json-schema":
        raise InputError(f"{flag}: no such file: {path} (give a file or the schema's JSON).")
    return value


def flag_problems(sampling: Sampling) -> list[str]:
    """``Sampling.problems()`` with each field named as the flag that sets it."""
    names = sorted((f.name for f in fields(Sampling)), key=len, reverse=True)
    out = []
    for problem in sampling.problems():
        name = next((n for n in names if problem.startswith(n)), None)
        out.append(f"--{name.replace('_', '-')}{problem[len(name) :]}" if name else problem)
    return out


def request_problems(args: argparse.Namespace, settings: Settings) -> list[str]:
    """Everything wrong with the command line's values, each said as what to change (empty: all good)."""
    try:
        sampling = sampling_from(args, settings)
    except InputError as exc:
        return [str(exc), *backend_problems(args)]
    problems = flag_problems(sampling)
    if sampling.format:
        problems.extend(format_problems(sampling.format))
    for flag, choices in (("--quant", QUANT_CHOICES), ("--draft-quant", QUANT_MODES)):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and value not in choices:
            problems.append(f"{flag} {value!r} is not a quantization mode; choose one of {', '.join(choices)}")
    if speculative_source(args, settings) == "draft" and not getattr(args, "draft_model", ""):
        problems.append("--speculative draft needs a draft model: add --draft-model PATH")
    for name in ("prompt", "system"):
        value = getattr(args, name, None)
        if isinstance(value, str) and not (name == "system" and value.startswith("@")):
            problems.extend(p for p in [utf8_problem(f"The {name} argument", value)] if p)
    for i, stop in enumerate(getattr(args, "stop", None) or ()):
        problems.extend(p for p in [utf8_problem(f"--stop value {i + 1}", stop)] if p)
    if getattr(args, "attach", None) and getattr(args, "base_url", None):
        problems.append("--attach works with the local model only: leave out --base-url to ask about documents")
    return problems + backend_problems(args)


def utf8_problem(what: str, text: str) -> str | None:
    """Why ``text`` (an argument, decoded by Python with ``surrogateescape``) is not UTF-8, or None."""
    for i, ch in enumerate(text):
        if "\udc80" <= ch <= "\udcff":
            return f"{what} is not valid UTF-8 (byte 0x{ord(ch) - 0xDC00:02x} at character {i + 1}). {CONVERT_HINT}"
        if "\ud800" <= ch <= "\udfff":
            return f"{what} is not valid UTF-8 (a lone surrogate at character {i + 1}). {CONVERT_HINT}"
    return None


def decode_utf8(what: str, data: bytes) -> str:
    """``data`` as text, or InputError saying where it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte {exc.start + 1}). {CONVERT_HINT}"
        ) from None


def system_text(value: str | None, literal: bool = False) -> str | None:
    """``--system TEXT`` as given, or ``@FILE``'s text (at most ``SYSTEM_FILE_LIMIT`` bytes of UTF-8).

    ``literal``: the value is text as it stands (the settings' system prompt), never a file name.

    ``@FILE`` must be a regular file: a named pipe, a device or a socket is refused before it is
    opened (``engine.safe_read``), so ``@/dev/zero`` or a FIFO nobody writes to cannot hang the run.
    """
    if literal or not value or not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        data, more = read_regular(path, SYSTEM_FILE_LIMIT)
    except NotRegularFile as exc:
        raise InputError(
            f"The system prompt file {path} is {exc.kind}, not a regular file; Brisk reads --system @FILE only "
            "from a regular file. Save the prompt to a file and give that."
        ) from None
    except OSError as exc:
        raise InputError(f"Cannot read the system prompt file {path}: {exc.strerror or exc}.") from None
    if more:
        raise InputError(
            f"The system prompt file {path} is larger than {SYSTEM_FILE_LIMIT >> 20} MB; "
            "a system prompt has to fit the model's context. Use a shorter file."
        )
    return decode_utf8(f"The system prompt file {path}", data)


def stdin_lines() -> Iterator[str]:
    """Standard input's lines, each checked to be UTF-8 (InputError names the first bad line)."""
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        yield decode_utf8(f"Line {number} of standard input", raw)


def emit_json(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fail(message: str, as_json: bool, code: int) -> int:
    if as_json:
        emit_json({"type": "error", "t": 0.0, "message": message, "partial_text": ""})
    else:
        print(f"error: {message}", file=sys.stderr)
    return code


def fail_problems(problems: list[str], as_json: bool) -> int:
    text = "; ".join(p.rstrip(".") for p in problems)
    return fail(f"Cannot send this request: {text}.", as_json, EXIT_REQUEST)


def print_event(event: Event, as_json: bool) -> None:
    if as_json:
        data = event.to_json()
        if isinstance(event, Token):
            data["ids"] = list(event.ids)
        emit_json(data)
    elif isinstance(event, Token):
        sys.stdout.write(event.text)
        sys.stdout.flush()
    elif isinstance(event, ToolCall):  # a line for a person: long arguments and results are cut
        args = echo_arguments(dict(event.arguments))
        outcome = clip(event.result, RESULT_ECHO_CHARS) if event.ok else f"failed: {clip(event.result)}"
        line = f"[tool {clip(event.name, 80)} {args} -> {outcome} ({event.end - event.start:.3f} s)]"
        print(line, file=sys.stderr)
    elif isinstance(event, Done):
        sys.stdout.write("\n")
        if event.metrics.sources:
            print(sources_line(event.metrics.sources))
        print(" · ".join(summary(event.metrics)), file=sys.stderr)
    elif isinstance(event, Error):
        print(f"error: {event.message}", file=sys.stderr)


def summary(m: Metrics) -> list[str]:
    """The done line's parts: where the reply came from and how fast it was."""
    parts = []
    if m.answer_cache == "exact":
        parts.append("from the answer cache (same question)")
    elif m.answer_cache:
        similarity = f"{m.similarity:.2f}" if m.similarity is not None else "?"
        parts.append(f"from the answer cache (similar question, {similarity}: {m.cached_question!r})")
    if m.ttft_s is not None:
        parts.append(f"TTFT {m.ttft_s:.3f} s")
    if m.tokens_per_s:
        parts.append(f"{m.tokens_per_s:.1f} tok/s")
    parts.append(f"{m.completion_tokens} tokens")
    prompt, cached = prompt_counts(m.to_dict())
    whose = "" if m.server is None else " (server's count)"
    if prompt is not None and cached is not None:
        parts.append(f"reused {cached} of {prompt} prompt tokens{whose}")
    elif prompt is not None:
        parts.append(f"{prompt} prompt tokens{whose}")
    if m.document_tokens:
        parts.append(f"documents: {m.document_reused} of {m.document_tokens} tokens reused")
    if m.drafted:
        parts.append(f"accepted {m.accepted} of {m.drafted} drafted")
    if m.speedup:
        parts.append(f"{m.speedup:.2f}x plain decode")
    if m.tools_wall_s is not None:
        sequential = f", {m.tools_sequential_s:.3f} s one after another" if m.tools_sequential_s is not None else ""
        parts.append(f"tools {m.tools_wall_s:.3f} s{sequential}")
    if m.saved_s:
        parts.append(f"saved {m.saved_s:.3f} s")
    return parts


def print_warnings(warnings: list[Warning], as_json: bool) -> None:
    """Things the user should know that did not stop the run (an MCP server that failed to start)."""
    for warning in warnings:
        if as_json:
            emit_json({"type": "warning", "t": 0.0, "kind": warning.kind, "message": warning.message})
        else:
            print(f"warning: {warning.message}", file=sys.stderr)
