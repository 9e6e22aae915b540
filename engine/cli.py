"""Headless commands: ``brisk ask``, ``brisk chat``, ``brisk doctor``, ``brisk bench``.

The JSON contract (``--json``, one object per line) is stable: every event has
``type`` and ``t`` (seconds since the request, ``time.perf_counter()``); token
events are ``{"type": "token", "t", "text", "ids", "draft"}``; each reply ends
with ``{"type": "done", "t", "text", "finish_reason", "metrics"}``; failures are
``{"type": "error", "message"}`` and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.api import DEVICES, DTYPES, QUANT_MODES, SOURCES, Done, Error, Event, ModelSpec, Request, Sampling, Token
from engine.client import Client, LoadError, local_backend
from engine.storage import Settings

EXIT_MODEL = 2
EXIT_REQUEST = 3


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder, .gguf file or hub id (default: bundled)")
    parser.add_argument("--device", default=None, choices=DEVICES)
    parser.add_argument("--dtype", default=None, choices=DTYPES)
    parser.add_argument(
        "--quant",
        default=None,
        help=f"weight quantization: {', '.join(QUANT_MODES)} (see `brisk doctor`)",
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
        default="off",
        choices=SOURCES,
        help="speculative decoding source (default off)",
    )
    parser.add_argument("--draft-model", default="", help="draft model for --speculative draft/auto")
    parser.add_argument("--draft-quant", default=None, help="the draft model's quantization (as --quant)")
    parser.add_argument("--json", action="store_true", help="one JSON event per line")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model the command line asks for (defaults for what it leaves out)."""
    return ModelSpec(
        source=getattr(args, "model", None) or "",
        device=getattr(args, "device", None) or "auto",
        dtype=getattr(args, "dtype", None) or "auto",
        draft=getattr(args, "draft_model", "") or "",
        draft_quant=getattr(args, "draft_quant", None) or "none",
        quant=getattr(args, "quant", None) or "none",
    )


def load_client(args: argparse.Namespace, settings: Settings) -> Client:
    """A client with the model loaded; a load that fails, or a draft model that cannot be used, raises LoadError."""
    client = Client(local_backend(prefix_cache_bytes=settings.prefix_cache_mb << 20))
    try:
        client.load(model_spec(args))
        if client.warnings:
            raise LoadError(client.warnings[0].message)
    except BaseException:
        client.close()
        raise
    return client


def sampling_from(args: argparse.Namespace, settings: Settings) -> Sampling:
    def pick(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        return default if value is None else value

    return Sampling(
        temperature=float(pick("temperature", 0.0)),  # the CLI is greedy unless told otherwise
        top_p=float(pick("top_p", settings.top_p)),
        top_k=int(pick("top_k", settings.top_k)),
        repetition_penalty=float(pick("repetition_penalty", settings.repetition_penalty)),
        seed=pick("seed", None),
        max_tokens=int(pick("max_tokens", settings.max_tokens)),
        stop=tuple(args.stop or ()),
    )


def system_text(value: str | None) -> str | None:
    if value and value.startswith("@"):
        return Path(value[1:]).expanduser().read_text(encoding="utf-8")
    return value


def emit_json(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_event(event: Event, as_json: bool) -> None:
    if as_json:
        data = event.to_json()
        if isinstance(event, Token):
            data["ids"] = list(event.ids)
        emit_json(data)
    elif isinstance(event, Token):
        sys.stdout.write(event.text)
        sys.stdout.flush()
    elif isinstance(event, Done):
        m = event.metrics
        sys.stdout.write("\n")
        parts = [f"TTFT {m.ttft_s:.3f} s" if m.ttft_s is not None else ""]
        if m.tokens_per_s:
            parts.append(f"{m.tokens_per_s:.1f} tok/s")
        parts.append(f"{m.completion_tokens} tokens")
        parts.append(f"reused {m.cached_tokens} of {m.prompt_tokens} prompt tokens")
        if m.drafted:
            parts.append(f"accepted {m.accepted} of {m.drafted} drafted")
        if m.speedup:
            parts.append(f"{m.speedup:.2f}x plain decode")
        print(" · ".join(p for p in parts if p), file=sys.stderr)
    elif isinstance(event, Error):
        print(f"error: {event.message}", file=sys.stderr)


def run_conversation(args: argparse.Namespace, lines: Iterator[str]) -> int:
    settings = Settings()
    try:
        system = system_text(args.system)
    except OSError as exc:
        return fail(f"Cannot read the system prompt file: {exc}", args.json, EXIT_REQUEST)
    try:
        session = load_client(args, settings)
    except LoadError as exc:
        return fail(str(exc), args.json, EXIT_MODEL)
    try:
        messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        conversation = uuid.uuid4().hex
        status = 0
        for line in lines:
            text = line.rstrip("\n")
            if not text.strip():
                continue
            messages.append({"role": "user", "content": text})
            request = Request(
                id=uuid.uuid4().hex,
                messages=tuple(messages),
                sampling=sampling_from(args, settings),
                conversation_id=conversation,
                prefix_cache=not args.no_prefix_cache,
                speculative=args.speculative,
            )
            reply = ""
            for event in session.stream(request):
                print_event(event, args.json)
                if isinstance(event, Done):
                    reply = event.text
                elif isinstance(event, Error):
                    status = EXIT_REQUEST
            messages.append({"role": "assistant", "content": reply})
        return status
    finally:
        session.close()


def fail(message: str, as_json: bool, code: int) -> int:
    if as_json:
        emit_json({"type": "error", "t": 0.0, "message": message})
    else:
        print(f"error: {message}", file=sys.stderr)
    return code


def cmd_ask(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        return fail("The message is empty. Type something to ask.", args.json, EXIT_REQUEST)
    return run_conversation(args, iter([args.prompt]))


def cmd_chat(args: argparse.Namespace) -> int:
    return run_conversation(args, iter(sys.stdin))


def cmd_doctor(args: argparse.Namespace) -> int:
    from engine.doctor import report

    data = report()
    if args.json:
        emit_json(data)
    else:
        for key, value in data.items():
            print(f"{key:>22}: {value}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="brisk", description="Brisk: low-latency chat with local models")
    add_model_args(parser)
    sub = parser.add_subparsers(dest="command")
    ask = sub.add_parser("ask", help="one reply to PROMPT")
    ask.add_argument("prompt")
    add_request_args(ask)
    ask.set_defaults(func=cmd_ask)
    chat = sub.add_parser("chat", help="a conversation, one user message per line of standard input")
    add_request_args(chat)
    chat.set_defaults(func=cmd_chat)
    doctor = sub.add_parser("doctor", help="report on this machine: torch, devices, dtypes, quantization")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)
    bench = sub.add_parser("bench", help="benchmarks; prints a table and writes JSON")
    bench.add_argument("scenario", nargs="?", default="foundation")
    bench.add_argument("--runs", type=int, default=5)
    bench.add_argument("--out", default=None, help="JSON output path (default bench/results/SCENARIO.json)")
    bench.add_argument("--draft-model", default="", help="draft model for the speculative scenario")
    bench.add_argument("--only", default="", help="speculative: only the prompts whose name contains this")
    add_model_args(bench)
    bench.set_defaults(func=cmd_bench)
    return parser
