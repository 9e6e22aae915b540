"""`brisk models pull` against a hostile Hugging Face hub: a real HTTP server on a free loopback port, and the real
command line in a child process (``run_cli``) with ``HF_ENDPOINT`` pointing at it and a hub cache of its own.

The hub lies the ways a stranger's server can: an ``ETag`` or ``X-Repo-Commit`` that is a path, file names and
hashes that climb out of the cache, a body longer than the size it announced (with no ``Content-Length``, or a
false one), a model info of the wrong shape. Each case checks the exit status, one sentence and no traceback, a
bounded time, and that nothing was written outside the hub cache (nor, when refused, inside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.hostile.conftest import Run, run_cli, run_python

REPO = "someone/Tiny-GGUF"
GGUF = b"GGUF" + bytes(range(256)) * 40  # 10,244 bytes: the pull checks its SHA-256, not what it holds
NAME = "Tiny-Q4_K_M.gguf"
EXIT_REQUEST = 3


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HostileHub:
    """One repo of ``files``; ``info`` (the model info JSON) and ``headers`` (extra response headers of a file)
    may be replaced by a test, ``body`` overrides what a file's GET sends: "endless" (no Content-Length, 1 MiB
    chunks until the client hangs up or 300 MiB) or "long-length" (a Content-Length 1,000 times the file)."""

    files: dict[str, bytes]
    info: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    commit: str = "c" * 40
    sent: int = 0  # bytes of file bodies written to clients
    port: int = 0

    def __post_init__(self) -> None:
        if self.info is None:
            self.info = self.good_info()

    def good_info(self) -> dict[str, Any]:
        siblings = []
        for name, data in self.files.items():
            sibling: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name.endswith(".gguf"):
                sibling["lfs"] = {"size": len(data), "sha256": sha256(data), "pointerSize": 134}
            siblings.append(sibling)
        return {"id": REPO, "modelId": REPO, "sha": self.commit, "private": False, "siblings": siblings}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def hub() -> Iterator[HostileHub]:
    state = HostileHub({NAME: GGUF, "README.md": b"# Tiny\n"})

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if re.fullmatch(r"/api/models/[^/]+/[^/]+(/revision/[^/]+)?", path):
                if state.info == b"endless":
                    return self.endless(b'{"siblings": [' + b" " * 2**20, {})
                info = state.info if isinstance(state.info, bytes) else json.dumps(state.info).encode()
                return self.send(200, {"Content-Type": "application/json"}, info, body)
            m = re.fullmatch(r"/[^/]+/[^/]+/resolve/[^/]+/(.+)", path)
            if not m or m[1] not in state.files:
                return self.send(404, {"X-Error-Code": "EntryNotFound"}, b"{}", body)
            data = state.files[m[1]]
            headers = {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": state.commit, **state.headers}
            if state.body == "endless" and body:
                return self.endless(data * (2**20 // len(data) + 1), headers)
            if state.body == "long-length":
                headers["Content-Length"] = str(len(data) * 1000)
            if start := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                offset = int(start[1])
                headers["Content-Range"] = f"bytes {offset}-{len(data) - 1}/{len(data)}"
                return self.send(206, headers, data[offset:], body)
            self.send(200, headers, data, body)

        def endless(self, chunk: bytes, headers: dict[str, str]) -> None:
            """A body with no Content-Length: 1 MiB chunks until the client hangs up, or 300 MiB."""
            self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                while state.sent < 300 * 2**20:
                    self.wfile.write(chunk[: 2**20])
                    state.sent += 2**20
            except OSError:
                pass

        def send(self, status: int, headers: dict[str, str], payload: bytes, body: bool) -> None:
            self.send_response(status)
            headers.setdefault("Content-Length", str(len(payload)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                try:
                    self.wfile.write(payload)
                    state.sent += len(payload)
                except OSError:
                    pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


def hub_env(tmp_path: Path, hub: HostileHub) -> dict[str, str]:
    home = tmp_path / "nest" / "home"
    return {
        "HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def pull(tmp_path: Path, data: Path, hub: HostileHub, *extra: str, timeout: float = 60) -> Run:
    return run_cli("models", "pull", REPO, *extra, data_dir=data, env=hub_env(tmp_path, hub), timeout=timeout)


def cache(tmp_path: Path) -> Path:
    return tmp_path / "nest" / "home" / "hub"


def escaped(tmp_path: Path, *names: str) -> list[Path]:
    """Files under ``tmp_path`` whose name holds one of ``names``, besides the test's own data folder."""
    return [p for p in tmp_path.rglob("*") if any(n in p.name for n in names)]


def refused(run: Run, *phrases: str) -> None:
    assert run.returncode == EXIT_REQUEST, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()  # a progress bar may come first
    assert "Traceback" not in run.stderr and lines and lines[-1].startswith("error: "), run.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1, run.stderr
    for phrase in phrases:
        assert phrase in lines[-1], run.stderr


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_an_etag_that_is_a_path_names_no_file(hub: HostileHub, tmp_path: Path, data: Path, where: str) -> None:
    target = "../../../../PWNED" if where == "relative" else str(tmp_path / "ABS_PWNED")
    hub.headers = {"ETag": f'"{target}"', "X-Linked-Etag": f'"{target}"', "X-Repo-Commit": "../../../PWNED_COMMIT"}
    run = pull(tmp_path, data, hub)
    assert run.returncode == 0, run.stderr
    assert escaped(tmp_path, "PWNED") == []
    (pointer,) = cache(tmp_path).glob(f"models--*/snapshots/*/{NAME}")
    assert pointer.parent.name == hub.commit
    blob = cache(tmp_path).resolve() / "models--someone--Tiny-GGUF" / "blobs" / sha256(GGUF)
    assert os.path.realpath(pointer) == str(blob)
    assert pointer.read_bytes() == GGUF


@pytest.mark.parametrize(
    "bad",
    ["../../../../escape.gguf", "/tmp/escape.gguf", "dir/../../escape.gguf", "a\\..\\..\\escape.gguf",
     "esc\x00ape.gguf", "C:escape.gguf", "dir//escape.gguf", "escape" + "e" * 300 + ".gguf"],
)  # fmt: skip
def test_a_file_name_that_leaves_the_repo_is_refused(hub: HostileHub, tmp_path: Path, data: Path, bad: str) -> None:
    hub.files[bad] = GGUF
    hub.info = hub.good_info()
    run = pull(tmp_path, data, hub, "--file", NAME)
    refused(run, "did not answer like the Hugging Face hub", "Brisk wrote nothing")
    assert not cache(tmp_path).exists()
    assert escaped(tmp_path, "escape") == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda info: info["siblings"][0].pop("rfilename"), "a file named None, not a file name"),
        (lambda info: info["siblings"][0]["lfs"].pop("sha256"), "gives no SHA-256"),
        (lambda info: info["siblings"][0].update(lfs=[]), "gives no SHA-256"),
        (lambda info: info.update(siblings={"a": 1}), "not a list of objects"),
        (lambda info: info["siblings"].append("README.md"), "not a list of objects"),
        (lambda info: info["siblings"][0].update(size="10244"), "the size of"),
        (lambda info: info["siblings"][0].update(size=-1), "the size of"),
        (lambda info: info["siblings"][0]["lfs"].update(sha256="../../../../PWNED"), "SHA-256"),
        (lambda info: info["siblings"][0].update(blobId="/tmp/PWNED"), "git blob id"),
        (lambda info: info["siblings"][0].update(blobId=None, lfs=None), "no checksum"),
        (lambda info: info.pop("sha"), "commit"),
        (lambda info: info.update(sha="../../../PWNED"), "commit"),
    ],
)
def test_a_model_info_of_the_wrong_shape_is_one_sentence(
    hub: HostileHub, tmp_path: Path, data: Path, change: Any, said: str
) -> None:
    change(hub.info)
    run = pull(tmp_path, data, hub, "--file", NAME)
    refused(run, "did not answer like the Hugging Face hub", said)
    assert not cache(tmp_path).exists()
    assert escaped(tmp_path, "PWNED") == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"[1, 2, 3]", "not a JSON object"),
        (b"<html>not json</html>", "not JSON"),
        (b"\xff\xfe{}", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON: RecursionError"),
        (b'{"siblings": 7}', "not a list"),
        (b"null", "not a JSON object"),
        (b"endless", "runs past 67.1 MB"),
    ],
    ids=["list", "html", "not-utf8", "100000-deep", "siblings-7", "null", "endless"],
)
def test_a_model_info_that_is_not_an_object_is_one_sentence(
    hub: HostileHub, tmp_path: Path, data: Path, body: bytes, said: str
) -> None:
    hub.info = body
    run = pull(tmp_path, data, hub)
    refused(run, "did not answer like the Hugging Face hub", said)
    assert run.elapsed < 30
    assert not cache(tmp_path).exists()


def test_a_body_without_length_is_cut_at_the_announced_size(hub: HostileHub, tmp_path: Path, data: Path) -> None:
    hub.files[NAME] = GGUF[:100]
    hub.info = hub.good_info()
    hub.body = "endless"
    run = pull(tmp_path, data, hub, "--file", NAME)
    refused(run, "more than the 100 bytes it announced", "deleted the download")
    assert run.elapsed < 30
    written = sum(p.stat().st_size for p in cache(tmp_path).rglob("*") if p.is_file())
    assert written == 0  # the partial file was deleted; before the fix 130 MB stayed
    assert hub.sent < 300 * 2**20  # the client hung up rather than reading it all


def test_a_false_content_length_is_refused_before_the_body(hub: HostileHub, tmp_path: Path, data: Path) -> None:
    hub.body = "long-length"
    run = pull(tmp_path, data, hub, "--file", NAME)
    refused(run, f"more than the {len(GGUF) / 1e3:.1f} KB it announced")
    assert not list(cache(tmp_path).rglob("*.incomplete")) and not list(cache(tmp_path).rglob(sha256(GGUF)))


@pytest.mark.parametrize("repo", ["a/b/c", "../../etc", "x" * 300])
def test_a_repo_id_that_is_not_one_is_refused(hub: HostileHub, tmp_path: Path, data: Path, repo: str) -> None:
    run = run_cli("models", "pull", repo, data_dir=data, env=hub_env(tmp_path, hub), timeout=60)
    refused(run, "is not a model name on the hub")
    assert not cache(tmp_path).exists()


# The disk filling up while a pull streams: the real CLI in a child process whose shutil.disk_usage reports
# plenty of room for the check before the pull, then 1 MB free; _DISK_CHECK_EVERY is cut so a small file shows it.
FILLING_DISK = """
import shutil, sys
from collections import namedtuple
import engine.library.pull as pull
usage, calls = namedtuple("usage", "total used free"), []
def disk_usage(path):
    calls.append(path)
    return usage(10**12, 0, 10**12 if len(calls) == 1 else 10**6)
shutil.disk_usage = disk_usage
pull._DISK_CHECK_EVERY = 2**20
from app.cli import main
sys.exit(main(["models", "pull", sys.argv[1], "--file", sys.argv[2]]))
"""


def test_a_disk_that_fills_while_streaming_stops_and_keeps_the_part(
    hub: HostileHub, tmp_path: Path, data: Path
) -> None:
    big = GGUF * 400  # 4.1 MB
    hub.files[NAME] = big
    hub.info = hub.good_info()
    env = hub_env(tmp_path, hub)
    run = run_python(["-c", FILLING_DISK, REPO, NAME], data, timeout=60, env=env)
    refused(run, "is down to 1.0 MB free", "run the pull again to continue")
    (partial,) = cache(tmp_path).rglob("*.incomplete")
    assert 2**20 <= partial.stat().st_size < len(big)
    again = pull(tmp_path, data, hub, "--file", NAME)
    assert again.returncode == 0 and "resumed" in again.stdout, again.stderr
    (pointer,) = cache(tmp_path).glob(f"models--*/snapshots/*/{NAME}")
    assert pointer.read_bytes() == big


# A file-size limit on the child (RLIMIT_FSIZE, its signal ignored) makes a write fail with a real OSError
# (EFBIG) part way, as a full disk fails with ENOSPC.
WRITE_FAILS = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
from app.cli import main
sys.exit(main(["models", "pull", sys.argv[1], "--file", sys.argv[2]]))
"""


def test_a_write_that_fails_is_one_sentence_and_keeps_the_part(hub: HostileHub, tmp_path: Path, data: Path) -> None:
    big = GGUF * 400  # 4.1 MB
    hub.files[NAME] = big
    hub.info = hub.good_info()
    run = run_python(["-c", WRITE_FAILS, REPO, NAME], data, timeout=60, env=hub_env(tmp_path, hub))
    refused(run, "Could not write the hub cache at", "what was downloaded is kept")
    (partial,) = cache(tmp_path).rglob("*.incomplete")
    assert 0 < partial.stat().st_size <= 2**20
    again = pull(tmp_path, data, hub, "--file", NAME)
    assert again.returncode == 0 and "resumed" in again.stdout, again.stderr
    (pointer,) = cache(tmp_path).glob(f"models--*/snapshots/*/{NAME}")
    assert pointer.read_bytes() == big


def test_an_honest_answer_from_the_same_hub_pulls(hub: HostileHub, tmp_path: Path, data: Path) -> None:
    """The fixture itself: told no lie, it serves a pull, so the refusals above are its lies, not a broken set-up."""
    run = pull(tmp_path, data, hub)
    assert run.returncode == 0 and "Downloaded someone/Tiny-GGUF" in run.stdout, run.stderr
    (pointer,) = cache(tmp_path).glob(f"models--*/snapshots/{hub.commit}/{NAME}")
    assert pointer.read_bytes() == GGUF
    assert (cache(tmp_path) / "models--someone--Tiny-GGUF" / "refs" / "main").read_text() == hub.commit
