"""A local engine in a child process, for a benchmark column beside the engine under test.

Two engines in one process slow each other even while one is idle: each
engine thread that ran a parallel torch op keeps an OpenMP team, and with more
team threads than cores libgomp stops spinning at its barriers.  Measured on
2 cores (fp16-cpu, speculation off, four open prompts, 128 tokens): 86-94
tok/s alone, 58-70 with an idle q8-cpu engine loaded beside it, 94-98 once
that engine closed.  So a second local column (``brisk bench versus
--also-quant``) runs here, in its own process, and the columns keep their
interleaving.

:class:`ChildEngine` offers what the bench calls on a :class:`~engine.client.Client`:
``load(spec)``, ``ask(messages, sampling, **fields)`` (returns an object with
``metrics.tokens_per_s``, ``metrics.ttft_s`` and ``metrics.acceptance``) and ``close()``.  Requests and
replies are JSON lines on the child's stdin and a private copy of its stdout;
everything else the child prints goes to its stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

from engine.api import AnswerCacheSettings, ModelSpec, Sampling

METRICS = ("tokens_per_s", "ttft_s", "acceptance", "drafted")  # what a reply brings back of its Done


class ChildEngine:
    def __init__(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.bench.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark's child engine ended (exit {self.proc.poll()}); see its messages above")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the benchmark's child engine failed: {reply['error']}")
        return dict(reply)

    def load(self, spec: ModelSpec) -> SimpleNamespace:
        reply = self._call({"op": "load", "spec": dataclasses.asdict(spec)})
        return SimpleNamespace(model_name=reply["model"], info=SimpleNamespace(quant=reply["quant"]))

    def ask(self, messages: list[dict[str, str]], sampling: Sampling, **fields: Any) -> SimpleNamespace:
        message = {"op": "ask", "messages": list(messages), "sampling": dataclasses.asdict(sampling), "fields": fields}
        reply = self._call(message)
        metrics = {key: reply.get(key) for key in METRICS}
        return SimpleNamespace(metrics=SimpleNamespace(**metrics))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def serve() -> int:
    """The child: one engine, one JSON request per line of stdin, one JSON reply per line on the saved stdout."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else prints goes to stderr, never into the replies
    from engine.client import Client, local_backend

    client = Client(local_backend(answer_cache=AnswerCacheSettings(enabled=False)))
    try:
        for line in sys.stdin:
            message = json.loads(line)
            reply: dict[str, Any]
            try:
                if message["op"] == "load":
                    spec = message["spec"]
                    loaded = client.load(ModelSpec(**spec))
                    reply = {"model": loaded.model_name, "quant": loaded.info.quant}
                else:
                    sampling = message["sampling"]
                    sampling["stop"] = tuple(sampling.get("stop", ()))
                    done = client.ask(message["messages"], Sampling(**sampling), **message["fields"])
                    reply = {key: getattr(done.metrics, key) for key in METRICS}
            except Exception as exc:  # noqa: BLE001 (said to the parent, which stops)
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
