"""``brisk compare PROMPT --config KEY=VALUE[,...] --config ... [--cold] [--runs N] [--json]``.

Replays PROMPT (greedy, same seed) under each configuration with
``engine.compare`` and prints one ``{"type": "compare", ...}`` object per
configuration with ``--json``, else a Markdown table (progress goes to
standard error).  Keys: ``prefix_cache`` on/off, ``speculative`` a source,
``quant`` a mode (a change reloads the model), ``stream`` on/off; a key a
``--config`` leaves out takes the baseline's value: prefix_cache on,
speculative off (not ``ask``'s ``auto``: each row says what it switches on),
quant ``--quant`` or none, stream on.  Every
value is checked before the model loads; a bad one exits with ``EXIT_REQUEST``
and the choices.  With ``--base-url`` the replies come from a server and only
``stream`` can be switched (the rest are the server's own settings).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from engine.cli.backend import add_server_args, is_remote, load_client
from engine.cli.common import (
    EXIT_MODEL,
    EXIT_REQUEST,
    InputError,
    add_model_args,
    emit_json,
    fail,
    fail_problems,
    model_spec,
    request_problems,
    system_text,
)
from engine.client import LoadError, RequestError
from engine.compare import SWITCHES, Config, ConfigError, compare, markdown, parse_config
from engine.storage import Settings


def add_compare_parser(sub: Any) -> None:
    keys = "; ".join(f"{k}: {'/'.join(v)}" for k, v in SWITCHES.items())
    parser = sub.add_parser(
        "compare",
        help="replay PROMPT under several configurations and compare TTFT, speed and output",
        description=f"Replay PROMPT greedily under each --config and compare the numbers. Keys: {keys}.",
    )
    parser.add_argument("prompt")
    add_model_args(parser)
    add_server_args(parser)
    parser.add_argument("--system", default=None, help="system prompt TEXT, or @FILE to read it from a file")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="one configuration to compare (repeat for each); keys prefix_cache, speculative, quant, stream; "
        "a key left out takes the baseline: prefix_cache=on, speculative=off, quant=--quant or none, stream=on",
    )
    parser.add_argument("--cold", action="store_true", help="empty the prompt cache before each measured run")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per configuration (medians; default 3)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-model", default="", help="draft model for speculative=draft/auto")
    parser.add_argument("--draft-quant", default=None, help="the draft model's quantization (as --quant)")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration")
    parser.set_defaults(func=cmd_compare)


BASE = Config().to_dict()


def configs_from(args: argparse.Namespace) -> tuple[list[Config], list[str]]:
    """The configurations asked for, and the problems with them."""
    base = Config(quant=args.quant or "none")
    configs, problems = [], []
    if not args.config:
        problems.append("give at least one --config KEY=VALUE[,KEY=VALUE...], for example --config prefix_cache=off")
    for text in args.config:
        try:
            configs.append(parse_config(text, base))
        except ConfigError as exc:
            problems.append(str(exc))
    if any(c.speculative == "draft" for c in configs) and not args.draft_model:
        problems.append("speculative=draft needs a draft model: add --draft-model PATH")
    if is_remote(args):
        local = sorted({k for c in configs for k, v in c.to_dict().items() if k != "stream" and v != BASE[k]})
        if local:
            problems.append(
                f"with --base-url only stream=on/off can be compared: {', '.join(local)} are the server's own "
                "settings (its caches, decoding and quantization), so drop them from --config"
            )
        if args.cold:
            problems.append("--cold needs the local engine (a server's prompt cache cannot be emptied from here)")
    return configs, problems


def cmd_compare(args: argparse.Namespace) -> int:
    settings = Settings()
    if not args.prompt.strip():
        return fail("The prompt is empty. Give the message to replay.", args.json, EXIT_REQUEST)
    problems = request_problems(args, settings)
    configs, config_problems = configs_from(args)
    problems += config_problems
    if args.runs < 1:
        problems.append(f"--runs must be 1 or more, not {args.runs}")
    if problems:
        return fail_problems(problems, args.json)
    try:
        system = system_text(args.system, getattr(args, "system_is_text", False))
    except InputError as exc:
        return fail(str(exc), args.json, EXIT_REQUEST)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": args.prompt}]
    spec = replace(model_spec(args), quant=configs[0].quant)
    try:
        client = load_client(args, settings, spec)
    except LoadError as exc:
        return fail(str(exc), args.json, EXIT_MODEL)
    try:
        results = compare(
            client,
            spec,
            messages,
            configs,
            max_tokens=args.max_tokens,
            seed=args.seed,
            runs=args.runs,
            cold=args.cold,
            progress=lambda text: print(text, file=sys.stderr, flush=True),
        )
    except LoadError as exc:
        return fail(str(exc), args.json, EXIT_MODEL)
    except (RequestError, ValueError) as exc:
        return fail(str(exc), args.json, EXIT_REQUEST)
    finally:
        client.close()
    if args.json:
        for result in results:
            emit_json(result.to_json())
    else:
        print(markdown(results))
        mode = "cold (prompt cache emptied before each run)" if args.cold else "warm (after one warm-up run)"
        print(f"\n{mode}; medians of {args.runs} run(s); greedy, seed {args.seed}, up to {args.max_tokens} tokens")
    return 0
