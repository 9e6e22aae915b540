"""`brisk models` over other apps' folders holding strangers' files: the real command line in a child process
(``run_cli``) with a HOME of its own, so LM Studio's, Ollama's and the user's folders are the test's.

One bad file is one listed problem and every other model still lists; ``brisk models add`` refuses ``/``,
``/proc``, ``/sys``, ``/dev`` and links to them; a walk follows no link out of the folder it walks, visits each
folder once, and says where it stopped. Each case checks the exit status, no traceback and a bounded time.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from engine.bench.tiny import write_gguf
from tests.hostile.conftest import Run, run_cli
from tests.support.model_library import ollama_add

EXIT_REQUEST = 3


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def env_of(home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "OLLAMA_MODELS": str(home / "ollama"),
        "XDG_DATA_HOME": str(home / "share"),
        "XDG_CACHE_HOME": str(home / "cache"),
    }


def models(home: Path, data: Path, *args: str) -> Run:
    return run_cli("models", *args, data_dir=data, env=env_of(home), timeout=60)


def listed(home: Path, data: Path) -> dict[str, dict[str, object]]:
    """``brisk models --json`` by name, after checking that it ran clean."""
    run = models(home, data, "--json")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.elapsed < 30
    return {row["name"]: row for row in map(json.loads, run.stdout.splitlines())}


def gguf_bytes(*entries: tuple[str, int, bytes]) -> bytes:
    """A GGUF v3 file with no tensors and these (key, value type, packed value) entries."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries))
    for key, kind, value in entries:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out + bytes(64)


def text(value: str) -> bytes:
    return struct.pack("<Q", len(value.encode())) + value.encode()


ARCH = ("general.architecture", 8, text("llama"))
NESTED = struct.pack("<IQ", 9, 1) * 100_000 + struct.pack("<IQ", 4, 0)  # arrays of arrays, 100,000 deep
BAD_GGUFS = {
    "context-is-text": gguf_bytes(ARCH, ("llama.context_length", 8, text("long"))),
    "context-is-nan": gguf_bytes(ARCH, ("llama.context_length", 6, struct.pack("<f", float("nan")))),
    "context-is-inf": gguf_bytes(ARCH, ("llama.context_length", 6, struct.pack("<f", float("inf")))),
    "heads-are-a-list": gguf_bytes(ARCH, ("llama.attention.head_count", 9, struct.pack("<IQIQ", 9, 1, 4, 0))),
    "nested-arrays": gguf_bytes(ARCH, ("general.tags", 9, NESTED)),
    "tokens-past-the-end": gguf_bytes(ARCH, ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**60))),
}


def test_bad_gguf_headers_are_each_one_problem(home: Path, data: Path) -> None:
    folder = home / ".lmstudio" / "models" / "someone" / "Mixed-GGUF"
    write_gguf(folder / "good-Q4_K_M.gguf", "qwen2")
    for name, raw in BAD_GGUFS.items():
        (folder / f"{name}.gguf").write_bytes(raw)
    rows = listed(home, data)
    assert not rows["someone/Mixed-GGUF/good-Q4_K_M"]["problem"]
    assert rows["someone/Mixed-GGUF/good-Q4_K_M"]["architecture"] == "qwen2"
    for name in BAD_GGUFS:
        problem = str(rows[f"someone/Mixed-GGUF/{name}"]["problem"])
        assert f"{name}.gguf" in problem and "\n" not in problem and len(problem) < 400, problem


def deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(
    ("manifest", "said"),
    [
        (deep(200_000), "cannot be read"),
        ('{"layers": ' * 100_000 + "[]" + "}" * 100_000, "cannot be read"),
        (" " * (2 << 20) + "{}", "cannot be read"),
        ('{"layers": 5}', "cannot be read"),
        ('{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}',
         "names no model layer"),
        ("\udcff not text", "cannot be read"),
    ],
    ids=["list-200000-deep", "object-100000-deep", "2-MB", "layers-not-a-list", "digest-is-a-path", "not-utf8"],
)  # fmt: skip
def test_a_bad_ollama_manifest_is_one_problem(home: Path, data: Path, manifest: str, said: str) -> None:
    ollama = home / "ollama"
    ollama_add(ollama, "good", "1b", write_gguf(home / "src" / "good.gguf", "qwen2"))
    bad = ollama_add(ollama, "bad", "latest", None)
    bad.write_bytes(manifest.encode("utf-8", errors="surrogateescape"))
    rows = listed(home, data)
    assert not rows["good:1b"]["problem"] and rows["good:1b"]["architecture"] == "qwen2"
    assert said in str(rows["bad:latest"]["problem"])


def test_an_ollama_folder_that_leads_into_proc_is_not_read(home: Path, data: Path) -> None:
    (home / "ollama").mkdir()
    (home / "ollama" / "manifests").symlink_to("/proc")
    rows = listed(home, data)
    assert [r for r in rows.values() if r["source"] == "ollama"] == []


def test_an_unreadable_link_among_ollama_manifests_hides_no_model(home: Path, data: Path) -> None:
    try:
        os.stat("/proc/1/cwd")
        pytest.skip("this machine lets the test look at /proc/1/cwd, so the link is readable")
    except PermissionError:
        pass
    ollama = home / "ollama"
    ollama_add(ollama, "good", "1b", write_gguf(home / "src" / "good.gguf", "qwen2"))
    (ollama / "manifests" / "registry.ollama.ai" / "library" / "evil").symlink_to("/proc/1/cwd")
    rows = listed(home, data)
    assert not rows["good:1b"]["problem"]


def test_bad_model_folders_are_each_one_problem(home: Path, data: Path) -> None:
    mine = home / "mine"
    (mine / "deep-config").mkdir(parents=True)
    (mine / "deep-config" / "config.json").write_text(deep(100_000))
    (mine / "deep-config" / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    (mine / "text-sizes").mkdir()
    (mine / "text-sizes" / "config.json").write_text('{"model_type": "llama", "hidden_size": "wide"}')
    (mine / "text-sizes" / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    (mine / "deep-header").mkdir()
    (mine / "deep-header" / "config.json").write_text('{"model_type": "llama"}')
    header = ('{"w": ' * 50_000 + "1" + "}" * 50_000).encode()
    (mine / "deep-header" / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    write_gguf(mine / "good.gguf", "qwen2")
    assert models(home, data, "add", str(mine)).returncode == 0
    rows = listed(home, data)
    assert not rows["mine/good"]["problem"]
    assert "no readable config.json" in str(rows["mine/deep-config"]["problem"])
    assert "damaged header" in str(rows["mine/text-sizes"]["problem"])
    assert "damaged header" in str(rows["mine/deep-header"]["problem"])


@pytest.mark.parametrize("folder", ["/", "/proc", "/proc/self/cwd", "/proc/1", "/sys", "/sys/class", "/dev", "/dev/shm",
                                    "/tmp/../proc", "link-to-proc"])  # fmt: skip
def test_system_folders_are_refused(home: Path, data: Path, tmp_path: Path, folder: str) -> None:
    if folder == "link-to-proc":
        folder = str(tmp_path / "link-to-proc")
        os.symlink("/proc", folder)
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} is not on this machine")
    run = models(home, data, "add", folder)
    assert run.returncode == EXIT_REQUEST, (run.stdout, run.stderr)
    assert run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "system folder" in run.stderr or "root of the file system" in run.stderr
    settings = data / "settings.json"
    assert not settings.exists() or json.loads(settings.read_text())["model_folders"] == []


def test_a_system_folder_in_the_settings_is_listed_not_walked(home: Path, data: Path) -> None:
    mine = home / "mine"
    write_gguf(mine / "good.gguf", "qwen2")
    assert models(home, data, "add", str(mine)).returncode == 0
    settings = json.loads((data / "settings.json").read_text())
    settings["model_folders"] = ["/proc", "/", str(mine)]  # written by hand, or by an older Brisk
    (data / "settings.json").write_text(json.dumps(settings))
    rows = listed(home, data)
    assert "system folder" in str(rows["/proc"]["problem"]) and "brisk models remove /proc" in str(rows["/proc"])
    assert "root of the file system" in str(rows["/"]["problem"])
    assert not rows["mine/good"]["problem"]
    assert [r["path"] for r in rows.values() if r["source"] == "folder" and str(r["path"]).startswith("/proc/")] == []
    removed = models(home, data, "remove", "/proc")
    assert removed.returncode == 0, removed.stderr
    assert "/proc" not in json.loads((data / "settings.json").read_text())["model_folders"]


def test_links_out_of_the_folder_are_not_followed(home: Path, data: Path, tmp_path: Path) -> None:
    mine = home / "mine"
    write_gguf(mine / "inside" / "good.gguf", "qwen2")
    outside = tmp_path / "outside"
    write_gguf(outside / "stranger.gguf", "qwen2")
    (mine / "to-outside").symlink_to(outside)
    (mine / "to-proc").symlink_to("/proc")
    (mine / "to-proc-file.gguf").symlink_to("/proc/self/environ")
    (mine / "loop").symlink_to(mine)  # a folder linking to itself: walked once
    (mine / "inside" / "again").symlink_to(mine / "inside")
    (mine / "alias").symlink_to(mine / "inside")  # a link inside the folder is followed
    assert models(home, data, "add", str(mine)).returncode == 0
    rows = listed(home, data)
    paths = [os.path.realpath(str(r["path"])) for r in rows.values() if r["source"] == "folder"]
    assert paths == [os.path.realpath(mine / "inside" / "good.gguf")]
    assert not any("stranger" in name or "proc" in name for name in rows)


def test_a_folder_of_too_many_names_stops_and_says_so(home: Path, data: Path) -> None:
    mine = home / "crowded"
    mine.mkdir()
    for i in range(20_500):
        (mine / f"note-{i:05d}.txt").touch()
    assert models(home, data, "add", str(mine)).returncode == 0
    rows = listed(home, data)
    stopped = rows[str(mine)]
    assert "stopped looking in" in str(stopped["problem"]) and "20,000" in str(stopped["problem"])
