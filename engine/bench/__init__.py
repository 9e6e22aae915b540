"""``brisk bench SCENARIO``: benchmarks that print a table and write JSON.

Scenarios: ``foundation`` (model load cold/warm; TTFT and decode speed of our
loop against ``model.generate()``), ``prefix`` (TTFT with and without the
prefix cache: a long shared system prompt, and a 10-turn chat), ``speculative``
(each draft source on grounded and open prompts), ``quant`` (each quantization
mode's speed and agreement), ``answer-cache`` (hit and miss times, false
hits), ``decode`` (each mode against the memory-bandwidth limit, threads under
load), ``versus`` (Brisk as installed against ``--peer``: story and grounded
decode, long-system-prompt TTFT), ``structured`` (JSON by construction against JSON by asking:
valid rate, time, forced tokens), ``typing`` (prefill while typing: TTFT after Send on and off for
messages typed and pasted at a person's pace; ``--text-file F``, ``--json``), ``serve`` (the server under
1, 2, 4 and 8 concurrent clients: aggregate tokens/s, TTFT and TPOT; ``--clients``), ``documents`` (the first
and second question about a 3,000-token document, in a new chat and after a restart; indexing and retrieval
on 1,000 notes), ``models`` (each architecture's load time, decode speed and agreement on Brisk's paths
against transformers' forward; the model library's scan of 200 folders), ``gguf`` (a .gguf file: first and
later start, speed), ``defaults`` (which default sampling keeps the bundled model from looping),
``first-question`` (``brisk ask`` in a new process, answer cache and speculation on and off),
``first-start`` (the window's first start: time to a usable chat), ``infill`` (code
completion: an editing session replayed on ``/infill`` as llama.vim sends it), ``tools`` (how often the model calls the
calculator with Brisk's own tool prompt and without), ``overflow`` (the first reply after a chat
outgrows the context against the reply before it; ``--context``),
``branch`` (a branched chat's first reply against a cold chat with the same history and a one-line follow-up),
``project`` (a new chat's first reply in an open project, its prefix prefilled, against one outside it),
``peer-suite`` (llama.cpp's own server tests against its ``llama-server`` and against Brisk; ``--suite``),
``all``.  Variants are compared side by
side in one run; we report medians.  Each scenario lives in a module of its own.

Every benchmark lives here, in ``engine/bench/``, and prints its tables with :mod:`engine.bench.common`'s
one table printer and median.  Those that take arguments of their own or run in a scratch environment
are run as modules from the repository's root (``python -m engine.bench.NAME``, each docstring says how):
``step_phases``, ``ttft_alone``, ``quant``, and the one-offs whose numbers the docs quote,
``document_converters``, ``document_prefill_parts``, ``grammar_libraries``, ``server_frameworks`` and
``vector_search``.  JSON goes to ``bench/results/`` (not committed).

``--peer URL`` (an OpenAI-compatible server; ``--peer-model`` its model id,
default the first it lists; ``--api-key`` or ``BRISK_API_KEY``) adds a table
with the server as a column beside the local engine, for the scenarios where
the same measure means the same thing on both (``PEER_SCENARIOS``: TTFT cold
and warm and decode tok/s, with a short system prompt for ``foundation`` and a
long shared one for ``prefix``); other scenarios say the peer is not used.
The peer is connected before the local runs start, so a bad URL fails fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec
from engine.bench.common import LONG_SYSTEM, PEER_EXTRA, latency_profile, peer_rows, save, table
from engine.client import Client, LoadError, RequestError, local_backend

SCENARIOS: dict[str, str] = {
    "foundation": "engine.bench.foundation",
    "prefix": "engine.bench.prefix",
    "speculative": "engine.bench.speculative",
    "quant": "engine.bench.quant",
    "answer-cache": "engine.bench.answer_cache",
    "decode": "engine.bench.decode",
    "versus": "engine.bench.versus",
    "structured": "engine.bench.structured",
    "typing": "engine.bench.typing_prefill",
    "serve": "engine.bench.serve",
    "documents": "engine.bench.document_chat",
    "models": "engine.bench.models",
    "gguf": "engine.bench.gguf",
    "defaults": "engine.bench.defaults",
    "first-question": "engine.bench.first_question",
    "first-start": "engine.bench.first_start",
    "infill": "engine.bench.infill",
    "tools": "engine.bench.tools",
    "overflow": "engine.bench.overflow",
    "branch": "engine.bench.branch",
    "project": "engine.bench.project",
    "peer-suite": "engine.bench.peer_suite",
}


OWN_PEER = ("versus", "typing", "serve", "documents")  # scenarios that measure the peer their own way
PEER_SCENARIOS: dict[str, str] = {
    "foundation": "You are a helpful assistant.",
    "prefix": LONG_SYSTEM,  # the prefix scenario has its own, of about 1,200 tokens
}


def run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return importlib.import_module(SCENARIOS[name]).run(args)  # type: ignore[no-any-return]


def connect_peer(args: argparse.Namespace) -> Client:
    """A client on the ``--peer`` server with its model chosen; LoadError says why not."""
    from engine.remote import RemoteError, remote_backend

    key = getattr(args, "api_key", None) or os.environ.get("BRISK_API_KEY") or None
    try:
        model = getattr(args, "peer_model", None) or None
        client = Client(remote_backend(args.peer, model, key, extra_body=PEER_EXTRA))
    except RemoteError as exc:
        raise LoadError(str(exc)) from None
    try:
        client.load(ModelSpec(source=getattr(args, "peer_model", None) or ""))
    except BaseException:
        client.close()
        raise
    return client


def peer_comparison(name: str, args: argparse.Namespace, peer: Client) -> dict[str, Any]:
    """The local engine and the peer measured the same way; prints the table and returns its data."""
    spec = ModelSpec(source=args.model or "", dtype=args.dtype or "auto", quant=args.quant or "none")
    runs = max(1, args.runs // 2)
    with Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False))) as local:  # measure the model
        local.load(spec)
        mine = latency_profile(local, PEER_SCENARIOS[name], runs, speculative="off")
    theirs = latency_profile(peer, PEER_SCENARIOS[name], runs)
    assert peer.loaded is not None
    label = f"peer ({peer.loaded.model_name} at {args.peer})"
    rows = peer_rows(mine, theirs, label)
    title = (
        f"Local engine and peer, the same requests (greedy, 64 new tokens, {name} system prompt, local speculative off)"
    )
    print(table(title, rows))
    return {"url": args.peer, "model": peer.loaded.model_name, "local": mine, "peer": theirs, "speculative": "off"}


def run_bench(args: argparse.Namespace) -> int:
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; choose one of: all, {', '.join(SCENARIOS)}")
        return 2
    from engine.doctor import report

    peer: Client | None = None
    if getattr(args, "peer", None) and set(names) & set(PEER_SCENARIOS):  # versus connects its own
        try:
            peer = connect_peer(args)
        except LoadError as exc:
            print(f"error: cannot use the peer: {exc}", file=sys.stderr)
            return 2
    try:
        for name in names:
            started = time.time()
            data = {"scenario": name, "machine": report(), "started": started, "results": run_scenario(name, args)}
            if peer is not None and name in PEER_SCENARIOS:
                try:
                    data["peer"] = peer_comparison(name, args, peer)
                except RequestError as exc:
                    print(f"error: the peer failed: {exc}", file=sys.stderr)
                    return 3
            elif peer is not None and name not in OWN_PEER:
                print(f"\n--peer is not used by the {name} scenario (it measures what only the local engine has)")
            out = save(name, data, args.out if len(names) == 1 else None)
            print(f"\nwrote {out}")
    finally:
        if peer is not None:
            peer.close()
    return 0
