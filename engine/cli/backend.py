"""Which backend a headless command drives, and the flags that choose and shape it.

The local engine (the default) or an OpenAI-compatible server (``--base-url
URL``, with ``--model NAME`` as the server's model id and ``--api-key KEY`` or
the ``BRISK_API_KEY`` variable, ``--server-timeout`` for a server that stops
sending, ``--allow-insecure-key`` to send a key over plain http to another
host; only http(s), and the key is never printed).
Tools (``--tools NAME,...|all``, ``--mcp COMMAND``, ``--grant DIR``,
``--sequential-tools``, ``--allow-private-fetch``) and the answer cache
(``--no-answer-cache``, ``--fresh``) shape the local engine's requests.

Every value is checked before a model loads (``backend_problems``): flags that
a server cannot honour (``--quant``, ``--tools``...) are refused with
``--base-url`` rather than silently ignored, and unknown tool names are
refused with the list of known ones (names taken from the settings enable
nothing when no tool has them, as in the window).  A name that is not built in, given with
``--mcp``, is looked up by starting the MCP servers once before loading
(``mcp_problems``).  ``load_client`` gives a :class:`Client` with the model
loaded, or raises :class:`LoadError` with a message for the user.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
import time
from pathlib import Path

from engine.api import AnswerCacheSettings, ModelSpec, ToolSettings
from engine.client import BackendFactory, Client, LoadError, local_backend
from engine.storage import Settings
from engine.tools import BUILTIN_NAMES

API_KEY_ENV = "BRISK_API_KEY"
MCP_START_S = 30.0  # at most this long per --mcp server before the first reply (the hub's own limit is 20 s)
# flags that only the local engine honours: name on the command line -> attribute and its "not given" value
LOCAL_ONLY: dict[str, tuple[str, object]] = {
    "--device": ("device", None),
    "--dtype": ("dtype", None),
    "--quant": ("quant", None),
    "--draft-model": ("draft_model", ""),
    "--draft-quant": ("draft_quant", None),
    "--speculative": ("speculative", None),
    "--no-prefix-cache": ("no_prefix_cache", False),
    "--tools": ("tools", None),
    "--mcp": ("mcp", None),
    "--grant": ("grant", None),
    "--sequential-tools": ("sequential_tools", False),
    "--allow-private-fetch": ("allow_private_fetch", False),
}


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url",
        default=None,
        help="run against an OpenAI-compatible server (http(s)://HOST:PORT[/v1]); --model is then its model id",
    )
    parser.add_argument("--api-key", default=None, help=f"the server's API key (or set {API_KEY_ENV})")
    parser.add_argument(
        "--server-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up on a server that sends no event for this long (default 300 for the first, then 60)",
    )
    parser.add_argument(
        "--allow-insecure-key",
        action="store_true",
        help="send the API key over plain http:// to a host that is not this machine (anyone on the way can read it)",
    )


def add_tool_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tools",
        default=None,
        metavar="NAME,...",
        help=f"enable these tools for the run ({', '.join(BUILTIN_NAMES)}, an MCP server's tools, or all)",
    )
    parser.add_argument("--mcp", action="append", default=None, metavar="COMMAND", help="add an MCP server (stdio)")
    parser.add_argument("--grant", action="append", default=None, metavar="DIR", help="let the files tool read DIR")
    parser.add_argument("--sequential-tools", action="store_true", help="run tool calls one after another")
    parser.add_argument(
        "--allow-private-fetch", action="store_true", help="let fetch reach loopback and private addresses"
    )


def add_cache_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-answer-cache", action="store_true", help="never answer from the answer cache")
    parser.add_argument("--fresh", action="store_true", help="generate anew even when the answer cache has it")


def api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None


def is_remote(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "base_url", None))


def tool_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The tools ``--tools`` enables, in order without repeats (``("all",)`` for all)."""
    raw = getattr(args, "tools", None) or ""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return ("all",) if "all" in names else tuple(dict.fromkeys(names))


def tool_settings(args: argparse.Namespace) -> ToolSettings:
    return ToolSettings(
        granted_dirs=tuple(str(Path(d).expanduser().resolve()) for d in getattr(args, "grant", None) or ()),
        fetch_allow_private=bool(getattr(args, "allow_private_fetch", False)),
        mcp_servers=tuple(getattr(args, "mcp", None) or ()),
    )


def answer_cache_settings(args: argparse.Namespace, settings: Settings | None = None) -> AnswerCacheSettings:
    """On unless ``--no-answer-cache``; the similarity threshold and age limit are the settings'."""
    enabled = not getattr(args, "no_answer_cache", False)
    if settings is None:
        return AnswerCacheSettings(enabled=enabled)
    ttl_s = settings.answer_cache_ttl_days * 24 * 3600.0
    return AnswerCacheSettings(enabled=enabled, threshold=settings.answer_cache_threshold, ttl_s=ttl_s)


def backend_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the backend's flags, each said as what to change (no server is contacted)."""
    problems: list[str] = []
    if is_remote(args):
        from engine.remote import RemoteError, check_base_url

        try:
            check_base_url(args.base_url)
        except RemoteError as exc:
            problems.append(f"--base-url: {exc}")
        timeout = getattr(args, "server_timeout", None)
        if timeout is not None and not 0 < timeout < float("inf"):
            problems.append(f"--server-timeout must be a number of seconds above 0, not {timeout}")
        local = [f for f, (name, unset) in LOCAL_ONLY.items() if getattr(args, name, unset) not in (unset, None, [])]
        if local:
            problems.append(
                f"{', '.join(local)} {'applies' if len(local) == 1 else 'apply'} to the local engine only "
                "(a server at --base-url runs its own model, caches and decoding, and Brisk's tools cannot run "
                "there yet): drop them or --base-url"
            )
        return problems
    if getattr(args, "api_key", None):
        problems.append("--api-key is only for a server: add --base-url URL or drop --api-key")
    raw = getattr(args, "tools", None)
    if raw is not None and not tool_names(args):
        problems.append(f"--tools {raw!r} names no tool; give NAME,... ({', '.join(BUILTIN_NAMES)}) or all")
    unknown = [n for n in tool_names(args) if n != "all" and n not in BUILTIN_NAMES]
    if unknown and not getattr(args, "mcp", None) and not getattr(args, "tools_from_settings", False):
        problems.append(_unknown_tools(unknown, []))
    for folder in getattr(args, "grant", None) or ():
        if not Path(folder).expanduser().is_dir():
            problems.append(f"--grant {folder!r} is not a folder; grant an existing folder to the files tool")
    for command in getattr(args, "mcp", None) or ():
        if not command.strip():
            problems.append("--mcp needs a command line that starts an MCP server over stdio")
    return problems


def _unknown_tools(unknown: list[str], mcp_names: list[str]) -> str:
    known = [*BUILTIN_NAMES, *mcp_names]
    which = ", ".join(repr(n) for n in unknown)
    return f"--tools: no tool named {which}; known tools: {', '.join(known)} (or all; add MCP servers with --mcp)"


def mcp_problems(args: argparse.Namespace) -> list[str]:
    """Tool names that are neither built in nor listed by a ``--mcp`` server (which are started once to ask)."""
    unknown = [n for n in tool_names(args) if n != "all" and n not in BUILTIN_NAMES]
    commands = getattr(args, "mcp", None) or ()
    if not unknown or not commands or is_remote(args) or getattr(args, "tools_from_settings", False):
        return []  # names from the settings are not checked: like the window, a name no server lists enables nothing
    from engine.tools.mcp_client import McpHub, ServerSpec

    hub = McpHub(connect_timeout_s=20.0)
    listed: list[str] = []
    failures: list[str] = []
    try:
        for i, command in enumerate(commands):
            state = hub.add(ServerSpec.parse(command, name=f"mcp{i + 1}"))
            listed += [t.name for t in state.tools]
            if state.status != "ready":
                failures.append(f"the MCP server {command!r} did not start: {state.message}")
    finally:
        hub.close()
    missing = [n for n in unknown if n not in listed]
    return [_unknown_tools(missing, listed), *failures] if missing else []


def backend_factory(args: argparse.Namespace, settings: Settings) -> BackendFactory:
    """The backend the command line asks for: a server at ``--base-url``, else the local engine."""
    if is_remote(args):
        from engine.remote import Limits, remote_backend

        limits = Limits.from_env()  # RemoteError for a bad BRISK_REMOTE_* value: load_client says it
        timeout = getattr(args, "server_timeout", None)
        if timeout is not None:
            limits = dataclasses.replace(limits, first_event_s=timeout, event_gap_s=timeout)
        if getattr(args, "allow_insecure_key", False):
            limits = dataclasses.replace(limits, allow_insecure_key=True)
        return remote_backend(args.base_url, getattr(args, "model", None) or None, api_key(args), limits=limits)
    return local_backend(
        prefix_cache_bytes=settings.prefix_cache_mb << 20,
        tools=tool_settings(args),
        answer_cache=answer_cache_settings(args, settings),
        cache_reuse=getattr(args, "cache_reuse", 0) or 0,  # brisk serve --cache-reuse
    )


def load_client(args: argparse.Namespace, settings: Settings, spec: ModelSpec) -> Client:
    """A client with the model loaded; a failed load or a draft model that cannot be used raises LoadError."""
    if is_remote(args):
        from engine.remote import RemoteError

        try:
            factory = backend_factory(args, settings)
        except RemoteError as exc:
            raise LoadError(str(exc)) from None
        spec = ModelSpec(source=getattr(args, "model", None) or "")
    else:
        factory = backend_factory(args, settings)
    try:
        client = Client(factory)
    except ValueError as exc:  # options the engine refuses (checked above, so rare); the message says what
        raise LoadError(str(exc)) from None
    try:
        client.load(spec)
        drafts = [w for w in client.warnings if w.kind == "draft"]
        if drafts:
            raise LoadError(drafts[0].message)
        if getattr(args, "mcp", None):
            wait_for_mcp(client, MCP_START_S * len(args.mcp))
    except BaseException:
        client.close()
        raise
    return client


def wait_for_mcp(client: Client, timeout_s: float) -> None:
    """Wait until the local engine has started (or given up on) its MCP servers, so the first reply can use them.

    The engine starts them on a thread of its own and does not wait; a command
    line run has one reply to give, so it waits here, at most ``timeout_s``.
    A server that fails arrives as ``Warning("tools", ...)``, printed by the command.
    """
    tools = getattr(client.backend, "tools", None)
    ready = getattr(tools, "ready", None)
    if isinstance(ready, threading.Event):
        ready.wait(timeout_s)
        return
    deadline = time.monotonic() + timeout_s  # engines without ToolBox.ready: join the thread that starts them
    for thread in [t for t in threading.enumerate() if t.name == "brisk-mcp-start"]:
        thread.join(max(0.0, deadline - time.monotonic()))
