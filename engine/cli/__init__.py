"""Headless commands: ``brisk ask``, ``brisk chat``, ``brisk compare``, ``brisk doctor``, ``brisk bench``,
``brisk models``, ``brisk documents``, ``brisk serve``.

``build_parser()`` is the whole command line (``app.cli`` adds the window).
Each command lives in a module of its own; ``engine.cli.common`` has what
they share.  The JSON contract (``--json``, one object per line) is stable:
every event has ``type`` and ``t`` (seconds since the request,
``time.perf_counter()``); token events are ``{"type": "token", "t", "text",
"ids", "draft"}``; each reply ends with ``{"type": "done", "t", "text",
"finish_reason", "metrics"}``; failures are ``{"type": "error", "t", "message",
"partial_text"}`` (what the reply had written, "" if nothing) and a non-zero exit code (2:
the model or server could not be loaded or reached, 3: the request or its input
was refused or failed).  Tool calls are ``{"type": "tool", "t", "name",
"arguments", "start", "end", "ok", "result"}`` (sent when each call ends);
``done.metrics`` carries ``tools_wall_s``/``tools_sequential_s`` and, for a
reply from the answer cache, ``answer_cache`` (``"exact"``/``"semantic"``),
``similarity`` and ``cached_question``.  ``--base-url`` runs ``ask``, ``chat``
and ``compare`` against an OpenAI-compatible server (``engine.cli.backend``).
``brisk compare --json`` prints one ``{"type": "compare", ...}`` object per
configuration (see ``engine.compare``).
"""

from __future__ import annotations

import argparse

from engine.cli.chat import cmd_ask, cmd_chat
from engine.cli.common import EXIT_MODEL, EXIT_REQUEST, add_model_args, add_request_args, emit_json
from engine.cli.compare import add_compare_parser
from engine.cli.documents import add_documents_parser
from engine.cli.models import add_models_parser
from engine.cli.serve import add_serve_parser

__all__ = ["EXIT_MODEL", "EXIT_REQUEST", "build_parser"]


def cmd_doctor(args: argparse.Namespace) -> int:
    from engine.doctor import report

    data = report()
    data.update(getattr(args, "window_facts", {}))  # the window's own checks (Qt's libraries), given by app.cli
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
    add_compare_parser(sub)
    add_serve_parser(sub)
    add_documents_parser(sub)
    add_models_parser(sub)
    doctor = sub.add_parser("doctor", help="report on this machine: torch, devices, dtypes, quantization")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)
    bench = sub.add_parser("bench", help="benchmarks; prints a table and writes JSON")
    from engine.bench import SCENARIOS

    bench.add_argument("scenario", nargs="?", default="foundation", help=f"one of: all, {', '.join(SCENARIOS)}")
    bench.add_argument("--runs", type=int, default=5, help="rounds (first-question: questions) to take medians over")
    bench.add_argument("--out", default=None, help="JSON output path (default bench/results/SCENARIO.json)")
    bench.add_argument("--draft-model", default="", help="draft model for the speculative scenario")
    bench.add_argument("--only", default="", help="speculative: only the prompts whose name contains this")
    bench.add_argument(
        "--peer",
        default=None,
        metavar="URL",
        help="also measure this OpenAI-compatible server (foundation, prefix, versus, typing)",
    )
    bench.add_argument(
        "--max-tokens", type=int, default=None, help="versus, serve: new tokens per reply, at most (200, 128)"
    )
    bench.add_argument("--clients", default="1,2,4,8", help="serve: the numbers of concurrent clients")
    bench.add_argument(
        "--also-quant", default=None, metavar="MODE", help="versus: also a local engine in this mode, speculation off"
    )
    bench.add_argument("--text-file", default=None, help="typing: also replay this file as a typed message")
    bench.add_argument("--context", type=int, default=None, help="overflow: the model's context, in tokens (1536)")
    bench.add_argument("--json", action="store_true", help="typing: also print one JSON object for the file")
    bench.add_argument(
        "--cache-reuse",
        type=int,
        default=0,
        metavar="N",
        help="infill: also a brisk serve with --cache-reuse N (256 as llama.vim suggests), requests interleaved",
    )
    bench.add_argument("--suite", default=None, help="peer-suite: llama.cpp's tools/server/tests folder")
    bench.add_argument("--suite-python", default=None, help="peer-suite: a Python with the suite's requirements")
    bench.add_argument("--peer-model", default=None, help="the peer's model id (default: the first it lists)")
    bench.add_argument("--api-key", default=None, help="the peer's API key (or set BRISK_API_KEY)")
    add_model_args(bench)
    bench.set_defaults(func=cmd_bench)
    return parser
