"""Hostile reply formats: schemas, regexes and grammars that crashed llguidance or never finished.

Each is refused in one sentence before the model loads (``brisk ask``: exit 3, no model converted into
the data folder) or before the engine sees it (``brisk serve``, a real child process on a free port: a
400 naming ``response_format`` or ``tools``), and the server keeps answering after each.  Before the
bounds (``engine.runtime.format_limits``) the 3,000-link ``$ref`` chain ended both with SIGSEGV.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.cli import EXIT_REQUEST
from tests.hostile.conftest import BRISK, run_cli
from tests.support import ROOT

LINKS = 3_000  # the chain that crashed (2,300 plain links fit in 8 MB of stack; 1,400 object links)


def ref_chain(links: int = LINKS, link: str = "plain") -> dict[str, Any]:
    """A schema whose ``$defs`` form a chain of ``links`` ``$ref`` links (about 100 KB for 3,000)."""

    def step(i: int) -> dict[str, Any]:
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        return ref if link == "plain" else {"type": "object", "properties": {"a": ref}, "required": ["a"]}

    defs = {f"d{i}": step(i) for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


SELF_REF = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
SELF_REQUIRED = {
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}},
}
REPEATS = "(a{1000}){1000}"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def refused(run: Any, *words: str) -> None:
    """The CLI's exit for a bad request (3), in one sentence: no traceback, no signal."""
    assert run.returncode == EXIT_REQUEST, (run.returncode, run.stderr[-2000:])
    said = (run.stderr + run.stdout).strip()
    assert "Traceback" not in said and "llguidance" not in said.lower(), said[-2000:]
    assert len(said) < 600, said[:2000]  # a sentence, not a state dump
    for word in words:
        assert word in said, said


def no_model_loaded(data: Path) -> None:
    assert not (data / "cache" / "models").exists(), "the model was loaded before the format was checked"


# -- brisk ask ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "schema", "words"),
    [
        ("3,000-link $ref chain", ref_chain(), ("$ref", "128")),
        ("1,500-link chain of objects", ref_chain(1_500, "object"), ("$ref", "128")),
        ("self-referencing $defs", SELF_REF, ("no finite",)),
        ("object requiring itself", SELF_REQUIRED, ("no finite", "#/$defs/node")),
        ("pattern repeated a million times", {"type": "string", "pattern": REPEATS}, ("1,000,000",)),
    ],
)
def test_ask_refuses_a_hostile_schema_before_the_model_loads(
    data: Path, tmp_path: Path, name: str, schema: dict[str, Any], words: tuple[str, ...]
) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    run = run_cli("ask", "--json-schema", str(path), "Hello", data_dir=data, timeout=60)
    refused(run, *words)
    no_model_loaded(data)


def test_ask_refuses_repeats_and_endless_grammars(data: Path, tmp_path: Path) -> None:
    refused(run_cli("ask", "--regex", REPEATS, "Hello", data_dir=data, timeout=60), "1,000,000", "10,000")
    endless = tmp_path / "endless.lark"
    endless.write_text('start: a\na: "x" a\n')
    refused(run_cli("ask", "--grammar", str(endless), "Hello", data_dir=data, timeout=60), "no finite sentence")
    chain = tmp_path / "chain.lark"
    chain.write_text("start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(LINKS)) + f'r{LINKS}: "x"\n')
    refused(run_cli("ask", "--grammar", str(chain), "Hello", data_dir=data, timeout=60), "levels deep")
    no_model_loaded(data)


def test_ask_refuses_a_huge_or_bottomless_schema_file(data: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"type": "object", "description": "x" * 400_000}))
    refused(run_cli("ask", "--json-schema", str(big), "Hello", data_dir=data, timeout=60), "256 KB")
    deep = tmp_path / "deep.json"
    deep.write_text('{"type": "array", "items": ' * 5_000 + '{"type": "string"}' + "}" * 5_000)
    refused(run_cli("ask", "--json-schema", str(deep), "Hello", data_dir=data, timeout=60), "nested")
    no_model_loaded(data)


# -- brisk serve -------------------------------------------------------------------------------------------


class Server:
    """``brisk serve`` on the bundled model, a child process on a free loopback port."""

    def __init__(self, data: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*BRISK, "serve", "--port", str(self.port), "--quiet", "--quant", "none", "--dtype", "float32"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", BRISK_DATA_DIR=str(data))
        self.log = (data / "serve.log").open("w")
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.tail()
            try:
                if json.loads(self.get("/health")).get("status") == "ok":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        pytest.fail(f"brisk serve was not ready in 240 s: {self.tail()}")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return str(answer.read().decode())

    def chat(self, **body: Any) -> tuple[int, dict[str, Any]]:
        body.setdefault("messages", [{"role": "user", "content": "Name a city."}])
        body.setdefault("max_tokens", 16)
        request = urllib.request.Request(
            self.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-2000:]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    served = Server(tmp_path_factory.mktemp("serve-data"))
    yield served
    served.close()


def schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


def tool(schema: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]


@pytest.mark.parametrize(
    ("name", "field", "value", "words"),
    [
        ("3,000-link $ref chain", "response_format", schema_format(ref_chain()), "$ref"),
        ("1,500-link chain of objects", "response_format", schema_format(ref_chain(1_500, "object")), "$ref"),
        ("self-referencing $defs", "response_format", schema_format(SELF_REF), "no finite"),
        ("object requiring itself", "response_format", schema_format(SELF_REQUIRED), "no finite"),
        ("pattern repeated a million times", "response_format", schema_format({"pattern": REPEATS}), "1,000,000"),
        ("tool schema: 3,000-link chain", "tools", tool(ref_chain()), "tools[0]"),
        ("tool schema: requiring itself", "tools", tool(SELF_REQUIRED), "no finite"),
    ],
)
def test_serve_refuses_a_hostile_format_and_keeps_serving(
    server: Server, name: str, field: str, value: Any, words: str
) -> None:
    start = time.perf_counter()
    status, body = server.chat(**{field: value})
    elapsed = time.perf_counter() - start
    assert status == 400, (status, body)
    error = body["error"]
    assert error["param"] == field and words in error["message"], error
    assert len(error["message"]) < 300 and "\n" not in error["message"], error
    assert elapsed < 5, f"{name}: refused after {elapsed:.1f} s"
    assert server.process.poll() is None, server.tail()
    assert json.loads(server.get("/health"))["status"] == "ok"


def test_serve_still_holds_a_valid_schema(server: Server) -> None:
    status, body = server.chat(response_format=schema_format(CITY), max_tokens=24)
    assert status == 200, body
    reply = json.loads(body["choices"][0]["message"]["content"])
    assert isinstance(reply["city"], str) and reply["city"]
