"""The answer cache through the real CLI: it persists in BRISK_DATA_DIR between processes, greedy replies only."""

from __future__ import annotations

from pathlib import Path

from tests.support.brisk_cli import brisk, events

QUESTION = "What is the capital of France?"


def done_of(run: object) -> dict:
    assert run.returncode == 0, run.stderr  # type: ignore[attr-defined]
    last = events(run.stdout)[-1]  # type: ignore[attr-defined]
    assert last["type"] == "done"
    return last


def test_a_repeated_greedy_question_is_answered_from_the_cache(tiny_dir: Path, tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    # quant and dtype pinned: "auto" measures again after a noisy probe (a busy machine) and may load another
    # mode, and each of the seven starts would measure float32 against bfloat16 again while the CPU is shared
    ask = ("ask", QUESTION, "--model", str(tiny_dir), "--quant", "none", "--dtype", "float32", "--max-tokens", "6")
    first = done_of(brisk(*ask, "--json", data_dir=data))
    assert first["metrics"]["answer_cache"] is None and first["metrics"]["prompt_tokens"] > 0

    second = done_of(brisk(*ask, "--json", data_dir=data, child=True))  # another process, the same data folder
    m = second["metrics"]
    assert m["answer_cache"] == "exact" and second["text"] == first["text"]
    assert m["similarity"] is None or m["similarity"] >= 0.99
    assert "cached_question" in m and "saved_s" in m

    text = brisk(*ask, data_dir=data)  # without --json: the reply, and where it came from on stderr
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() == first["text"].strip() and "from the answer cache" in text.stderr

    for flag in (("--no-answer-cache",), ("--fresh",), ("--temperature", "0.8", "--seed", "1")):
        again = done_of(brisk(*ask, "--json", *flag, data_dir=data))
        assert again["metrics"]["answer_cache"] is None, flag
        assert again["metrics"]["prompt_tokens"] > 0, f"{flag}: the model computed this reply"
