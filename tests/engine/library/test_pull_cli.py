"""A user downloads a model with `brisk models pull`, sees it listed, and chats with it offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model.source import bundled_model_path
from tests.support import ROOT
from tests.support.model_library import write_gguf

REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"


def run(*args: str, offline: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.bundled
def test_pull_list_and_chat_offline(empty_hub, library_home: Path, tmp_path: Path) -> None:  # noqa: ANN001
    other = write_gguf(tmp_path / "q8.gguf", "llama").read_bytes()
    empty_hub.add_repo(
        REPO,
        {
            "SmolLM2-135M-Instruct-Q4_1.gguf": bundled_model_path().read_bytes(),
            "SmolLM2-135M-Instruct-Q8_0.gguf": other,
            "README.md": b"# SmolLM2 GGUF\n",
        },
    )
    pulled = run("models", "pull", REPO, "--quant", "q4_1", "--json", offline=False)
    assert pulled.returncode == 0, pulled.stderr
    events = [json.loads(line) for line in pulled.stdout.splitlines()]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and progress[-1]["done_bytes"] == progress[-1]["total_bytes"] == bundled_model_path().stat().st_size
    done = events[-1]
    assert done["type"] == "pulled" and done["files"] == ["SmolLM2-135M-Instruct-Q4_1.gguf"]

    listed = run("models", "--json", offline=True)
    rows = {r["name"]: r for r in map(json.loads, listed.stdout.splitlines())}
    row = rows[f"{REPO}/SmolLM2-135M-Instruct-Q4_1.gguf"]
    assert (row["source"], row["architecture"], row["quant"], row["fast_path"]) == (
        "huggingface",
        "llama",
        "Q4_1",
        True,
    )
    assert row["path"] == done["path"]
    assert not any("Q8_0" in name for name in rows)  # only the file asked for came down

    reply = run("--model", f"{REPO}/SmolLM2-135M-Instruct-Q4_1.gguf", "ask", "Say hello.", "--max-tokens", "8",
                "--json", offline=True)  # fmt: skip
    assert reply.returncode == 0, reply.stderr
    finished = [json.loads(line) for line in reply.stdout.splitlines() if '"done"' in line]
    assert finished and finished[-1]["text"].strip()


def test_pull_says_why_not_when_offline(library_home: Path) -> None:
    refused = run("models", "pull", REPO, offline=True)
    assert refused.returncode != 0
    assert "offline" in refused.stderr.lower()
