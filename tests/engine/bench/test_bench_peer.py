"""``brisk bench --peer URL``: the replay server as a peer column beside the local tiny model; bad peers fail fast."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.bench import PEER_SCENARIOS, connect_peer, peer_comparison
from engine.cli import build_parser
from tests.support.brisk_cli import brisk
from tests.support.streams.replay import ReplayServer


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    s = ReplayServer()
    yield s
    s.close()


def test_the_table_has_the_peer_as_a_column(
    server: ReplayServer, tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(["bench", "foundation", "--peer", server.url, "--model", str(tiny_dir)])
    assert args.runs >= 2  # peer_comparison does runs // 2 rounds of three prompts
    peer = connect_peer(args)
    try:
        data = peer_comparison("foundation", args, peer)
    finally:
        peer.close()
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| measure"))
    assert "brisk (local)" in header and f"peer (SmolLM2-135M-Instruct-Q8_0.gguf at {server.url})" in header
    for measure in ("TTFT cold, ms", "TTFT warm, ms", "decode tok/s"):
        assert any(line.startswith(f"| {measure}") for line in out.splitlines()), measure
    for side in ("local", "peer"):
        numbers = data[side]
        assert numbers["samples"] == 3 * (args.runs // 2)
        assert numbers["ttft_cold_ms"] > 0 and numbers["ttft_warm_ms"] > 0 and numbers["decode_tok_s"] > 0
    # the peer got the same requests: greedy, a system prompt with a new nonce for each cold/warm pair
    bodies = server.requests
    assert len(bodies) == 2 * data["peer"]["samples"]
    assert all(b["temperature"] == 0 and b["repeat_penalty"] == 1.0 for b in bodies), "plain greedy on the peer"
    assert bodies[0]["messages"] == bodies[1]["messages"] != bodies[2]["messages"]
    assert bodies[0]["messages"][0]["content"].endswith(PEER_SCENARIOS["foundation"])


def test_a_bad_peer_fails_before_the_local_runs() -> None:
    run = brisk("bench", "foundation", "--peer", "ftp://127.0.0.1/v1")
    assert run.returncode == 2 and "cannot use the peer" in run.stderr and "http:// or https://" in run.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nothing listens there
    run = brisk("bench", "prefix", "--peer", f"http://127.0.0.1:{port}/v1", "--api-key", "sk-never-printed-123")
    assert run.returncode == 2 and "Connection refused" in run.stderr
    assert "sk-never-printed" not in run.stdout + run.stderr
    assert "Model load" not in run.stdout and "TTFT" not in run.stdout, "no local scenario ran"


def test_versus_puts_brisk_defaults_beside_the_peer(
    server: ReplayServer, tiny_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.bench import versus

    monkeypatch.setattr(versus, "LONG_SYSTEM", "Answer briefly.")  # the tiny model's context is short

    args = build_parser().parse_args(
        ["bench", "versus", "--peer", server.url, "--model", str(tiny_dir), "--runs", "1", "--max-tokens", "4"]
        + ["--quant", "none", "--dtype", "float32"]  # no probes: the tiny model's choice is not what is tested
        + ["--draft-model", str(tiny_dir)]  # the model drafting for itself: every draft accepted
    )
    data = versus.run(args)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| measure"))
    assert "brisk (as installed: auto)" in header and "brisk (speculation off)" in header
    assert "peer (SmolLM2-135M-Instruct-Q8_0.gguf)" in header
    measures = ("decode tok/s, open", "decode tok/s, grounded", "first question of a new process", "TTFT cold")
    for measure in (*measures, "TTFT warm"):
        assert any(line.startswith(f"| {measure}") for line in out.splitlines()), measure
    assert len(versus.OPEN) >= 8 and len(set(versus.OPEN.values())) == len(versus.OPEN)
    peer = data["samples"][data["peer"]]
    assert len(peer["open"]) == len(versus.OPEN) and len(peer["ttft_cold_ms"]) == 3
    assert len(peer["first_ttft_ms"]) == 1
    for column in ("brisk (as installed: auto)", "brisk (speculation off)"):  # each a new `brisk ask` process
        first = data["samples"][column]
        assert len(first["first_ttft_ms"]) == 1 and first["first_ttft_ms"][0] > 0
    assert any(row["prompt"] == "open: recipe" for row in data["per_prompt"])
    drafted = data["samples"][f"brisk (draft: {tiny_dir.name})"]  # the draft model's column and its acceptance
    assert len(drafted["open"]) == len(versus.OPEN) and drafted["open acceptance"]
    # drafting pauses where it does not pay (timing-dependent), so a grounded prompt may draft nothing
    accepted = drafted["open acceptance"] + drafted.get("grounded acceptance", [])
    assert min(accepted) == 100.0
    assert len(drafted["open drafted"]) == len(versus.OPEN) and max(drafted["open drafted"]) > 0
    assert any(line.startswith("| draft acceptance %, open prompts") for line in out.splitlines())
    # the peer decodes plain greedy, as Brisk does: temperature 0 and no repetition penalty, bounded replies
    bodies = server.requests
    assert bodies and all(b["temperature"] == 0 and b["repeat_penalty"] == 1.0 for b in bodies)
    assert {b["max_tokens"] for b in bodies} == {4, 16}
    local = data["samples"]["brisk (as installed: auto)"]
    assert all(v > 0 for v in local["open"] + local["grounded"] + local["ttft_cold_ms"])
