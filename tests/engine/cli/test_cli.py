"""The headless CLI contract: ``brisk ask`` / ``brisk chat`` with ``--json``, exit codes, errors."""

from __future__ import annotations

from pathlib import Path

from tests.support.brisk_cli import brisk, events


def test_ask_json_contract(tiny_dir: Path) -> None:
    # a child: the whole process, its start, its output flushed before its fast exit, its exit code
    run = brisk(
        "ask", "hello there", "--model", str(tiny_dir), "--json", "--max-tokens", "12", "--speculative", "lookup",
        child=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    evs = events(run.stdout)
    assert all("type" in e and isinstance(e["t"], float) for e in evs)
    assert evs[0]["type"] == "started"
    tokens = [e for e in evs if e["type"] == "token"]
    assert tokens and all(isinstance(e["ids"], list) and isinstance(e["draft"], bool) for e in tokens)
    done = evs[-1]
    assert done["type"] == "done"
    assert done["text"] == "".join(e["text"] for e in tokens)
    for key in ("prompt_tokens", "cached_tokens", "prefill_s", "ttft_s", "drafted", "accepted"):
        assert key in done["metrics"], key
    times = [e["t"] for e in evs]
    assert times == sorted(times)


def test_chat_keeps_the_conversation_and_its_cache(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "chat", "--model", str(tiny_dir), "--json", "--max-tokens", "8", "--system", "Be brief.",
        stdin="first question\n\nsecond question\n", data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    dones = [e for e in events(run.stdout) if e["type"] == "done"]
    assert len(dones) == 2, "the blank line is skipped; two replies"
    first, second = (d["metrics"] for d in dones)
    assert second["prompt_tokens"] > first["prompt_tokens"], "the second prompt holds the first turn"
    assert second["cached_tokens"] >= first["prompt_tokens"] - 2, "the first turn's KV is reused"


def test_no_prefix_cache_flag(tiny_dir: Path, tmp_path: Path) -> None:
    run = brisk(
        "chat", "--model", str(tiny_dir), "--json", "--max-tokens", "4", "--no-prefix-cache",
        stdin="one\ntwo\n", data_dir=str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert all(e["metrics"]["cached_tokens"] == 0 for e in events(run.stdout) if e["type"] == "done")


def test_system_prompt_from_file(tiny_dir: Path, tmp_path: Path) -> None:
    system = tmp_path / "system.txt"
    system.write_text("You are a pirate.")
    run = brisk("ask", "hi", "--model", str(tiny_dir), "--json", "--max-tokens", "2", "--system", f"@{system}")
    assert run.returncode == 0, run.stderr
    assert events(run.stdout)[0]["prompt_tokens"] > 20


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    run = brisk("ask", "hi", "--model", str(tmp_path / "missing.gguf"), "--json")
    assert run.returncode != 0
    err = events(run.stdout)[-1]
    assert err["type"] == "error" and "not found" in err["message"]


def test_non_model_file_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"\x00" * 100)
    run = brisk("ask", "hi", "--model", str(bogus))
    assert run.returncode != 0
    assert "not a GGUF model" in run.stderr


def test_empty_message_is_refused(tiny_dir: Path) -> None:
    run = brisk("ask", "   ", "--model", str(tiny_dir), "--json")
    assert run.returncode != 0
    assert "empty" in events(run.stdout)[-1]["message"]


def test_unavailable_draft_quantization_fails_with_the_reason(tiny_dir: Path) -> None:
    run = brisk("ask", "hi", "--model", str(tiny_dir), "--draft-model", str(tiny_dir), "--draft-quant", "int3-cpu")
    assert run.returncode != 0
    assert "int3-cpu" in run.stderr and "choose one of" in run.stderr


def test_draft_source_without_draft_model_fails(tiny_dir: Path) -> None:
    run = brisk("ask", "hi", "--model", str(tiny_dir), "--json", "--speculative", "draft")
    assert run.returncode != 0
    assert "draft model" in events(run.stdout)[-1]["message"]


def test_version_names_the_commit() -> None:
    done = brisk("--version", child=True)  # `python -m app.cli` starts
    assert done.returncode == 0 and done.stdout.startswith("Brisk ") and "commit" in done.stdout
