"""``engine.library.pull`` against a local fake hub (``tests/support/fake_hub.py``): no test reaches huggingface.co.

Each test gets a hub on a free port with ``HF_ENDPOINT`` pointing at it, offline mode off, and a hub cache of its own
in ``tmp_path``; what a pull leaves is checked with ``huggingface_hub.scan_cache_dir``, as the library's scan reads it.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import socket
import threading
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download, scan_cache_dir

from engine.library import pull as pull_module
from engine.library.pull import PullCancelled, PullError, PullProgress, choose_files, plan, pull
from tests.support.fake_hub import FakeHub

GGUF_REPO = "someone/Tiny-GGUF"
SPLIT_REPO = "someone/Big-GGUF"
ST_REPO = "someone/Tiny-Instruct"


def gguf(size: int, seed: int) -> bytes:
    return b"GGUF" + random.Random(seed).randbytes(size - 4)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


TINY = {
    "README.md": b"# Tiny\n",
    "Tiny-Q2_K.gguf": gguf(40_000, 1),
    "Tiny-Q4_K_M.gguf": gguf(50_000, 2),
    "Tiny-Q8_0.gguf": gguf(900_000, 3),
    "mmproj-Tiny-f16.gguf": gguf(30_000, 4),
}
SPLIT = {
    "Big-Q4_K_M-00001-of-00002.gguf": gguf(60_000, 5),
    "Big-Q4_K_M-00002-of-00002.gguf": gguf(50_000, 6),
    "Big-Q8_0.gguf": gguf(70_000, 7),
}
SAFETENSORS = {
    ".gitattributes": b"*.safetensors filter=lfs\n",
    "README.md": b"# Tiny Instruct\n",
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b'{"do_sample": false}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b'{"chat_template": ""}',
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "model-00001-of-00002.safetensors": gguf(30_000, 8),
    "model-00002-of-00002.safetensors": gguf(20_000, 9),
    "pytorch_model.bin": gguf(50_000, 10),
    "onnx/model.onnx": gguf(20_000, 11),
    "original/consolidated.safetensors": gguf(20_000, 12),
}


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake hub with three repos; HF_ENDPOINT at it, HF_HUB_CACHE in tmp_path, downloads allowed, no retry waits."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # huggingface_hub read the variable when imported
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(pull_module, "_RETRY_DELAYS", (0.0, 0.0, 0.0))
    with FakeHub() as hub:
        hub.add_repo(GGUF_REPO, TINY)
        hub.add_repo(SPLIT_REPO, SPLIT)
        hub.add_repo(ST_REPO, SAFETENSORS)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def cache(tmp_path: Path) -> Path:
    return tmp_path / "hub"


def cached_files(tmp_path: Path, repo: str) -> set[str]:
    """The files huggingface_hub's own cache scan lists for ``repo``."""
    if not cache(tmp_path).exists():
        return set()
    found = [r for r in scan_cache_dir(cache(tmp_path)).repos if r.repo_id == repo]
    return {f.file_name for r in found for rev in r.revisions for f in rev.files}


def test_quant_picks_the_gguf_case_insensitively(fake_hub: FakeHub, tmp_path: Path) -> None:
    result = pull(GGUF_REPO, quant="q8_0")
    assert result.path.name == "Tiny-Q8_0.gguf"
    assert result.path.read_bytes() == TINY["Tiny-Q8_0.gguf"]
    assert result.files == ("Tiny-Q8_0.gguf",)
    assert result.bytes == result.downloaded_bytes == len(TINY["Tiny-Q8_0.gguf"])
    assert result.resumed_bytes == 0
    assert cached_files(tmp_path, GGUF_REPO) == {"Tiny-Q8_0.gguf"}
    # found later without the network, by revision "main", as loaders ask for it
    again = hf_hub_download(GGUF_REPO, "Tiny-Q8_0.gguf", cache_dir=cache(tmp_path), local_files_only=True)
    assert Path(again) == result.path


def test_file_name_picks_the_gguf(fake_hub: FakeHub, tmp_path: Path) -> None:
    result = pull(GGUF_REPO, file="Tiny-Q2_K.gguf")
    assert result.path.read_bytes() == TINY["Tiny-Q2_K.gguf"]
    assert cached_files(tmp_path, GGUF_REPO) == {"Tiny-Q2_K.gguf"}


def test_default_is_q4_k_m(fake_hub: FakeHub, tmp_path: Path) -> None:
    result = pull(GGUF_REPO)
    assert result.files == ("Tiny-Q4_K_M.gguf",)
    assert plan(GGUF_REPO).total_bytes == len(TINY["Tiny-Q4_K_M.gguf"])


def test_no_matching_quant_lists_the_gguf_files_and_writes_nothing(fake_hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(PullError, match="no GGUF file for Q5_K_M") as error:
        pull(GGUF_REPO, quant="Q5_K_M")
    for name in ("Tiny-Q2_K.gguf", "Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf"):
        assert name in str(error.value)
    assert "mmproj" not in str(error.value)
    assert not cache(tmp_path).exists()


def test_unknown_file_name_is_refused(fake_hub: FakeHub) -> None:
    with pytest.raises(PullError, match="has no file Tiny-Q9.gguf"):
        pull(GGUF_REPO, file="Tiny-Q9.gguf")


def test_split_gguf_brings_all_its_parts(fake_hub: FakeHub, tmp_path: Path) -> None:
    result = pull(SPLIT_REPO, quant="Q4_K_M")
    parts = ("Big-Q4_K_M-00001-of-00002.gguf", "Big-Q4_K_M-00002-of-00002.gguf")
    assert result.files == parts
    assert result.path.name == parts[0]
    assert cached_files(tmp_path, SPLIT_REPO) == set(parts)
    assert (result.path.parent / parts[1]).read_bytes() == SPLIT[parts[1]]
    # naming the second part brings the whole model too
    assert choose_files(SPLIT_REPO, list(SPLIT), parts[1], None) == ("gguf", list(parts))


def test_safetensors_repo_brings_only_what_transformers_loads(fake_hub: FakeHub, tmp_path: Path) -> None:
    result = pull(ST_REPO)
    wanted = {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert set(result.files) == wanted
    assert cached_files(tmp_path, ST_REPO) == wanted
    assert result.path.is_dir()
    assert (result.path / "config.json").read_bytes() == SAFETENSORS["config.json"]


def test_several_ggufs_without_a_known_quant_ask_for_a_choice() -> None:
    with pytest.raises(PullError, match="pick one") as error:
        choose_files("x/y", ["a-v1.gguf", "a-v2.gguf"], None, None)
    assert "a-v1.gguf" in str(error.value)
    assert choose_files("x/y", ["only.gguf"], None, None) == ("gguf", ["only.gguf"])


def test_progress_counts_up_to_the_total(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull_module, "_PROGRESS_EVERY_S", 0.0)
    events: list[PullProgress] = []
    result = pull(GGUF_REPO, quant="Q8_0", progress=events.append)
    done = [e.done_bytes for e in events]
    assert len(events) > 3
    assert done == sorted(done)
    assert done[-1] == events[-1].total_bytes == result.bytes
    assert all(e.speed_bps >= 0 and e.file == "Tiny-Q8_0.gguf" for e in events)
    assert any(e.speed_bps > 0 and e.eta_s is not None and e.eta_s > 0 for e in events[:-1])
    assert events[-1].eta_s in (0.0, None)


def test_a_cut_connection_is_resumed_with_a_range_request(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.cut_after("Tiny-Q8_0.gguf", 100_000)
    result = pull(GGUF_REPO, quant="Q8_0")
    assert result.resumed_bytes == 100_000
    assert result.downloaded_bytes == len(TINY["Tiny-Q8_0.gguf"])
    assert [g.range for g in fake_hub.gets("Tiny-Q8_0.gguf")] == [None, "bytes=100000-"]
    assert sha256(result.path.read_bytes()) == sha256(TINY["Tiny-Q8_0.gguf"])


def test_a_failed_pull_is_resumed_by_the_next_one(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.cut_after("Tiny-Q8_0.gguf", 100_000, times=4)  # the first try and its three retries
    with pytest.raises(PullError, match="connection broke while downloading Tiny-Q8_0.gguf"):
        pull(GGUF_REPO, quant="Q8_0")
    assert cached_files(tmp_path, GGUF_REPO) == set()
    (partial,) = cache(tmp_path).glob("models--*/blobs/*.incomplete")
    assert partial.stat().st_size == 400_000

    result = pull(GGUF_REPO, quant="Q8_0")
    assert result.resumed_bytes == 400_000
    assert result.downloaded_bytes == len(TINY["Tiny-Q8_0.gguf"]) - 400_000
    assert fake_hub.gets("Tiny-Q8_0.gguf")[-1].range == "bytes=400000-"
    assert sha256(result.path.read_bytes()) == sha256(TINY["Tiny-Q8_0.gguf"])
    assert not partial.exists()


def test_a_corrupt_download_is_deleted_and_reported(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.corrupt.add("Tiny-Q4_K_M.gguf")
    with pytest.raises(PullError, match="download of Tiny-Q4_K_M.gguf was corrupt"):
        pull(GGUF_REPO)
    assert [p for p in cache(tmp_path).glob("models--*/blobs/*")] == []
    assert cached_files(tmp_path, GGUF_REPO) == set()


def test_a_corrupt_small_file_is_caught_by_its_git_id(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.corrupt.add("config.json")
    with pytest.raises(PullError, match="config.json was corrupt"):
        pull(ST_REPO)
    assert cached_files(tmp_path, ST_REPO) == set()


def test_cancel_keeps_the_partial_file_for_the_next_pull(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull_module, "_PROGRESS_EVERY_S", 0.0)  # a progress event after every read
    cancel = threading.Event()

    def cancel_after_100_kb(p: PullProgress) -> None:
        if p.done_bytes >= 100_000:
            cancel.set()

    with pytest.raises(PullCancelled):
        pull(GGUF_REPO, quant="Q8_0", progress=cancel_after_100_kb, cancel=cancel)
    (partial,) = cache(tmp_path).glob("models--*/blobs/*.incomplete")
    kept = partial.stat().st_size
    assert 100_000 <= kept < 100_000 + 64 * 1024  # stopped at the first read after the cancel
    assert cached_files(tmp_path, GGUF_REPO) == set()

    result = pull(GGUF_REPO, quant="Q8_0")
    assert result.resumed_bytes == kept
    assert result.path.read_bytes() == TINY["Tiny-Q8_0.gguf"]


def test_a_cancel_from_another_thread_stops_the_pull(fake_hub: FakeHub, tmp_path: Path) -> None:
    release = fake_hub.hold_after("Tiny-Q8_0.gguf", 200_000)  # the hub stalls there until released
    started, cancel = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            pull(GGUF_REPO, quant="Q8_0", progress=lambda p: started.set(), cancel=cancel)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    started.wait()
    cancel.set()
    release.set()
    worker.join()
    assert len(outcome) == 1 and isinstance(outcome[0], PullCancelled)
    (partial,) = cache(tmp_path).glob("models--*/blobs/*.incomplete")
    assert partial.stat().st_size < len(TINY["Tiny-Q8_0.gguf"])


def test_not_enough_disk_fails_before_writing(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 50_000, 50_000))
    with pytest.raises(PullError, match="Not enough disk space to pull someone/Tiny-GGUF"):
        pull(GGUF_REPO, quant="Q8_0")
    assert not cache(tmp_path).exists()
    assert fake_hub.gets("Tiny-Q8_0.gguf") == []


def test_a_second_pull_downloads_nothing(fake_hub: FakeHub) -> None:
    first = pull(GGUF_REPO)
    second = pull(GGUF_REPO)
    assert second.path == first.path
    assert second.downloaded_bytes == 0
    assert len(fake_hub.gets("Tiny-Q4_K_M.gguf")) == 1


def test_the_token_goes_to_the_hub_and_not_to_the_cdn(fake_hub: FakeHub) -> None:
    pull(GGUF_REPO, token="hf_secret")
    assert {r.authorization for r in fake_hub.requests if r.path.startswith("/api/")} == {"Bearer hf_secret"}
    cdn = [r for r in fake_hub.requests if r.path.startswith("/lfs/")]
    assert cdn and all(r.authorization is None for r in cdn)


def test_unknown_repo(fake_hub: FakeHub) -> None:
    with pytest.raises(PullError, match="There is no model someone/Missing on .*or it is private"):
        pull("someone/Missing")


def test_private_repo_401(fake_hub: FakeHub) -> None:
    fake_hub.fail[GGUF_REPO] = 401
    with pytest.raises(PullError, match="or it is private: check the name, or log in"):
        pull(GGUF_REPO)


def test_refused_without_a_reason(fake_hub: FakeHub) -> None:
    fake_hub.fail[GGUF_REPO] = 403
    with pytest.raises(PullError, match=r"The hub refused access to someone/Tiny-GGUF \(HTTP 403\): log in"):
        pull(GGUF_REPO)


def test_server_error(fake_hub: FakeHub) -> None:
    fake_hub.fail[GGUF_REPO] = 500
    with pytest.raises(PullError, match=r"The hub answered HTTP 500 for someone/Tiny-GGUF: try again later"):
        pull(GGUF_REPO)


def test_gated_repo(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("meta/Gated", {"Gated-Q4_K_M.gguf": gguf(10_000, 13)}, gated=True)
    with pytest.raises(PullError, match="meta/Gated is gated: accept its terms"):
        pull("meta/Gated")
    assert cached_files(tmp_path, "meta/Gated") == set()


def test_unreachable_hub(fake_hub: FakeHub) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(PullError, match="Could not reach the Hugging Face hub at http://127.0.0.1"):
        pull(GGUF_REPO, endpoint=closed)


def test_offline_mode_is_named(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PullError, match="HF_HUB_OFFLINE"):
        pull(GGUF_REPO)
