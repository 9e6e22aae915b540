"""A local HTTP server that answers the Hugging Face hub requests ``huggingface_hub`` 2.4 makes for a download.

Tests point ``HF_ENDPOINT`` (or ``endpoint=``) at ``FakeHub.url`` and never reach huggingface.co. It speaks:

- ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}``: the model info, with ``siblings``
  (``rfilename``; ``size``, ``blobId`` and ``lfs`` when ``?blobs=true``, as ``model_info(files_metadata=True)`` asks);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: a small file is served there with ``ETag`` (its git blob id),
  ``X-Repo-Commit`` and ``Content-Length``; an LFS file (``.gguf``, ``.safetensors``, ``.bin``, ``.onnx``) answers
  ``302`` with ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and a ``Location`` on ``localhost`` instead of
  ``127.0.0.1``, another origin, as the hub sends LFS files to its CDN;
- ``HEAD``/``GET /lfs/{sha256}``: the CDN. Both serve ``Range: bytes=N-`` with ``206``.

Switches, each for one file name: ``cut`` (the next N responses stop after so many body bytes and drop the
connection), ``corrupt`` (serve a changed byte, headers unchanged), ``delay`` (sleep between 16 KiB chunks),
``hold_after`` (stop sending after so many bytes until the test sets the Event it returns); and
``fail`` (every request about a repo answers that status: 404 or 401 with ``X-Error-Code: RepoNotFound``, as the
hub answers for a missing or private repo; any other without a code) and
``gate`` (the repo's files answer 401 ``GatedRepo``). ``requests`` logs what came in.

It is a ``ThreadingHTTPServer`` in a daemon thread: ``http.server`` makes HEAD, Range and cutting a connection
mid-body plain.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx")
_CHUNK = 16 * 1024


def git_blob_id(data: bytes) -> str:
    """The git object id of a file, which the hub sends as the ETag of a file not kept in LFS."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    """One model repository: its files by name and the commit they are at."""

    files: dict[str, bytes]
    commit: str
    gated: bool = False

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)


@dataclass
class Logged:
    """One request the hub received."""

    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    """The server and its switches; use it as a context manager or call ``start`` and ``stop``."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    cut: dict[str, list[int]] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    delay: dict[str, float] = field(default_factory=dict)
    holds: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)
    requests: list[Logged] = field(default_factory=list)
    port: int = 0

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False) -> FakeRepo:
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(git_blob_id(d).encode() for d in files.values())))
        repo = FakeRepo(dict(files), commit.hexdigest(), gated)
        self.repos[repo_id] = repo
        return repo

    def cut_after(self, name: str, n_bytes: int, times: int = 1) -> None:
        """The next ``times`` responses carrying ``name`` send ``n_bytes`` of its body, then drop the connection."""
        self.cut[name] = [n_bytes] * times

    def hold_after(self, name: str, n_bytes: int) -> threading.Event:
        """Responses carrying ``name`` wait after ``n_bytes`` of its body until the returned Event is set."""
        release = threading.Event()
        self.holds[name] = (n_bytes, release)
        return release

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def gets(self, name: str) -> list[Logged]:
        """The GET requests that carried the bytes of ``name``: from the CDN for an LFS file, else from resolve."""
        sha = {_sha(d) for r in self.repos.values() for n, d in r.files.items() if n == name}
        lfs = name.endswith(LFS_SUFFIXES)
        resolve = re.compile(rf"/[^/]+/[^/]+/resolve/[^/]+/{re.escape(name)}")
        return [
            r
            for r in self.requests
            if r.method == "GET" and (r.path in {f"/lfs/{s}" for s in sha} if lfs else resolve.fullmatch(r.path))
        ]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body as written

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            hub.requests.append(
                Logged(self.command, path, self.headers.get("Range"), self.headers.get("Authorization"))
            )
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                self._model_info(m[1], m[2] or "main", "true" in parse_qs(url.query).get("blobs", []))
            elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                self._resolve(m[1], m[2], m[3], body)
            elif m := re.fullmatch(r"/lfs/([0-9a-f]{64})", path):
                found = [(n, d) for r in hub.repos.values() for n, d in r.files.items() if _sha(d) == m[1]]
                if not found:
                    return self._error(404, "EntryNotFound")
                self._content(*found[0], {"ETag": f'"{m[1]}"'}, body)
            else:
                self._error(404, None)

        def _repo(self, repo_id: str, revision: str) -> FakeRepo | None:
            if repo_id in hub.fail:
                status = hub.fail[repo_id]
                self._error(status, "RepoNotFound" if status in (401, 404) else None)
                return None
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
            elif revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound")
                return None
            return repo

        def _model_info(self, repo_id: str, revision: str, blobs: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            siblings: list[dict[str, Any]] = []
            for name, data in repo.files.items():
                sibling: dict[str, Any] = {"rfilename": name}
                if blobs:
                    sibling |= {"size": len(data), "blobId": git_blob_id(data)}
                    if repo.is_lfs(name):
                        sibling["lfs"] = {"size": len(data), "sha256": _sha(data), "pointerSize": 134}
                siblings.append(sibling)
            info = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "auto" if repo.gated else False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            }
            payload = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if repo.gated:
                return self._error(401, "GatedRepo", commit=repo.commit)
            if name not in repo.files:
                return self._error(404, "EntryNotFound", commit=repo.commit)
            data = repo.files[name]
            if repo.is_lfs(name):
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{hub.port}/lfs/{_sha(data)}?signed=1")
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{git_blob_id(name.encode())}"')  # the pointer file's id, as on the hub
                self.send_header("X-Linked-Etag", f'"{_sha(data)}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._content(name, data, {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": repo.commit}, body)

        def _content(self, name: str, data: bytes, headers: dict[str, str], body: bool) -> None:
            if name in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            if body and (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))):
                start = int(m[1])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not body:
                return
            cuts = hub.cut.get(name)
            limit = cuts.pop(0) if cuts else None
            sent = 0
            for offset in range(start, len(data), _CHUNK):
                chunk = data[offset : offset + _CHUNK]
                if limit is not None and sent + len(chunk) > limit:
                    self.wfile.write(chunk[: limit - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                if name in hub.holds and sent >= hub.holds[name][0] > sent - len(chunk):
                    hub.holds[name][1].wait()
                if name in hub.delay:
                    self.wfile.flush()
                    time.sleep(hub.delay[name])

        def _error(self, status: int, code: str | None, commit: str | None = None) -> None:
            payload = json.dumps({"error": code or "error"}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
