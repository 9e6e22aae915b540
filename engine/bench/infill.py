"""``brisk bench infill``: code completion in the editor, an editing session replayed on ``/infill``.

Starts ``brisk serve`` (``--model``, e.g. Qwen2.5-Coder-0.5B's GGUF; ``--quant``, default fp16-cpu;
speculation and the answer cache off, as ``brisk bench serve`` does) and replays an editing session on a
real source file (``--text-file``, default ``engine/runtime/scheduler.py``, about 300 lines) the way
llama.vim drives ``llama-server``: the cursor moves down the file, :data:`MOVE` lines at a time; at each
place :data:`KEYS` keystrokes' worth of the line are typed (:data:`TYPED` characters each), each one a
request shaped as llama.vim's ``llama#fim`` sends it (the :data:`N_PREFIX` lines above the cursor, the
line up to the cursor as ``prompt``, the rest of the line and :data:`N_SUFFIX` lines below, ``n_indent``,
``top_k`` 40, ``top_p`` 0.9, ``samplers`` ``["top_k", "top_p", "infill"]``, ``cache_prompt``,
``t_max_*``, ``response_fields``, ``n_predict`` ``--max-tokens``, default 24).  Its ring of chunks
grows as the cursor moves: a chunk of :data:`CHUNK` lines from elsewhere in the file at each move, at most
:data:`RING` (llama.vim's defaults halved), the oldest dropped first, each new ring sent first as
llama.vim's warm-up request (``n_predict`` 0, not counted).  Per request: total (sent to answered, at
this end), TTFT (total less the server's ``predicted_ms``: when the first token would have come),
``prompt_n`` (tokens computed) and ``tokens_cached``.  Printed: p50 and p95 for each, and which kind of
request (a keystroke on the same line, a cursor move, a ring change) costs what.  ``--peer URL`` (a
``llama-server`` root, e.g. ``llama-server -m QWEN.gguf --port 8012 --cache-reuse 256``) replays the same
session on it; ``--cache-reuse N`` also starts a second ``brisk serve --cache-reuse N`` (chunks of the
cached prompt moved into place, ``engine.runtime.prefix_cache``).  Each request goes to every server in
turn, so a busy machine's slow moments fall on all of them alike.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from engine.bench.common import percentile, table

N_PREFIX = 256  # llama.vim's n_prefix
N_SUFFIX = 64  # llama.vim's n_suffix
CHUNK = 32  # llama.vim's ring_chunk_size / 2, the lines of a chunk it picks
RING = 8  # chunks kept (llama.vim: 16)
MOVE = 9  # lines the cursor moves between places
KEYS = 3  # keystrokes typed at each place
TYPED = 2  # characters a keystroke's request adds (llama.vim asks again after each pause)
PLACES = 12
FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/predicted_n",
    "timings/predicted_ms",
    "truncated",
    "tokens_cached",
]


def session(lines: list[str], name: str, n_predict: int) -> list[tuple[str, dict[str, Any]]]:
    """The requests of one editing session, in order: (kind, body); kind is ring, move or key."""
    rng = random.Random(0)
    ring: list[dict[str, Any]] = []
    out: list[tuple[str, dict[str, Any]]] = []
    places = [p for p in range(20, len(lines), MOVE) if lines[p].strip()][:PLACES]
    for place in places:
        far = [s for s in range(0, max(1, len(lines) - CHUNK)) if abs(s - place) > CHUNK]
        start = rng.choice(far or [0])
        ring.append({"text": "\n".join(lines[start : start + CHUNK]) + "\n", "time": time.time(), "filename": name})
        ring = ring[-RING:]
        base = {"id_slot": 0, "input_extra": list(ring), "cache_prompt": True, "response_fields": [""]}
        out.append(("ring", {**base, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0}))
        out[-1][1].update(temperature=0.0, samplers=[], stream=False, t_max_prompt_ms=1, t_max_predict_ms=1)
        line = lines[place]
        indent = len(line) - len(line.lstrip())
        for key in range(KEYS):
            col = min(len(line), indent + TYPED * (key + 1))
            body = {
                "id_slot": 0,
                "input_prefix": "\n".join(lines[max(0, place - N_PREFIX) : place]) + "\n",
                "input_suffix": line[col:] + "\n" + "\n".join(lines[place + 1 : place + 1 + N_SUFFIX]) + "\n",
                "input_extra": list(ring),
                "prompt": line[:col],
                "n_predict": n_predict,
                "stop": [],
                "n_indent": indent,
                "top_k": 40,
                "top_p": 0.90,
                "samplers": ["top_k", "top_p", "infill"],
                "stream": False,
                "cache_prompt": True,
                "t_max_prompt_ms": 500,
                "t_max_predict_ms": 1000,
                "response_fields": FIELDS,
            }
            out.append(("move" if key == 0 else "key", body))
    return out


def loaded(root: str, limit_s: float = 900.0) -> None:
    """Wait until the server has its model (``/props`` answers: its ``/health`` answers while it loads)."""
    import httpx2

    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        try:
            if httpx2.get(root.rstrip("/") + "/props", timeout=10).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{root} did not load its model in {limit_s:.0f} s")


def replay(
    servers: list[tuple[str, str]], requests: list[tuple[str, dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Each request sent to every server in turn (so a busy machine's slow moments fall on all of them alike);
    the rows of each server by its label."""
    import httpx2

    for _, root in servers:
        loaded(root)
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in servers}
    with httpx2.Client(timeout=600) as client:
        for i, (kind, body) in enumerate(requests):
            for label, root in servers:
                results[label].append(one(client, root, label, i, kind, body))
    return results


def one(client: Any, root: str, label: str, i: int, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """One ``/infill`` request: its row (total, TTFT, tokens computed, cached and predicted)."""
    began = time.perf_counter()
    answer = client.post(root.rstrip("/") + "/infill", json=body)
    total = time.perf_counter() - began
    if answer.status_code != 200:
        raise RuntimeError(f"{label}: /infill answered {answer.status_code}: {answer.text[:300]}")
    got = answer.json()
    predicted_ms = float(got.get("timings/predicted_ms") or 0.0)
    row = {
        "i": i,
        "kind": kind,
        "total_ms": total * 1000,
        "ttft_ms": total * 1000 - predicted_ms,
        "prompt_n": int(got.get("timings/prompt_n") or 0),
        "cached": int(got.get("tokens_cached") or 0),
        "predicted_n": int(got.get("timings/predicted_n") or 0),
    }
    if kind != "ring":
        print(
            f"{label:>14} {i:3d} {kind:4s} total {row['total_ms']:7.0f} ms  ttft {row['ttft_ms']:7.0f} ms  "
            f"computed {row['prompt_n']:5d}  cached {row['cached']:5d}  predicted {row['predicted_n']:3d}",
            file=sys.stderr,
            flush=True,
        )
    return row


def summary(label: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for kind in ("all", "key", "move"):
        mine = [r for r in rows if r["kind"] != "ring" and (kind == "all" or r["kind"] == kind)]
        if not mine:
            continue
        out.append(
            {
                "server": label,
                "requests": kind,
                "n": len(mine),
                "ttft p50 ms": round(percentile([r["ttft_ms"] for r in mine], 50)),
                "ttft p95 ms": round(percentile([r["ttft_ms"] for r in mine], 95)),
                "total p50 ms": round(percentile([r["total_ms"] for r in mine], 50)),
                "total p95 ms": round(percentile([r["total_ms"] for r in mine], 95)),
                "computed p50": round(percentile([r["prompt_n"] for r in mine], 50)),
                "computed p95": round(percentile([r["prompt_n"] for r in mine], 95)),
                "cached p50": round(percentile([r["cached"] for r in mine], 50)),
            }
        )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.bench.serve import start_brisk

    path = Path(getattr(args, "text_file", None) or Path(__file__).parents[1] / "runtime" / "scheduler.py")
    lines = path.read_text(encoding="utf-8").splitlines()
    requests = session(lines, path.name, args.max_tokens or 24)
    reuse = int(getattr(args, "cache_reuse", 0) or 0)
    children = []
    try:
        child, url, _model = start_brisk(args, "off")
        children.append(child)
        servers = [("Brisk", url.removesuffix("/v1"))]
        if reuse:
            child, url, _model = start_brisk(args, "off", ("--cache-reuse", str(reuse)))
            children.append(child)
            servers.append((f"Brisk reuse {reuse}", url.removesuffix("/v1")))
        if getattr(args, "peer", None):
            servers.append(("peer", args.peer))
        results = replay(servers, requests)
        rows = [row for label, _ in servers for row in summary(label, results[label])]
    finally:
        for child in children:
            child.terminate()
            child.wait(timeout=60)
    print(
        table(
            f"/infill while editing {path.name} ({len(lines)} lines): {sum(k != 'ring' for k, _ in requests)} "
            f"requests as llama.vim sends them, n_predict {args.max_tokens or 24}",
            rows,
        )
    )
    return {"file": str(path), "results": results, "table": rows}
