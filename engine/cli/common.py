"""What the headless commands share: flags, input checks, the model, printing.

Every value a command line gives is checked here before a model is loaded, and
a problem is a message that names the flag to change (``request_problems``).
Text from the user (an argument, a line of standard input, a ``--system
@FILE``) must be UTF-8: text that is not is refused with a message saying which
input it was and how to convert it, rather than decoded with replacement
characters, because a silently altered prompt gives a reply to something the
user never wrote (and the refusal costs one ``iconv``).
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
)
from engine.cli.backend import add_cache_args, add_server_args, add_tool_args, backend_problems
from engine.storage import Settings

EXIT_MODEL = 2
EXIT_REQUEST = 3
SYSTEM_FILE_LIMIT = 1 << 20  # bytes; a system prompt has to fit a context of a few thousand tokens
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
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
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
        source=getattr(args, "model", None) or "",
        device=getattr(args, "device", None) or "auto",
        dtype=getattr(args, "dtype", None) or "auto",
        draft=getattr(args, "draft_model", "") or "",
        draft_quant=getattr(args, "draft_quant", None) or "none",
        quant=getattr(args, "quant", None) or "auto",
    )


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
    return dataclasses.replace(base, **given, stop=tuple(getattr(args, "stop", None) or ()))


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
    problems = flag_problems(sampling_from(args, settings))
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


def system_text(value: str | None) -> str | None:
    """``--system TEXT`` as given, or ``@FILE``'s text (at most ``SYSTEM_FILE_LIMIT`` bytes of UTF-8)."""
    if not value or not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        with path.open("rb") as file:
            data = file.read(SYSTEM_FILE_LIMIT + 1)  # never more: @/dev/zero must not fill the memory
    except OSError as exc:
        raise InputError(f"Cannot read the system prompt file {path}: {exc.strerror or exc}.") from None
    if len(data) > SYSTEM_FILE_LIMIT:
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
    elif isinstance(event, ToolCall):
        args = json.dumps(dict(event.arguments), ensure_ascii=False)
        outcome = event.result if event.ok else f"failed: {event.result}"
        print(f"[tool {event.name} {args} -> {outcome} ({event.end - event.start:.3f} s)]", file=sys.stderr)
    elif isinstance(event, Done):
        sys.stdout.write("\n")
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
