"""Building and loading the native decode step (``native_step.cpp``) for fp16-cpu models.

The step is C++ compiled on the user's machine (``torch.utils.cpp_extension``: a C++
compiler and ninja; ``-O3 -march=native``) into torch's extensions folder
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), under a name that
carries a hash of the source, torch's version and this CPU's instruction set, so a copy
built for another CPU or another source is never loaded.  Building takes about half a
minute and happens once: ``python -m engine.quant.native`` builds it (``make`` does, when
it installs), and otherwise the first fp16-cpu model starts a build in the background and
decodes with the TorchScript step (``engine.quant.scripted``) until it is done.  Where it
cannot be built (no compiler), :func:`status` says why and the TorchScript step stays.
``BRISK_NATIVE=0`` turns it off.

Contract: :func:`module` never blocks unless asked to (``wait=True``) and never raises;
it returns the loaded extension or None.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ENABLED = os.environ.get("BRISK_NATIVE", "1") != "0"
SOURCE = Path(__file__).with_name("native_step.cpp")
FLAGS = ["-O3", "-march=native"]

_lock = threading.Lock()
_done = threading.Event()
_thread: threading.Thread | None = None
_module: Any = None
_error: str | None = None


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
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode()):
        digest.update(part)
        digest.update(b"\0")
    return f"brisk_step_{digest.hexdigest()[:16]}"


def compiler() -> str | None:
    """The C++ compiler torch's cpp_extension would use (``CXX``, else ``c++``), or None when there is none."""
    import shutil

    return shutil.which(os.environ.get("CXX") or "c++")


def _build() -> None:
    global _module, _error
    try:
        if compiler() is None:
            raise FileNotFoundError("no C++ compiler found (install g++ or clang, or set CXX)")
        from torch.utils.cpp_extension import load

        here = str(Path(sys.executable).parent)  # the ninja of this environment (the pip package)
        if here not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
        _module = load(name=build_name(), sources=[str(SOURCE)], extra_cflags=FLAGS, verbose=False)
    except Exception as exc:  # noqa: BLE001 (no compiler, no ninja, a compile error: the TorchScript step stays)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _error = f"{type(exc).__name__}: {first}"[:300]
        log.warning("native decode step not built (%s); the TorchScript step runs instead", _error)
    finally:
        _done.set()


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


def built_copy() -> Path | None:
    """The built extension's file on disk, if there is one for this source, torch and CPU."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        name = build_name()
        path = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
    except Exception:  # noqa: BLE001 (a private helper of torch's; without it, build in the background)
        return None
    return path if path.is_file() else None


def prepare() -> str:
    """For a model that will decode with it: load it now where a copy is built (about 0.2 s), else start a build.

    Returns :func:`status` (for the model's info line).
    """
    module(wait=ENABLED and built_copy() is not None)
    return status()


def status() -> str:
    """One line for ``brisk doctor``: whether the native step is built, building, off, or why not."""
    if not ENABLED:
        return "off (BRISK_NATIVE=0)"
    if not _done.is_set():
        return "building" if _thread is not None else "not built yet"
    return "built" if _module is not None else f"unavailable ({_error}); the TorchScript step runs"


if __name__ == "__main__":  # ``python -m engine.quant.native``: build now (make does, at install)
    import time

    start = time.perf_counter()
    built = module(wait=True)
    print(f"native decode step: {status()} ({time.perf_counter() - start:.1f} s)")
    sys.exit(0)
