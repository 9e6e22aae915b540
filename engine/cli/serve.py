"""``brisk serve``: the loaded model as an OpenAI-compatible server (``engine.server``).

Listens on ``--host`` (127.0.0.1) and ``--port`` (8765) at once, saying
"loading" on ``/health`` (503) until the model is in, then prints the base URL
and one line per finished request until Ctrl-C.  ``--api-key KEY`` (or
``BRISK_SERVER_KEY``) is required for any host but loopback.  A request that
names another model is answered by the loaded one unless ``--strict-model``.
``--cache-reuse N`` is llama-server's (``engine.runtime.prefix_cache``): a raw
prompt (``/completion``, ``/infill``, ``/v1/completions``) reuses cached runs of
at least N tokens found after the common prefix, their KV moved into place, and
computes only the rest; chats never do.  Off by default: moved KV is an
approximation, so replies may differ from those of a cold prompt.  Model flags and
every setting left out come from the user's settings, as for ``brisk ask``; a
request's sampling fields left out take the settings' values.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from engine.api import SOURCES
from engine.cli.backend import add_cache_args, backend_factory
from engine.cli.common import (
    EXIT_MODEL,
    EXIT_REQUEST,
    add_model_args,
    apply_settings,
    fail,
    fail_problems,
    load_settings,
    model_spec,
    print_warnings,
    speculative_source,
)
from engine.client import Client, LoadError, Router

KEY_ENV = "BRISK_SERVER_KEY"


def add_serve_parser(sub: Any) -> None:
    from engine.server.run import DEFAULT_HOST, DEFAULT_PORT

    serve = sub.add_parser("serve", help="serve the model to other programs (OpenAI-compatible API)")
    add_model_args(serve)
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    serve.add_argument("--api-key", default=None, help=f"clients must send this key (or set {KEY_ENV})")
    serve.add_argument(
        "--speculative", default=None, choices=SOURCES, help="speculative decoding source for every request"
    )
    serve.add_argument(
        "--strict-model",
        action="store_true",
        help="refuse (404) a request naming a model other than the loaded one (default: the loaded model answers)",
    )
    serve.add_argument(
        "--cache-reuse",
        type=int,
        default=0,
        metavar="N",
        help="as llama-server's: raw prompts (/completion, /infill) reuse cached chunks of N tokens or more, "
        "their KV moved into place (256 suits editors; replies may differ from a cold prompt's; default 0: off)",
    )
    add_cache_args(serve)
    serve.add_argument("--quiet", action="store_true", help="no line per request")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.server import ServeError, serve_problems

    settings = load_settings(False)
    apply_settings(args, settings, False)
    key = args.api_key or os.environ.get(KEY_ENV) or None
    problems = serve_problems(args.host, args.port, key)
    if args.cache_reuse < 0:
        problems.append("--cache-reuse takes a number of tokens, 0 (off) or more")
    if problems:
        return fail_problems(problems, False)
    client: Client | None = None
    router = Router()  # the server listens while the engine starts; its requests wait for the backend there
    server = router.serve()
    server.service.strict_model = args.strict_model
    factory = backend_factory(args, settings)
    try:
        url = server.start(args.host, args.port, key, settings.sampling(), speculative_source(args, settings))
    except ServeError as exc:
        return fail(str(exc), False, EXIT_REQUEST)
    print(f"Listening on {url} (loading the model; /health says when it is ready)", flush=True)
    if not args.quiet:
        server.hub.log.listeners.append(_print_entry)
    try:
        client = Client(factory, router=router)
        loaded = client.load(model_spec(args))
    except (LoadError, ValueError) as exc:
        server.stop()
        if client is not None:
            client.close()
        return fail(str(exc), False, EXIT_MODEL)
    print_warnings(client.warnings, False)
    server.set_model(loaded.model_name, loaded.info.context_length)
    print(f"Serving {server.service.model} at {url} (Ctrl-C stops)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5) and server.running:
            pass
    finally:
        server.stop()
        client.close()
    return 0


def _print_entry(entry: Any, metrics: Any) -> None:
    ttft = f"TTFT {entry.ttft_s:.3f} s" if entry.ttft_s is not None else ""
    tokens = f"{entry.prompt_tokens}+{entry.completion_tokens} tokens ({entry.cached_tokens} cached)"
    detail = entry.message or f"{entry.finish} {tokens} {ttft}".strip()
    print(f"{entry.endpoint} {entry.client}: {entry.status} {detail}", file=sys.stderr, flush=True)
