"""``brisk bench serve``: the server under concurrent clients, against another server (``--peer URL``).

Starts ``brisk serve`` twice, each in a process of its own on a free port (the bundled model or ``--model``,
``--quant`` as asked, default fp16-cpu; the answer cache off, since the rounds repeat prompts on purpose):
"Brisk" as installed (``--speculative auto``) and "Brisk off" (``--speculative off``), and drives both over
HTTP from this process, as other programs would: for each client count
of ``--clients`` (default 1,2,4,8) and each arrival pattern (``together``: all at once; ``staggered``: one
every 0.25 s), that many streamed chat requests (greedy, ``--max-tokens`` new tokens, default 128,
repetition penalty off) on open prompts of many kinds and lengths, not chosen to draft well.  Per
request: TTFT (to the first content), TPOT (first to last content over the tokens between), tokens (the
server's ``usage``).  Per run: aggregate tokens/s (all completion tokens over the time from the first
request to the last answer).  Each round runs the servers one after the other at every client count,
interleaved (Brisk, Brisk off, the peer); the table gives medians with ranges over ``--runs`` rounds
(default 3), and the JSON every request.  ``--peer URL`` is e.g. llama.cpp's ``llama-server --parallel 8``
on the same GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from engine.bench.common import BRISK, median, percentile, spread, stop, table
from engine.bench.versus import GROUNDED, OPEN

STAGGER_S = 0.25
START_LIMIT_S = 600.0


def prompts() -> list[str]:
    """Open prompts of many kinds, and a few long grounded ones, in a fixed order: mixed lengths."""
    out = list(OPEN.values())
    grounded = list(GROUNDED.values())
    for i, text in enumerate(grounded[:3]):
        out.insert(2 + 3 * i, text)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_brisk(
    args: argparse.Namespace, speculative: str, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``brisk serve --speculative SPECULATIVE`` (and ``extra`` flags) in a child process; (process, base URL,
    model id) once it answers."""
    import httpx2

    port = free_port()
    command = [*BRISK, "serve", "--port", str(port), "--quiet", "--no-answer-cache"]
    command += ["--speculative", speculative, "--quant", args.quant or "fp16-cpu"]
    if args.model:
        command += ["--model", args.model]
    command += extra
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    while time.monotonic() - began < START_LIMIT_S:
        if child.poll() is not None:
            raise RuntimeError(f"brisk serve ended: {child.stderr.read().decode()[-2000:] if child.stderr else ''}")
        try:
            health = httpx2.get(root + "/health", timeout=2)
            if health.status_code == 200:
                return child, root + "/v1", str(health.json()["model"])
        except httpx2.TransportError:
            pass
        time.sleep(0.5)
    child.kill()
    raise RuntimeError("brisk serve did not become ready")


def peer_model(url: str, key: str | None) -> str:
    import httpx2

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = httpx2.get(url.rstrip("/") + "/models", headers=headers, timeout=10).json()
    return str(data["data"][0]["id"])


def one_request(url: str, model: str, key: str | None, prompt: str, max_tokens: int, extra: dict[str, Any]) -> dict:
    """One streamed chat request; its TTFT, TPOT, tokens and times (seconds, on this process's clock)."""
    import httpx2

    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    first = last = None
    tokens, deltas = 0, 0
    with httpx2.stream("POST", url.rstrip("/") + "/chat/completions", json=body, headers=headers, timeout=600) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code} {r.read().decode()[:200]}", "start": start, "end": time.perf_counter()}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens") or 0)
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    deltas += 1
    end = time.perf_counter()
    tokens = tokens or deltas
    ttft = (first - start) if first is not None else None
    tpot = (last - first) / (tokens - 1) if first is not None and last is not None and tokens > 1 else None
    return {"start": start, "end": end, "ttft_s": ttft, "tpot_s": tpot, "tokens": tokens, "prompt": prompt[:40]}


def one_run(
    url: str,
    model: str,
    key: str | None,
    clients: int,
    pattern: str,
    offset: int,
    args: argparse.Namespace,
    extra: dict,
) -> dict[str, Any]:
    texts = prompts()
    results: list[dict] = [{} for _ in range(clients)]

    def work(i: int) -> None:
        start = time.perf_counter()
        try:
            results[i] = one_request(url, model, key, texts[(offset + i) % len(texts)], args.max_tokens, extra)
        except Exception as exc:  # noqa: BLE001 - a dropped stream is this request's error, not the bench's end
            results[i] = {"error": f"{type(exc).__name__}: {exc}", "start": start, "end": time.perf_counter()}

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
        if pattern == "staggered":
            time.sleep(STAGGER_S)
    for thread in threads:
        thread.join()
    began = min(r["start"] for r in results)
    ended = max(r["end"] for r in results)
    tokens = sum(r.get("tokens", 0) for r in results)
    return {
        "clients": clients,
        "pattern": pattern,
        "aggregate_tok_s": tokens / (ended - began),
        "wall_s": ended - began,
        "errors": [r["error"] for r in results if "error" in r],
        "requests": results,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    agg = [r["aggregate_tok_s"] for r in runs]
    ttft = [q["ttft_s"] for r in runs for q in r["requests"] if q.get("ttft_s") is not None]
    tpot = [q["tpot_s"] for r in runs for q in r["requests"] if q.get("tpot_s") is not None]
    return {
        "agg": agg,
        "agg_median": median(agg),
        "agg_min": min(agg),
        "agg_max": max(agg),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p95": percentile(tpot, 95),
        "errors": sum(len(r["errors"]) for r in runs),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.max_tokens = args.max_tokens or 128
    counts = [int(c) for c in str(getattr(args, "clients", None) or "1,2,4,8").split(",") if c.strip()]
    key = getattr(args, "api_key", None) or os.environ.get("BRISK_API_KEY") or None
    servers: list[tuple[str, str, str, str | None, dict[str, Any]]] = []
    children: list[subprocess.Popen[bytes]] = []
    try:
        for name, speculative in (("Brisk", "auto"), ("Brisk off", "off")):  # as installed, and speculation off
            child, url, model = start_brisk(args, speculative)
            children.append(child)
            servers.append((name, url, model, None, {"repetition_penalty": 1.0}))
        if getattr(args, "peer", None):
            servers.append(
                ("peer", args.peer, args.peer_model or peer_model(args.peer, key), key, {"repeat_penalty": 1.0})
            )
        for _name, url_, model_, key_, extra in servers:  # one warm-up request each: first-use costs are not counted
            one_request(url_, model_, key_, "Hello!", 8, extra)
        raw: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(max(1, args.runs)):
            for pattern in ("together", "staggered"):
                for clients in counts:
                    for name, url_, model_, key_, extra in servers:
                        result = one_run(url_, model_, key_, clients, pattern, round_ * 3, args, extra)
                        raw.setdefault(f"{name}|{pattern}|{clients}", []).append(result)
                        print(
                            f"round {round_ + 1} {name} {pattern} x{clients}: {result['aggregate_tok_s']:.1f} tok/s",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        for child in children:
            stop(child)
    rows, summary = [], {}
    for key_name, runs in raw.items():
        name, pattern, how_many = key_name.split("|")
        s = summarise(runs)
        single = summarise(raw[f"{name}|{pattern}|{counts[0]}"])["agg_median"]
        summary[key_name] = s
        rows.append(
            {
                "server": name,
                "arrival": pattern,
                "clients": int(how_many),
                "aggregate tok/s (min-max)": spread(s["agg"], "{:.1f}"),
                f"vs {counts[0]} client": f"{s['agg_median'] / single:.2f}x",
                "TTFT p50 / p95 s": f"{s['ttft_p50']:.3f} / {s['ttft_p95']:.3f}",
                "TPOT p50 / p95 ms": f"{1000 * s['tpot_p50']:.1f} / {1000 * s['tpot_p95']:.1f}",
                "errors": s["errors"],
            }
        )
    rows.sort(key=lambda r: (r["arrival"], r["clients"], r["server"]))
    print(
        table(
            f"Concurrent clients, streamed, greedy, {args.max_tokens} new tokens, open prompts of mixed lengths "
            f"({max(1, args.runs)} rounds, medians)",
            rows,
        )
    )
    return {"clients": counts, "max_tokens": args.max_tokens, "summary": summary, "runs": raw, "peer": args.peer}


if __name__ == "__main__":  # pragma: no cover - run through `brisk bench serve`
    raise SystemExit("run it as: brisk bench serve [--clients 1,2,4,8] [--peer URL]")
