"""Building, verifying and loading the native decode step (``native_step.cpp``) for fp16-cpu and q8-cpu models.

The step is C++ compiled on the user's machine (``torch.utils.cpp_extension``: a C++
compiler and ninja; ``-O3 -march=native``) into torch's extensions folder
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), under a name that
carries a hash of the source, torch's version and this CPU's instruction set, so a copy
built for another CPU or another source is never loaded.  Building takes about half a
minute and happens once: ``python -m engine.quant.native`` builds it (``make`` does), and
otherwise the first fp16-cpu or q8-cpu model starts a build in the background and decodes with the
eager path until it is done.  ``BRISK_NATIVE=0`` turns it off.

A damaged library must never take the process down (a truncated ``.so`` kills its loader
with SIGBUS, before Python can catch anything), so a library is loaded into this process
only when its sha256 matches the record (``brisk-verified.json`` beside it) that was
written after it passed a test load in a child process.  Anything else is tested or
rebuilt in a child first: a copy without a record is test-loaded there; a copy that
does not match its record, or crashes the test load, is removed and rebuilt (ninja would
otherwise call it up to date), from scratch if relinking is not enough.  Builders take the
data folder's lock (``engine.datafiles.exclusive``) and, in the child, a lock in the build
folder, under which a baton file that torch's ``FileBaton`` left behind (a killed build) is
stale and removed.  Where nothing can be built (no compiler, a compile error), the
eager path decodes and :func:`status` says why and how to retry
(``python -m engine.quant.native --rebuild`` builds from scratch whatever is on disk).

Contract: :func:`module` never blocks unless asked to (``wait=True``) and never raises;
it returns the loaded extension or None.  ``python -m engine.quant.native`` exits 1 only
when a C++ compiler is present and the build still failed (``make test`` stops there);
without a compiler it exits 0, since the eager path runs (``make run`` goes on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from engine.datafiles import (
    StateError,
    atomic_write,
    exclusive,
    is_digest,
    load_state,
    remove_stale_temps,
    string_map,
)

log = logging.getLogger(__name__)

ENABLED = os.environ.get("BRISK_NATIVE", "1") != "0"
SOURCE = Path(__file__).with_name("native_step.cpp")
# the step and the GGUF block families it reads (one file each: gguf_blocks.h says which), compiled together
SOURCES = [SOURCE] + [
    Path(__file__).with_name(f"gguf_{part}.cpp") for part in ("product", "blocks", "legacy", "kquants", "float")
]
HEADERS = [Path(__file__).with_name(name) for name in ("gguf_blocks.h", "gguf_product.h")]
FLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs serially without it
RECORD = "brisk-verified.json"  # beside the library: its sha256 after a test load passed
BUILD_LOCK = "brisk-build.lock"  # in the build folder, held by the child that builds or tests
BUILD_TIMEOUT = 900.0  # seconds for one child (a build takes about 30 s)
RETRY = "To retry: python -m engine.quant.native --rebuild"
_MARK = "brisk-native: "  # a child's one-line reason on stderr

_lock = threading.Lock()
_done = threading.Event()
_thread: threading.Thread | None = None
_module: Any = None
_error: str | None = None
_how = "built and verified"
_force = False  # ``--rebuild``: build from scratch whatever is on disk


class NativeError(Exception):
    """The native step cannot be loaded here; the message says why in one line."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return f"{platform.machine()} {platform.processor()} {torch.backends.cpu.get_cpu_capability()}"


def build_name() -> str:
    """The extension's name: the source, torch's version, the flags and this CPU's instruction set, hashed."""
    digest = hashlib.sha256()
    code = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
    for part in (*code, torch.__version__.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode()):
        digest.update(part)
        digest.update(b"\0")
    return f"brisk_step_{digest.hexdigest()[:16]}"


def compiler() -> str | None:
    """The C++ compiler torch's cpp_extension would use (``CXX``, else ``c++``), or None when there is none."""
    import shutil

    return shutil.which(os.environ.get("CXX") or "c++")


def _folder(name: str) -> Path:
    """Torch's build folder for ``name`` (created if missing)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(name, verbose=False))
    except Exception as exc:  # noqa: BLE001 (a private helper of torch's)
        raise NativeError(f"torch's extensions folder is not usable ({exc})") from exc


def built_copy() -> Path | None:
    """The built extension's file on disk, if there is one for this source, torch and CPU (verified or not)."""
    try:
        name = build_name()
        path = _folder(name) / f"{name}.so"
    except (NativeError, OSError):
        return None
    return path if path.is_file() else None


def _record(value: Any) -> dict[str, Any]:
    record = string_map(value)
    if not isinstance(record.get("name"), str) or not is_digest(record.get("sha256"), 64):
        raise StateError("expected a name and a sha256 digest")
    return record


def _digest(path: Path) -> str | None:
    try:
        with path.open("rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return None


def _recorded(folder: Path, name: str) -> str | None:
    """The sha256 recorded for ``name``'s library after its test load; a damaged record is moved to ``.bad``."""
    record = load_state(folder / RECORD, _record)
    return record["sha256"] if record is not None and record["name"] == name else None


def verified(folder: Path, name: str) -> bool:
    """True when the library on disk is byte for byte the one that passed its test load."""
    recorded = _recorded(folder, name)
    return recorded is not None and _digest(folder / f"{name}.so") == recorded


def _import(name: str, so: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, so)
    if spec is None or spec.loader is None:
        raise NativeError(f"{so} is not a loadable extension")
    loaded = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(loaded)
    except ImportError as exc:
        raise NativeError(f"{so} did not load ({str(exc).splitlines()[0][:200]})") from exc
    return loaded


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0].split(": [", 1)[0] if lines else ""  # torch puts the whole compiler log after ": ["
    detail = next((line for line in lines[1:] if "error" in line.lower()), "")
    text = first if isinstance(exc, NativeError) else f"{type(exc).__name__}: {first}"
    return (text + (f" ({detail})" if detail else ""))[:300]


def _clear(folder: Path, name: str, everything: bool) -> None:
    """Remove the library, its record and a stale torch baton; with ``everything``, every build output too."""
    names = [RECORD, f"{name}.so", "lock"]
    if everything:
        names += ["build.ninja", ".ninja_log", ".ninja_deps"]
        names += [p.name for p in folder.iterdir() if p.name.endswith((".o", ".o.d"))]
    for item in names:
        (folder / item).unlink(missing_ok=True)


def _child(mode: str, folder_text: str, name: str) -> int:
    """In a child process: ``check`` test-loads the library on disk, ``build``/``clean`` rebuild it first.

    A library that passes (it loads and has ``Stepper``) gets its sha256 recorded.  A crash
    ends only this process; the parent reads its exit code.
    """
    from filelock import FileLock

    folder = Path(folder_text)
    so = folder / f"{name}.so"
    stage = "test load"
    try:
        with FileLock(str(folder / BUILD_LOCK), timeout=BUILD_TIMEOUT):
            remove_stale_temps(folder, RECORD)  # a record half written by a killed child
            if mode != "clean" and verified(folder, name):
                return 0  # another builder finished it while this one waited
            if mode == "check":
                loaded = _import(name, so)
            else:
                _clear(folder, name, everything=mode == "clean")
                from torch.utils.cpp_extension import load

                stage = f"build with {os.environ.get('CXX') or 'c++'}"
                loaded = load(
                    name=name,
                    sources=[str(s) for s in SOURCES],
                    extra_cflags=FLAGS,
                    extra_ldflags=["-fopenmp"],
                    verbose=False,
                )
            if not callable(getattr(loaded, "Stepper", None)) or Path(loaded.__file__) != so:
                raise NativeError(f"{so} is not the native decode step (no Stepper)")
            data = {"name": name, "sha256": _digest(so), "size": so.stat().st_size, "torch": torch.__version__}
            atomic_write(folder / RECORD, json.dumps(data))
        return 0
    except Exception as exc:  # noqa: BLE001 (every failure becomes the parent's one-line reason)
        print(f"{_MARK}{stage} failed: {_one_line(exc)}", file=sys.stderr)
        return 3


def _run_child(mode: str, folder: Path, name: str) -> str | None:
    """Run :func:`_child` in a child process; None when it passed, else why not in one line."""
    env = dict(os.environ)
    here = str(Path(sys.executable).parent)  # the ninja of this environment (the pip package)
    env["PATH"] = here + os.pathsep + env.get("PATH", "")
    code = "import sys; from engine.quant.native import _child; sys.exit(_child(*sys.argv[1:]))"
    child = subprocess.Popen(
        [sys.executable, "-c", code, mode, str(folder), name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],  # this checkout's engine package
        start_new_session=True,  # so a timeout can stop the compiler too
    )
    try:
        _, err = child.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return f"the build took over {BUILD_TIMEOUT:.0f} s and was stopped"
    if child.returncode == 0:
        return None
    what = "test load" if mode == "check" else "build"
    reasons = [line[len(_MARK) :] for line in err.splitlines() if line.startswith(_MARK)]
    if reasons:
        return reasons[-1]
    if child.returncode < 0:
        return f"{what} crashed with {signal.Signals(-child.returncode).name}"
    tail = next((line for line in reversed(err.splitlines()) if line.strip()), "")
    return f"{what} exited with code {child.returncode} ({tail[:200]})"


# Prebuilt copies (the installable bundle, ``packaging/``): built at packaging time for three targets, the
# widest this CPU runs chosen at start; no compiler on the user's machine.  Best first: the variant, the CPU
# flags it needs (from /proc/cpuinfo), the -march it is built with.
VARIANTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma"), "cascadelake"),
    ("avx2", ("avx2", "fma", "f16c", "bmi2"), "haswell"),
    ("generic", (), "x86-64"),
)
PREBUILT_ENV = "BRISK_NATIVE_PREBUILT"  # a folder of prebuilt variants and their manifest (variants.json)
MANIFEST = "variants.json"


def prebuilt_folder() -> Path | None:
    """Where prebuilt variants are: ``BRISK_NATIVE_PREBUILT``, or the bundle's own ``brisk_native`` folder."""
    named = os.environ.get(PREBUILT_ENV)
    if named:
        return Path(named)
    bundle = getattr(sys, "_MEIPASS", None)  # a PyInstaller bundle
    if bundle and (Path(bundle) / "brisk_native" / MANIFEST).is_file():
        return Path(bundle) / "brisk_native"
    return None


def pick_variant(flags: set[str], available: set[str]) -> str | None:
    """The widest prebuilt variant among ``available`` that a CPU with ``flags`` runs (None: none does)."""
    for variant, needs, _ in VARIANTS:
        if variant in available and set(needs) <= flags:
            return variant
    return None


def _load_prebuilt(folder: Path) -> tuple[Any, str]:
    """The prebuilt variant this CPU runs, checked against the manifest's sha256 before it is loaded."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        entries = {str(k): v for k, v in manifest["variants"].items()}
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise NativeError(f"the prebuilt native steps in {folder} have no readable {MANIFEST} ({exc})") from None
    if manifest.get("torch") != torch.__version__:
        built = manifest.get("torch")
        raise NativeError(f"the prebuilt native steps were built for torch {built}, not {torch.__version__}")
    wanted = os.environ.get("BRISK_NATIVE_VARIANT")  # the bundle's test: this variant only (as on another CPU)
    variant = pick_variant(set(_cpu_flags().split()), {wanted} & set(entries) if wanted else set(entries))
    if variant is None:
        raise NativeError("no prebuilt native step runs on this CPU")
    entry = entries[variant]
    so = folder / str(entry["file"])
    if _digest(so) != entry.get("sha256"):
        raise NativeError(f"{so.name} does not match the checksum recorded when it was packaged")
    return _import(str(entry["name"]), so), f"prebuilt {variant} variant, verified"


def _load_or_build() -> tuple[Any, str]:
    """The loaded extension and how it came to be (for :func:`status`); raises :class:`NativeError`."""
    prebuilt = prebuilt_folder()
    if prebuilt is not None:
        return _load_prebuilt(prebuilt)
    name = build_name()
    folder = _folder(name)
    so = folder / f"{name}.so"
    if not _force and verified(folder, name):
        return _import(name, so), "built and verified"
    with exclusive(f"native-{name}", what="building the native decode step"):
        if not _force and verified(folder, name):  # built by the process this one waited for
            return _import(name, so), "built and verified"
        why = "a rebuild was asked for" if _force else None
        if why is None and so.is_file():
            if _recorded(folder, name) is None:  # built before records were kept, or the record was damaged
                problem = _run_child("check", folder, name)
                if problem is None and verified(folder, name):
                    return _import(name, so), "built and verified (test-loaded now: it had no checksum record)"
                why = problem or "it changed during its test load"
            else:
                why = "it does not match the checksum recorded when it was built"
            log.warning("The native decode step's library %s is unusable (%s); rebuilding it.", so, why)
        if compiler() is None:
            if why is not None and not _force:  # a damaged copy must not be loaded by anyone
                for item in (so, folder / RECORD):
                    item.unlink(missing_ok=True)
            raise NativeError("no C++ compiler found (install g++ or clang, or set CXX)")
        leftovers = any(p.suffix == ".o" for p in folder.iterdir())
        problem = _run_child("clean" if _force else "build", folder, name)
        if problem is not None and leftovers and not _force:  # relinking was not enough: from scratch
            log.warning("Rebuilding the native decode step from scratch (%s).", problem)
            problem = _run_child("clean", folder, name)
        if problem is not None:
            raise NativeError(problem)
        if not verified(folder, name):
            raise NativeError(f"{so} changed after its test load")
        return _import(name, so), f"rebuilt and verified ({why})" if why else "built now and verified"


def _build() -> None:
    global _module, _error, _how
    try:
        _module, _how = _load_or_build()
    except Exception as exc:  # noqa: BLE001 (NativeError, LockTimeout, anything: the eager path runs)
        _error = _one_line(exc)
    finally:
        _done.set()
    if _error is not None:
        log.warning("native decode step unavailable (%s); the eager path decodes instead. %s", _error, RETRY)


def module(wait: bool = False) -> Any | None:
    """The built extension, or None: turned off, failed, or (unless ``wait``) still building."""
    global _thread
    if not ENABLED:
        return None
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_build, name="brisk-native-build", daemon=True)
            _thread.start()
    if wait:
        _done.wait()
    return _module if _done.is_set() else None


def prepare() -> str:
    """For a model that will decode with it: load it now where a verified copy is on disk (about 0.2 s),
    else start a build (or a test load) in the background.  Returns :func:`status` (for the model's info line).
    """
    ready = prebuilt_folder() is not None  # a prebuilt copy loads in a moment
    if ENABLED and not ready:
        try:
            name = build_name()
            ready = verified(_folder(name), name)
        except (NativeError, OSError):
            pass
    module(wait=ready)
    return status()


def status() -> str:
    """One line for ``brisk doctor``: built and verified, rebuilt (and why), building, off, or why not."""
    if not ENABLED:
        return "off (BRISK_NATIVE=0)"
    if not _done.is_set():
        return "building" if _thread is not None else "not built yet"
    return _how if _module is not None else f"unavailable ({_error}); the eager path decodes, more slowly. {RETRY}"


def main(argv: list[str]) -> int:
    """``python -m engine.quant.native [--rebuild]``: build (or verify) now; one line says the outcome."""
    global _force
    import time

    _force = "--rebuild" in argv
    log.disabled = True  # the line below carries the same reasons
    start = time.perf_counter()
    built = module(wait=True)
    line = f"native decode step: {status()} ({time.perf_counter() - start:.1f} s)"
    failed = built is None and ENABLED and compiler() is not None
    print(line, file=sys.stderr if built is None and ENABLED else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":  # make runs it first; see the contract for the exit code
    sys.exit(main(sys.argv[1:]))
