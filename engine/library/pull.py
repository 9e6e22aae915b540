"""Model downloads from the Hugging Face hub into the standard hub cache, resumable, cancellable and checked.

``plan(repo, file, quant)`` asks the hub which files a pull would fetch and how big they are; nothing is written.
``pull`` fetches them into the hub cache (``scan.hf_cache_root()``, or ``cache_dir``) so that ``scan_cache_dir`` and
``hf_hub_download(..., local_files_only=True)`` find them afterwards, and returns a ``PullResult`` whose ``path`` is
the GGUF file or, for a safetensors repo, the snapshot folder.

Which files: a repo of GGUF files gives one model, chosen by ``file``, else by ``quant`` ("Q4_K_M", matched in the
file name, case-insensitive), else by ``GGUF_PREFERENCE``; a split GGUF (``-00001-of-00003``) brings all its parts.
A safetensors repo gives its top-level config, tokenizer and ``*.safetensors`` files (``.bin`` weights only when it
has no safetensors; never ``onnx/`` or ``original/``).

How: the hub's model info (``/api/models/<repo>?blobs=True``, read here within ``_INFO_BYTES`` and
``_INFO_DEADLINE_S`` on ``huggingface_hub``'s session, which adds the token and honours offline mode) says which
files there are; the bytes are fetched here, and
the cache laid out here in the hub's layout (``blobs/<hash>``, ``snapshots/<commit>/<file>`` linking to it,
``refs/main``), because ``hf_hub_download`` deletes a partial file when a download fails (so it cannot resume) and
names files after the ``ETag`` and ``X-Repo-Commit`` headers as given. Each file streams into
``blobs/<hash>.incomplete`` (the name the hub's cache scan reports as an unfinished download); a later pull continues
it with a ``Range`` request; a cut connection is retried the same way (``_RETRY_DELAYS``). The file's SHA-256 (LFS
files) or git blob id (small files) is checked against the hub's before it becomes a blob, so a blob is never
half-written or wrong.

A hub is a stranger: every path written is built from the model info's hashes (64 or 40 hex digits) and its commit
(40 hex digits), and from file names that pass the hub's own path rules (relative, ``/``-separated, no ``..``, no
backslash, no control character), and is checked to lie inside the cache before anything is written; no header names
a file. The bytes written are counted against the size the hub announced as they arrive (more is refused and the
partial file deleted), and against the disk's free space before the pull and every ``_DISK_CHECK_EVERY`` bytes during
it. A model info of the wrong shape (keys missing, wrong types) is a ``PullError``.

Errors a user can act on are ``PullError`` with a message meant for them; ``cancel`` (a ``threading.Event``, checked
after every network read) raises ``PullCancelled`` and keeps the partial file for the next pull.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import httpx2
from huggingface_hub import constants, get_session, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import _create_symlink, repo_folder_name
from huggingface_hub.utils import WeakFileLock, build_hf_headers, hf_raise_for_status, validate_repo_id

from engine.library.scan import SPLIT, hf_cache_root

# The GGUF picked when neither a file nor a quantization is named: the usual quality-for-size sweet spot first.
GGUF_PREFERENCE = (
    "Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q5_K_S", "Q5_0", "Q6_K", "Q8_0",
    "IQ4_XS", "IQ4_NL", "Q3_K_M", "BF16", "F16", "F32",
)  # fmt: skip
# The files besides the weights that transformers reads from a safetensors repo.
_MODEL_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
    "chat_template.json", "preprocessor_config.json", "processor_config.json",
})  # fmt: skip
_DISK_MARGIN = 100 * 2**20  # kept free beyond the download, so the pull does not fill the disk to the last byte
_DISK_CHECK_EVERY = 64 * 2**20  # bytes written between two looks at the disk's free space during a download
_RETRY_DELAYS = (0.5, 2.0, 5.0)  # seconds before each retry of a broken transfer; then the pull fails
_PROGRESS_EVERY_S = 0.1
_SPEED_WINDOW_S = 3.0
_HASH = re.compile(r"[0-9a-f]{64}|[0-9a-f]{40}")  # an LFS file's SHA-256, or a small file's git blob id
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SERVER_TEXT = 200  # characters of a server's own message quoted in ours
_INFO_BYTES = 64 * 2**20  # a model info longer than this is not one (a repo of 10,000 files answers about 3 MB)
_INFO_DEADLINE_S = 120.0  # for the whole model info to arrive


@dataclass(frozen=True)
class PullProgress:
    """How far a pull is: bytes of all its files on disk, the speed over the last few seconds, the time left."""

    done_bytes: int
    total_bytes: int
    speed_bps: float
    eta_s: float | None
    file: str


@dataclass(frozen=True)
class PullResult:
    """A finished pull: ``path`` is the GGUF file (first part if split) or the snapshot folder of a safetensors repo.

    ``bytes`` is the size of all its files, ``downloaded_bytes`` what came over the network this time, and
    ``resumed_bytes`` what was kept from an interrupted transfer (an earlier pull or a cut connection).
    """

    repo: str
    path: Path
    files: tuple[str, ...]
    bytes: int
    resumed_bytes: int
    downloaded_bytes: int = 0


class PullError(Exception):
    """A pull that failed; the message is meant for the user and says what to do."""


class PullCancelled(PullError):
    """The pull was cancelled; what was downloaded is kept, and the next pull resumes it."""


@dataclass(frozen=True)
class PlannedFile:
    """One file a pull fetches, with what the hub says about it: size and checksum."""

    name: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id, the checksum of a small file

    @property
    def blob_name(self) -> str:
        """The file's name in ``blobs/``: its SHA-256 (LFS) or git blob id, as the hub cache names it."""
        return self.sha256 or self.blob_id or ""


@dataclass(frozen=True)
class Plan:
    """What ``pull`` would fetch: the repo at one commit, the kind of model and its files."""

    repo: str
    revision: str
    kind: Literal["gguf", "safetensors", "file"]
    files: tuple[PlannedFile, ...]
    endpoint: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def plan(
    repo: str, file: str | None = None, quant: str | None = None, *, endpoint: str | None = None,
    token: str | None = None,
) -> Plan:  # fmt: skip
    """Ask the hub which files ``pull`` would fetch for these arguments, and their sizes; downloads nothing."""
    endpoint = _endpoint(endpoint)
    with _hub_errors(repo, endpoint):
        info = _model_info(repo, endpoint, token)
    listed = info.get("siblings")
    if not isinstance(listed, list) or not all(isinstance(s, dict) for s in listed):
        raise _wrong_shape(repo, endpoint, "its list of files is not a list of objects")
    siblings: dict[str, dict[str, Any]] = {}
    for sibling in listed:
        name = sibling.get("rfilename")
        if problem := repo_path_problem(name):
            raise _wrong_shape(repo, endpoint, f"a file named {name!r:.{_SERVER_TEXT}}, {problem}")
        siblings[str(name)] = sibling
    commit = info.get("sha")
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise _wrong_shape(repo, endpoint, f"its commit is {commit!r:.{_SERVER_TEXT}}, not 40 hex digits")
    kind, names = choose_files(repo, list(siblings), file, quant)
    files = tuple(_planned(repo, endpoint, n, siblings[n]) for n in names)
    return Plan(repo=repo, revision=commit, kind=kind, files=files, endpoint=endpoint)


def _model_info(repo: str, endpoint: str, token: str | None) -> dict[str, Any]:
    """The hub's model info of ``repo`` with its files' sizes and hashes, as a JSON object; PullError when the
    answer is longer than ``_INFO_BYTES``, slower than ``_INFO_DEADLINE_S``, or not a JSON object."""
    validate_repo_id(repo)
    start, body = time.monotonic(), bytearray()
    with get_session().stream(
        "GET", f"{endpoint}/api/models/{repo}", params={"blobs": True}, headers=build_hf_headers(token=token),
        follow_redirects=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
    ) as response:  # fmt: skip
        hf_raise_for_status(response)
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > _INFO_BYTES:
                raise _wrong_shape(repo, endpoint, f"its model info runs past {_size(_INFO_BYTES)}")
            if time.monotonic() - start > _INFO_DEADLINE_S:
                raise _wrong_shape(repo, endpoint, f"its model info took over {_INFO_DEADLINE_S:.0f} s")
    try:
        info = json.loads(bytes(body))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past Python's stack
        raise _wrong_shape(repo, endpoint, f"its model info is not JSON: {type(exc).__name__}") from None
    if not isinstance(info, dict):
        raise _wrong_shape(repo, endpoint, "its model info is not a JSON object")
    return info


def repo_path_problem(name: object) -> str:
    """Why ``name`` is not a file path inside a repo by the hub's rules ("" when it is one): relative,
    ``/``-separated, no empty, ``.`` or ``..`` part, no backslash, no control character, no drive letter."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if len(name) > 1000:
        return "longer than a path the hub allows"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "an absolute path"
    if "\\" in name or any(ord(c) < 32 or c == "\x7f" for c in name):
        return "with a backslash or a control character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "with an empty, '.' or '..' part"
    if any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in name.split("/")):
        return "with a part longer than a file name can be"
    return ""


def _planned(repo: str, endpoint: str, name: str, sibling: dict[str, Any]) -> PlannedFile:
    """The ``PlannedFile`` of one entry of the model info's files, its size and hashes checked for type and form."""
    size, lfs, blob_id = sibling.get("size"), sibling.get("lfs"), sibling.get("blobId")
    if lfs is not None and not (isinstance(lfs, dict) and lfs.get("sha256") is not None):
        raise _wrong_shape(repo, endpoint, f"the LFS entry of {name} gives no SHA-256")
    sha256 = lfs.get("sha256") if lfs else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _wrong_shape(repo, endpoint, f"the size of {name} is {size!r:.{_SERVER_TEXT}}")
    for label, value in (("SHA-256", sha256), ("git blob id", blob_id)):
        if value is not None and (not isinstance(value, str) or not _HASH.fullmatch(value.lower())):
            raise _wrong_shape(repo, endpoint, f"the {label} of {name} is {value!r:.{_SERVER_TEXT}}")
    if sha256 is None and blob_id is None:
        raise _wrong_shape(repo, endpoint, f"it gives no checksum for {name}")
    return PlannedFile(name, size, sha256.lower() if sha256 else None, blob_id.lower() if blob_id else None)


def _wrong_shape(repo: str, endpoint: str, what: str) -> PullError:
    return PullError(
        f"{endpoint} did not answer like the Hugging Face hub about {repo} ({what}), so Brisk wrote nothing: "
        "check HF_ENDPOINT, or try again later."
    )


def choose_files(
    repo: str, names: list[str], file: str | None, quant: str | None
) -> tuple[Literal["gguf", "safetensors", "file"], list[str]]:
    """The files of ``repo`` (given its file ``names``) that make the model asked for; PullError if none fits."""
    models = _gguf_models(names)
    if file is not None:
        for parts in models.values():
            if file in parts:
                return "gguf", parts
        if file in names:
            return "file", [file]
        raise PullError(f"{repo} has no file {file}.{_listing(models or names)}")
    if models:
        return "gguf", models[_pick_gguf(repo, models, quant)]
    if quant is not None:
        raise PullError(f"{repo} has no GGUF files, so there is no {quant} to pick.{_listing(names)}")
    top = [n for n in names if "/" not in n]
    weights = [n for n in top if n.endswith(".safetensors") and not n.startswith("consolidated")]
    index = "model.safetensors.index.json"
    if not weights:
        weights = [n for n in top if re.fullmatch(r"pytorch_model.*\.bin", n)]
        index = "pytorch_model.bin.index.json"
    if not weights:
        raise PullError(f"{repo} holds neither GGUF nor safetensors weights, so Brisk cannot run it.{_listing(names)}")
    return "safetensors", sorted(n for n in top if n in _MODEL_FILES or n == index) + sorted(weights)


def _gguf_models(names: list[str]) -> dict[str, list[str]]:
    """The GGUF models among ``names``, by the name of their first file: one file each, or all parts of a split."""
    models: dict[str, list[str]] = {}
    for name in sorted(names):
        base = name.rsplit("/", 1)[-1].lower()
        if not base.endswith(".gguf") or "mmproj" in base:  # mmproj: a vision projector, not a model
            continue
        if m := SPLIT.search(name):
            models.setdefault(f"{name[: m.start()]}-00001-of-{m[2]}.gguf", []).append(name)
        else:
            models[name] = [name]
    return models


def _pick_gguf(repo: str, models: dict[str, list[str]], quant: str | None) -> str:
    """The model named by ``quant``, else the first of ``GGUF_PREFERENCE`` there, else the only one."""
    if quant is None:
        for preferred in GGUF_PREFERENCE:
            if found := _matching(models, preferred, exact=True):
                return found[0]
        if len(models) == 1:
            return next(iter(models))
        raise PullError(
            f"{repo} has several GGUF files and none of the usual quantizations: pick one.{_listing(models)}"
        )
    found = _matching(models, quant, exact=True) or _matching(models, quant, exact=False)
    if len(found) == 1:
        return found[0]
    if not found:
        raise PullError(f"{repo} has no GGUF file for {quant}.{_listing(models)}")
    raise PullError(f"{repo} has several GGUF files for {quant}: pick one with its file name.{_listing(found)}")


def _matching(models: dict[str, list[str]], quant: str, *, exact: bool) -> list[str]:
    """Models whose file name holds ``quant``: as a whole word (exact), or anywhere."""
    word = re.escape(quant)
    pattern = re.compile(rf"(?<![a-z0-9]){word}(?![a-z0-9_])" if exact else word, re.IGNORECASE)
    return [name for name in models if pattern.search(name.rsplit("/", 1)[-1])]


def _listing(names: dict[str, list[str]] | list[str]) -> str:
    shown = list(names)
    more = f"\n  … and {len(shown) - 30} more" if len(shown) > 30 else ""
    label = "GGUF files there" if isinstance(names, dict) else "files there"
    return f"\n{label.capitalize()}:\n  " + "\n  ".join(shown[:30]) + more if shown else f"\nThere are no {label}."


@dataclass
class _Job:
    """One file of a pull still to fetch: where its blob goes and how much of it is already on disk."""

    file: PlannedFile
    blob: Path
    have: int
    kept: int = 0  # bytes kept from an interrupted transfer: the offset of the last Range the server honoured


def pull(
    repo: str,
    file: str | None = None,
    quant: str | None = None,
    *,
    progress: Callable[[PullProgress], None] | None = None,
    cancel: threading.Event | None = None,
    cache_dir: Path | None = None,
    endpoint: str | None = None,
    token: str | None = None,
) -> PullResult:
    """Download the model ``plan`` picks into the hub cache and return where it is; see the module docstring."""
    todo = plan(repo, file, quant, endpoint=endpoint, token=token)
    root = Path(cache_dir) if cache_dir is not None else hf_cache_root()
    with _disk_errors(root):
        return _download(todo, root, progress, cancel, token)


def _download(
    todo: Plan, root: Path, progress: Callable[[PullProgress], None] | None, cancel: threading.Event | None,
    token: str | None,
) -> PullResult:  # fmt: skip
    """Fetch what ``todo`` names into the hub cache at ``root`` and link it into the snapshot of its commit."""
    repo = todo.repo
    storage = root / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = storage / "snapshots" / todo.revision
    for f in todo.files:  # plan() checked every name and hash; this keeps the promise should that change
        for path in (storage / "blobs" / f.blob_name, snapshot / f.name):
            if not _inside(path, storage):
                raise PullError(f"Brisk will not write {path}: it is outside the hub cache at {root}.")
    jobs: list[_Job] = []
    for f in todo.files:
        if isinstance(try_to_load_from_cache(repo, f.name, cache_dir=root, revision=todo.revision), str):
            continue
        blob = storage / "blobs" / f.blob_name
        have = 0 if blob.exists() else _size_of(_partial(blob))
        jobs.append(_Job(f, blob, min(have, f.size)))
    fetch = [j for j in jobs if not j.blob.exists()]
    _check_disk(repo, root, sum(j.file.size - j.have for j in fetch))
    meter = _Meter(todo.total_bytes - sum(j.file.size - j.have for j in fetch), todo.total_bytes, progress)
    headers = build_hf_headers(token=token, headers={"Accept-Encoding": "identity"})
    with _hub_errors(repo, todo.endpoint):
        for job in fetch:
            if cancel is not None and cancel.is_set():
                raise PullCancelled(f"Cancelled before downloading {job.file.name}.")
            url = hf_hub_url(repo, job.file.name, revision=todo.revision, endpoint=todo.endpoint)
            lock = root / ".locks" / storage.name / f"{job.blob.name}.lock"
            lock.parent.mkdir(parents=True, exist_ok=True)
            with WeakFileLock(lock):
                if not job.blob.exists():
                    _fetch(url, job, headers, meter, cancel)
    for job in jobs:  # linked as huggingface_hub links them: a relative symlink, or a copy where there are none
        pointer = snapshot / job.file.name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(job.blob), str(pointer), new_blob=False)
    _write_ref(storage, todo.revision)
    meter.finish()
    return PullResult(
        repo=repo,
        path=snapshot if todo.kind == "safetensors" else snapshot / todo.files[0].name,
        files=tuple(f.name for f in todo.files),
        bytes=todo.total_bytes,
        resumed_bytes=sum(j.kept for j in jobs),
        downloaded_bytes=meter.received,
    )


def _fetch(url: str, job: _Job, headers: dict[str, str], meter: _Meter, cancel: threading.Event | None) -> None:
    """Stream one file into its ``.incomplete`` file, resuming and retrying with Range; check it; make it the blob."""
    name, size = job.file.name, job.file.size
    partial = _partial(job.blob)
    partial.parent.mkdir(parents=True, exist_ok=True)
    check = _Checksum(job.file)
    if partial.exists() and partial.stat().st_size > size:
        partial.unlink()
    with partial.open("ab") as out:
        check.feed_file(partial)
        failures = 0
        while True:
            try:
                if out.tell() < size:
                    _stream(url, headers, out, check, meter, cancel, job)
                if out.tell() >= size:
                    break
                raise httpx2.RemoteProtocolError(f"the server sent {out.tell()} of {size} bytes")
            except _TooLong as exc:
                out.close()
                partial.unlink()
                raise PullError(
                    f"The hub offered more than the {_size(size)} it announced for {name} ({exc}), so Brisk "
                    "stopped and deleted the download: try again later, or check HF_ENDPOINT."
                ) from None
            except httpx2.TransportError:
                out.flush()
                if failures == len(_RETRY_DELAYS):
                    raise PullError(
                        f"The connection broke while downloading {name} ({_size(out.tell())} of {_size(size)} kept): "
                        "run the pull again to continue where it stopped."
                    ) from None
                if (cancel or threading.Event()).wait(_RETRY_DELAYS[failures]):
                    raise PullCancelled(f"Cancelled while downloading {name}; the next pull continues it.") from None
                failures += 1
    if not check.matches():
        partial.unlink()
        raise PullError(f"The download of {name} was corrupt (its checksum does not match the hub's): run it again.")
    os.replace(partial, job.blob)


def _stream(
    url: str, headers: dict[str, str], out: BinaryIO, check: _Checksum, meter: _Meter, cancel: threading.Event | None,
    job: _Job,
) -> None:  # fmt: skip
    """One GET of the rest of a file, appended to ``out``; notes in ``job.kept`` a Range the server honoured."""
    offset = out.tell()
    ranged = {**headers, "Range": f"bytes={offset}-"} if offset else headers
    with get_session().stream(
        "GET", url, headers=ranged, follow_redirects=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
    ) as response:
        hf_raise_for_status(response)
        if offset and response.status_code == 206:
            job.kept = offset
        elif offset:  # the server ignored the Range: start again from the first byte
            out.seek(0)
            out.truncate()
            check.reset()
            meter.add(-offset, job.file.name)
        size, length = job.file.size, response.headers.get("Content-Length", "")
        if length.isdigit() and out.tell() + int(length) > size:
            raise _TooLong(f"it announced {int(length):,} more bytes after the {out.tell():,} on disk")
        unchecked = 0  # bytes written since the last look at the disk's free space
        for chunk in response.iter_bytes():
            if out.tell() + len(chunk) > size:
                raise _TooLong(f"{out.tell() + len(chunk):,} bytes and counting")
            out.write(chunk)
            check.update(chunk)
            meter.add(len(chunk), job.file.name)
            unchecked += len(chunk)
            if unchecked >= _DISK_CHECK_EVERY:
                unchecked = 0
                _check_free(out, job)
            if cancel is not None and cancel.is_set():
                raise PullCancelled(f"Cancelled while downloading {job.file.name}; the next pull continues it.")


class _TooLong(Exception):
    """The server sent, or announced, more bytes of a file than the model info said it has."""


def _check_free(out: BinaryIO, job: _Job) -> None:
    """Stop a download, keeping what it wrote for the next pull, when its disk is down to ``_DISK_MARGIN`` free."""
    out.flush()
    where = job.blob.parent
    free = shutil.disk_usage(where).free
    if free < _DISK_MARGIN:
        raise PullError(
            f"The disk holding {where} is down to {_size(free)} free (Brisk keeps {_size(_DISK_MARGIN)} spare), so "
            f"the download of {job.file.name} stopped with {_size(out.tell())} of {_size(job.file.size)} kept: "
            "free some space and run the pull again to continue."
        )


class _Checksum:
    """The running checksum of a file against the hub's: SHA-256 for an LFS file, the git blob id for a small one."""

    def __init__(self, file: PlannedFile) -> None:
        self.file = file
        self.reset()

    def reset(self) -> None:
        if self.file.sha256:
            self._hash = hashlib.sha256()
        else:  # git hashes "blob <size>\0" then the content
            self._hash = hashlib.sha1(b"blob %d\0" % self.file.size)

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def feed_file(self, path: Path) -> None:
        with path.open("rb") as f:
            while chunk := f.read(2**20):
                self._hash.update(chunk)

    def matches(self) -> bool:
        expected = self.file.sha256 or self.file.blob_id
        return expected is None or self._hash.hexdigest() == expected.lower()


class _Meter:
    """Turns bytes received into ``PullProgress`` events: at most every ``_PROGRESS_EVERY_S``, and a last one."""

    def __init__(self, done: int, total: int, progress: Callable[[PullProgress], None] | None) -> None:
        self.done, self.total, self.progress = done, total, progress
        self.received = 0  # bytes that came over the network
        self.file = ""
        self.samples: deque[tuple[float, int]] = deque([(time.perf_counter(), done)])
        self.last_emit = 0.0

    def add(self, n: int, file: str) -> None:
        self.done += n
        self.received += max(n, 0)
        self.file = file
        now = time.perf_counter()
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[1][0] > _SPEED_WINDOW_S:
            self.samples.popleft()
        if now - self.last_emit >= _PROGRESS_EVERY_S:
            self._emit(now)

    def finish(self) -> None:
        self._emit(time.perf_counter())

    def _emit(self, now: float) -> None:
        self.last_emit = now
        if self.progress is None:
            return
        start, start_done = self.samples[0]
        speed = (self.done - start_done) / (now - start) if now > start else 0.0
        eta = (self.total - self.done) / speed if speed > 0 else None
        self.progress(PullProgress(self.done, self.total, max(speed, 0.0), eta, self.file))


@contextmanager
def _disk_errors(root: Path) -> Iterator[None]:
    """Turn what writing the cache raises (a full disk, no permission, a name too long) into a ``PullError``."""
    try:
        yield
    except OSError as exc:
        raise PullError(
            f"Could not write the hub cache at {exc.filename or root}: {exc.strerror or exc}. Check that disk "
            "(free space, permissions) and run the pull again; what was downloaded is kept."
        ) from None


@contextmanager
def _hub_errors(repo: str, endpoint: str) -> Iterator[None]:
    """Turn what ``huggingface_hub`` and the network raise into a ``PullError`` that says what to do."""
    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        yield
    except PullError:
        raise
    except HFValidationError:
        raise PullError(
            f"{repo!r:.{_SERVER_TEXT}} is not a model name on the hub: it is owner/name, with letters, digits, "
            "'-', '_' and '.'."
        ) from None
    except OfflineModeIsEnabled:
        raise PullError("Downloads are switched off (HF_HUB_OFFLINE is set): unset it to pull models.") from None
    except GatedRepoError:
        raise PullError(
            f"{repo} is gated: accept its terms on {endpoint}/{repo}, then {login}, with an account that did."
        ) from None
    except RepositoryNotFoundError:
        raise PullError(
            f"There is no model {repo} on {endpoint}, or it is private: check the name, or {login}."
        ) from None
    except (RevisionNotFoundError, RemoteEntryNotFoundError) as e:
        said = str(e.server_message or e)[:_SERVER_TEXT]
        raise PullError(f"{repo} changed on the hub while pulling it ({said}): run it again.") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        if status in (401, 403):
            raise PullError(f"The hub refused access to {repo} (HTTP {status}): {login}.") from None
        raise PullError(f"The hub answered HTTP {status} for {repo}: try again later.") from None
    except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError):
        raise PullError(
            f"Could not reach the Hugging Face hub at {endpoint}: check the internet connection (or HF_ENDPOINT)."
        ) from None
    except (httpx2.HTTPError, httpx2.InvalidURL, httpx2.StreamError) as e:  # redirects in a loop, a body it mangled
        said = str(e)[:_SERVER_TEXT]
        raise PullError(f"{endpoint} did not answer like the Hugging Face hub ({said}): check HF_ENDPOINT.") from None


def _check_disk(repo: str, root: Path, needed: int) -> None:
    """Refuse a pull whose files (``needed`` bytes still to fetch) would not fit on the cache's disk."""
    if needed <= 0:
        return
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if needed + _DISK_MARGIN > free:
        raise PullError(
            f"Not enough disk space to pull {repo}: it needs {_size(needed)} and {where} has {_size(free)} free "
            f"(Brisk keeps {_size(_DISK_MARGIN)} spare). Free some space, or pick a smaller quantization."
        )


def _write_ref(storage: Path, commit: str) -> None:
    """Point ``refs/main`` at the commit pulled, as ``hf_hub_download(revision="main")`` does."""
    ref = storage / "refs" / "main"
    if not ref.exists() or ref.read_text() != commit:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)


def _endpoint(endpoint: str | None) -> str:
    # read at call time: huggingface_hub reads HF_ENDPOINT once, when it is imported
    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, with its ``..`` parts worked out (it need not exist), lies inside ``folder``."""
    base = os.path.normpath(os.path.abspath(folder))
    return os.path.commonpath([base, os.path.normpath(os.path.abspath(path))]) == base


def _partial(blob: Path) -> Path:
    return blob.with_name(blob.name + ".incomplete")


def _size_of(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
