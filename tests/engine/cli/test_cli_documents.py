"""``brisk ask --attach`` and ``brisk documents`` through the real command line: a document's KV is computed
by one process and read from disk by the next (the same greedy reply either way), bad files are named, and
the index lists and removes documents with their KV files."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.brisk_cli import brisk, events

NOTE = "The crane must be booked three days ahead. Visitor badges are orange. Backups stay ninety days.\n"


def ask(tiny_dir: Path, data: Path, question: str, *attach: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    flags = [arg for path in attach for arg in ("--attach", str(path))]
    out = brisk(
        "ask", question, "--model", str(tiny_dir), "--json", "--max-tokens", "10", "--no-answer-cache",
        *flags, *extra, data_dir=str(data),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return events(out.stdout)


def test_the_second_process_reads_the_document_kv_from_disk(tiny_dir: Path, tmp_path: Path) -> None:
    data, note = tmp_path / "data", tmp_path / "rules.md"
    note.write_text(NOTE, encoding="utf-8")
    first = [e for e in ask(tiny_dir, data, "How far ahead is the crane booked?", note) if e["type"] == "done"][0]
    assert first["metrics"]["document_tokens"] >= len(NOTE) and first["metrics"]["document_reused"] == 0
    assert [s["name"] for s in first["metrics"]["sources"]] == ["rules.md"]
    second = [e for e in ask(tiny_dir, data, "How far ahead is the crane booked?", note) if e["type"] == "done"][0]
    assert second["metrics"]["document_reused"] == second["metrics"]["document_tokens"] > 0
    assert second["text"] == first["text"]  # greedy: the reused KV gives the reply the computed one gave
    listed = [json.loads(line) for line in brisk("documents", "--json", data_dir=str(data)).stdout.splitlines()]
    assert [(d["name"], d["state"]) for d in listed] == [("rules.md", "indexed")] and listed[0]["kv_bytes"] > 0
    removed = brisk("documents", "remove", listed[0]["id"][:10], data_dir=str(data))
    assert removed.returncode == 0, removed.stderr
    assert brisk("documents", "--json", data_dir=str(data)).stdout.strip() == ""
    assert not list((data / "cache" / "kv").glob("documents-*/*.safetensors"))


def test_a_file_that_cannot_be_read_is_named_and_the_others_still_attached(tiny_dir: Path, tmp_path: Path) -> None:
    data, note, binary = tmp_path / "data", tmp_path / "rules.md", tmp_path / "photo.bin"
    note.write_text(NOTE, encoding="utf-8")
    binary.write_bytes(bytes(range(256)) * 8)
    out = ask(tiny_dir, data, "What colour are the badges?", note, binary, tmp_path / "missing.txt")
    warnings = [e["message"] for e in out if e["type"] == "warning" and e.get("kind") == "documents"]
    assert any("photo.bin" in w for w in warnings) and any("missing.txt" in w for w in warnings), warnings
    done = [e for e in out if e["type"] == "done"][0]
    assert [s["name"] for s in done["metrics"]["sources"]] == ["rules.md"]


def test_nothing_readable_stops_before_the_model_loads(tiny_dir: Path, tmp_path: Path) -> None:
    binary = tmp_path / "photo.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    out = brisk("ask", "hi", "--model", str(tiny_dir), "--attach", str(binary), data_dir=str(tmp_path / "d"))
    assert out.returncode != 0 and "photo.bin" in out.stderr and "None of the attached files" in out.stderr
