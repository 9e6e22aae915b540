"""Starlette against FastAPI for an OpenAI-compatible streaming API on uvicorn: imports, start, latency, SSE, memory.

Run in a scratch environment, not Brisk's (neither framework is a dependency of Brisk)::

    python3 -m venv /tmp/fw-venv
    /tmp/fw-venv/bin/pip install -q fastapi starlette sse-starlette uvicorn httpx2
    nice -n 10 /tmp/fw-venv/bin/python -m engine.bench.server_frameworks [ROUNDS] [--out PATH]   # from the root

Prints a table and writes ``bench/results/server_frameworks.json`` (or PATH).  The two variants serve the same
routes, ``GET /health`` and ``POST /v1/chat/completions``, on uvicorn (h11, asyncio loop, 127.0.0.1, a free port):

* ``A``: Starlette + sse-starlette; the handler reads the JSON body and checks ``model`` and ``messages`` by hand;
* ``B``: FastAPI + sse-starlette; the body is a pydantic model (model, messages of role/content, max_tokens,
  stream) and the handler returns a plain dict, as FastAPI code usually does.

Each round (default 15) runs A then B, every measurement in new processes: the import time of the framework
stack (``time.perf_counter`` around the imports in a fresh ``python -c``, and the modules they load); the time
from ``Popen`` of the server until ``GET /health`` answers 200; the first and then 300 sequential non-streamed
chat requests over one keep-alive connection (a fixed JSON reply; p50/p95 in ms, over all 300); 10 streamed
requests of 200 SSE chunks plus ``[DONE]`` (median time to the first event and to the end, per run); and the
server's RSS (``/proc/PID/status``) when /health first answered and after all requests.  The table gives the
median over rounds and the min-max.  The client is httpx2 (the openai SDK's HTTP library) when installed,
else httpx, else ``http.client``.  It also records the versions and what FastAPI adds to the install on top of
Starlette, sse-starlette and uvicorn (packages and bytes, from each distribution's RECORD).
"""

import argparse
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.bench.common import markdown_table, median, percentile, run_python, save, spread, stop

ROOT = Path(__file__).resolve().parents[2]  # the repository, where ``python -m engine.bench...`` finds engine/

HOST = "127.0.0.1"
REQUESTS = 300
STREAMS = 10
EVENTS = 200
VARIANTS = {"A": "starlette + sse-starlette", "B": "fastapi + sse-starlette"}
STACKS = {
    "A": "uvicorn, starlette.applications, starlette.requests, starlette.responses, starlette.routing, sse_starlette",
    "B": "uvicorn, fastapi, pydantic, sse_starlette",
}
PACKAGES = ["starlette", "sse-starlette", "uvicorn", "fastapi", "pydantic", "pydantic-core", "httpx2", "httpx"]
CHAT = {
    "model": "bench",
    "messages": [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hi."}],
    "max_tokens": 16,
    "stream": False,
}


def completion(model: str) -> dict[str, Any]:
    """The fixed reply of a non-streamed request."""
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"},
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }


async def chunks(model: str) -> AsyncIterator[dict[str, str]]:
    """The events of a streamed request: EVENTS small chat.completion.chunk objects, then [DONE]."""
    for i in range(EVENTS):
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}],
        }
        yield {"data": json.dumps(chunk)}
    yield {"data": "[DONE]"}


def starlette_app() -> Any:
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return JSONResponse({"error": "model must be a string"}, status_code=422)
        if not isinstance(body.get("messages"), list):
            return JSONResponse({"error": "messages must be a list"}, status_code=422)
        if body.get("stream"):
            return EventSourceResponse(chunks(body["model"]))
        return JSONResponse(completion(body["model"]))

    routes = [Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"])]
    return Starlette(routes=routes)


def fastapi_app() -> Any:
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sse_starlette import EventSourceResponse

    class Message(BaseModel):
        role: str
        content: str

    class ChatBody(BaseModel):
        model: str
        messages: list[Message]
        max_tokens: int | None = None
        stream: bool = False

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatBody) -> Any:
        if body.stream:
            return EventSourceResponse(chunks(body.model))
        return completion(body.model)

    return app


def serve(variant: str, port: int) -> None:
    """In the server child: build the variant's app and run uvicorn until SIGTERM."""
    import uvicorn

    app = starlette_app() if variant == "A" else fastapi_app()
    uvicorn.run(app, host=HOST, port=port, loop="asyncio", http="h11", log_level="warning", access_log=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PlainClient:
    """http.client over one keep-alive connection: the fallback when neither httpx2 nor httpx is installed."""

    name = "http.client"

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HOST, port, timeout=30)

    def _send(self, body: dict[str, Any]) -> http.client.HTTPResponse:
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        return self.conn.getresponse()

    def post(self, body: dict[str, Any]) -> bytes:
        response = self._send(body)
        data = response.read()
        assert response.status == 200, data
        return data

    def lines(self, body: dict[str, Any]) -> Iterator[str]:
        response = self._send(body)
        assert response.status == 200
        for raw in iter(response.readline, b""):
            yield raw.decode().rstrip("\r\n")

    def close(self) -> None:
        self.conn.close()


class HttpxClient:
    """httpx2 (or httpx): one Client, so one keep-alive connection for the whole run."""

    def __init__(self, port: int, module: Any) -> None:
        self.client = module.Client(base_url=f"http://{HOST}:{port}", timeout=30)

    def post(self, body: dict[str, Any]) -> bytes:
        response = self.client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return bytes(response.content)

    def lines(self, body: dict[str, Any]) -> Iterator[str]:
        with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            yield from response.iter_lines()

    def close(self) -> None:
        self.client.close()


def httpx_module() -> Any | None:
    for name in ("httpx2", "httpx"):
        try:
            return __import__(name)
        except ImportError:
            continue
    return None


def client_for(port: int) -> PlainClient | HttpxClient:
    module = httpx_module()
    return PlainClient(port) if module is None else HttpxClient(port, module)


def client_name() -> str:
    module = httpx_module()
    return PlainClient.name if module is None else f"{module.__name__} {metadata.version(module.__name__)}"


def stream_once(client: PlainClient | HttpxClient) -> tuple[float, float]:
    """One streamed request: seconds to the first event and to the end of the stream."""
    began = time.perf_counter()
    first, events, done = 0.0, 0, False
    for line in client.lines({**CHAT, "stream": True}):
        if not line.startswith("data:"):
            continue
        if not events:
            first = time.perf_counter() - began
        events += 1
        done = line[5:].strip() == "[DONE]"
    total = time.perf_counter() - began
    assert events == EVENTS + 1 and done, (events, done)
    return first, total


def import_run(variant: str) -> dict[str, float]:
    """A fresh interpreter that imports the variant's stack and reports the time and module count."""
    code = (
        "import sys, time; n = len(sys.modules); t = time.perf_counter()\n"
        f"import {STACKS[variant]}\n"
        "print(time.perf_counter() - t, len(sys.modules) - n)"
    )
    out = run_python(code).split()
    return {"import ms": float(out[0]) * 1e3, "modules imported": float(out[1])}


def server_run(variant: str) -> dict[str, float]:
    """A fresh server process: start to /health, non-streamed latency, streams, RSS."""
    port = free_port()
    began = time.perf_counter()
    command = [sys.executable, "-m", "engine.bench.server_frameworks", "--serve", variant, "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT)
    out: dict[str, float] = {}
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server {variant} exited with {server.returncode}")
            if time.perf_counter() - began > 60:
                raise RuntimeError(f"server {variant} did not answer /health in 60 s")
            probe = http.client.HTTPConnection(HOST, port, timeout=5)
            try:
                probe.request("GET", "/health")
                if probe.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.005)
            finally:
                probe.close()
        out["start to /health ms"] = (time.perf_counter() - began) * 1e3
        out["RSS at /health MB"] = rss_mb(server.pid)
        client = client_for(port)
        try:
            latencies = []
            for _ in range(REQUESTS):
                began = time.perf_counter()
                reply = json.loads(client.post(CHAT))
                latencies.append((time.perf_counter() - began) * 1e3)
            assert reply["choices"][0]["message"]["content"] == "Hi.", reply
            out["first request ms"] = latencies[0]
            out["request p50 ms"] = percentile(latencies, 50)
            out["request p95 ms"] = percentile(latencies, 95)
            streams = [stream_once(client) for _ in range(STREAMS)]
            out["stream first event ms"] = median(first for first, _ in streams) * 1e3
            out[f"stream {EVENTS} events ms"] = median(total for _, total in streams) * 1e3
        finally:
            client.close()
        out["RSS after requests MB"] = rss_mb(server.pid)
    finally:
        stop(server, signal.SIGTERM, 10)
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> set[str]:
    """The installed distributions that names require, themselves included, leaving out optional extras."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for requirement in requires:
            if "extra ==" in requirement.partition(";")[2]:
                continue
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
            if match:
                todo.append(match.group())
    return seen


def installed_bytes(name: str) -> int:
    """The bytes of the files a distribution installed in site-packages, from its RECORD."""
    dist = metadata.distribution(name)
    paths = [Path(str(dist.locate_file(f))) for f in dist.files or [] if ".." not in Path(str(f)).parts]
    return sum(path.stat().st_size for path in paths if path.is_file())


def install_facts() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    base = closure(["starlette", "sse-starlette", "uvicorn"])
    extra = sorted(closure(["fastapi"]) - base)
    return {
        "python": sys.version.split()[0],
        "versions": versions,
        "fastapi requires": [r for r in metadata.requires("fastapi") or [] if "extra ==" not in r],
        "starlette stack": {name: installed_bytes(name) for name in sorted(base)},
        "fastapi adds": {name: {"version": metadata.version(name), "bytes": installed_bytes(name)} for name in extra},
    }


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rounds", nargs="?", type=int, default=15)
    parser.add_argument("--out", default=None, help="where to write the JSON (bench/results/server_frameworks.json)")
    parser.add_argument("--serve", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return

    facts = install_facts()
    for variant in VARIANTS:  # warm the page cache and the bytecode before anything is timed
        import_run(variant)
    began = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    steps: list[Callable[[str], dict[str, float]]] = [import_run, server_run]
    for _ in range(args.rounds):
        parts: dict[str, dict[str, float]] = {variant: {} for variant in VARIANTS}
        for step in steps:
            for variant in VARIANTS:
                parts[variant].update(step(variant))
        for variant in VARIANTS:
            runs[variant].append(parts[variant])
    wall = time.perf_counter() - began
    summary = {v: {key: summarize([run[key] for run in runs[v]]) for key in runs[v][0]} for v in VARIANTS}

    print(f"{args.rounds} rounds, A/B interleaved, {wall:.0f} s; python {facts['python']}, client {client_name()}")
    print(", ".join(f"{name} {version}" for name, version in facts["versions"].items() if version))
    body = []
    for key in summary["A"]:
        a, b = ([run[key] for run in runs[v]] for v in ("A", "B"))
        body.append([key, spread(a, "{:.2f}"), spread(b, "{:.2f}"), f"{median(b) / median(a):.2f}"])
    print("\n" + markdown_table(["measure", f"A: {VARIANTS['A']}", f"B: {VARIANTS['B']}", "B/A"], body))
    adds = facts["fastapi adds"]
    total = sum(row["bytes"] for row in adds.values())
    print(f"\nFastAPI requires (no extras): {', '.join(facts['fastapi requires'])}")
    print(f"FastAPI adds {len(adds)} packages, {total / 2**20:.1f} MiB, on top of starlette + sse-starlette + uvicorn:")
    for name, row in adds.items():
        print(f"  {name} {row['version']}: {row['bytes'] / 2**20:.2f} MiB")
    base = sum(facts["starlette stack"].values())
    print(f"(starlette + sse-starlette + uvicorn and their requirements: {base / 2**20:.1f} MiB)")

    record = {"rounds": args.rounds, "client": client_name(), "wall s": wall, **facts, "summary": summary, "runs": runs}
    print(f"\nwrote {save('server_frameworks', record, args.out)}")


if __name__ == "__main__":
    main()
