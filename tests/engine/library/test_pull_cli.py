"""A user downloads a model with `brisk models pull`, sees it listed, and chats with it offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.model.source import bundled_model_path
from tests.support.brisk_cli import brisk
from tests.support.model_library import link_or_copy, write_gguf

REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"


@pytest.fixture(scope="module")
def bundled_converted() -> Path:
    """The bundled GGUF converted in this run's data folder (before a test's own folder is set): once a run, the
    copy the bundled engine tests load too."""
    from engine.model.source import converted_dir

    return converted_dir(bundled_model_path(), lambda _f, _m: None)


@pytest.mark.bundled
def test_pull_list_and_chat_offline(
    bundled_converted: Path,
    empty_hub,  # noqa: ANN001
    library_home: Path,
    brisk_data_dir: Path,
    tmp_path: Path,
) -> None:
    other = write_gguf(tmp_path / "q8.gguf", "llama").read_bytes()
    empty_hub.add_repo(
        REPO,
        {
            "SmolLM2-135M-Instruct-Q4_1.gguf": bundled_model_path().read_bytes(),
            "SmolLM2-135M-Instruct-Q8_0.gguf": other,
            "README.md": b"# SmolLM2 GGUF\n",
        },
    )
    pulled = brisk("models", "pull", REPO, "--quant", "q4_1", "--json", offline=False)
    assert pulled.returncode == 0, pulled.stderr
    events = [json.loads(line) for line in pulled.stdout.splitlines()]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and progress[-1]["done_bytes"] == progress[-1]["total_bytes"] == bundled_model_path().stat().st_size
    done = events[-1]
    assert done["type"] == "pulled" and done["files"] == ["SmolLM2-135M-Instruct-Q4_1.gguf"]

    listed = brisk("models", "--json", offline=True)
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

    # The pulled file is the bundled one byte for byte: its conversion (this run's, linked in) is found by its
    # sha256, as a second Brisk finds the first one's; converting is test_model_loading's business, not this one's.
    for file in bundled_converted.iterdir():
        if file.is_file():
            link_or_copy(file, brisk_data_dir / "cache" / "models" / bundled_converted.name / file.name)
    # --quant none --dtype float32: a first load otherwise times every weight mode and both precisions (minutes
    # of CPU on two busy cores), no part of this
    reply = brisk("--model", f"{REPO}/SmolLM2-135M-Instruct-Q4_1.gguf", "ask", "Say hello.", "--max-tokens", "8",
                  "--quant", "none", "--dtype", "float32", "--json", offline=True)  # fmt: skip
    assert reply.returncode == 0, reply.stderr
    finished = [json.loads(line) for line in reply.stdout.splitlines() if '"done"' in line]
    assert finished and finished[-1]["text"].strip()


def test_pull_says_why_not_when_offline(library_home: Path) -> None:
    refused = brisk("models", "pull", REPO, offline=True)
    assert refused.returncode != 0
    assert "offline" in refused.stderr.lower()
