"""Files in the data folder that several Brisk processes share: locks, publishing, state files.

The window, the CLI and any other Brisk process may use one data folder at once.
Every shared artifact follows three rules, all served from here:

* **Written under a private name, then renamed into place.**  :func:`private_name`
  gives a sibling name no other process uses (pid and a random token);
  :func:`atomic_write` writes a file that way and :func:`publish_dir` renames a
  finished folder into place.  A reader sees the old artifact or the new one,
  never half of one, and two writers never delete each other's files.
* **Built by one process at a time.**  :func:`exclusive` takes a file lock
  (``filelock``) under ``<data>/locks``; a second process waits for the first
  instead of racing it, and is told so once through ``on_wait`` ("another Brisk
  is preparing the model").  After the wait the caller looks again: the first
  process has usually built what it needed.
* **State files are read through one loader.**  :func:`load_state` reads a JSON
  file with a size cap, parses it (absurd nesting included) and checks its shape
  with a validator; anything that does not validate is moved aside to
  ``NAME.bad``, one warning names the file and what was wrong, and the caller
  goes on with its defaults (or measures again).  Values that become paths must
  pass :func:`is_digest` first.

Contract: nothing here raises for a damaged or foreign file; locks raise only
:class:`LockTimeout` after ``timeout`` seconds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock
from filelock import Timeout as _FileLockTimeout

from engine.paths import atomic_write, data_dir, private_name

__all__ = ["atomic_write", "private_name"]  # re-exported: the one way to write a shared file

log = logging.getLogger("brisk.datafiles")

T = TypeVar("T")

MAX_STATE_BYTES = 8 << 20  # no state file of Brisk's is near this; a bigger one is not ours
MAX_DEPTH = 32  # how deep a state file's JSON may nest
_DIGEST = re.compile(r"[0-9a-f]{16,128}")


class LockTimeout(Exception):
    """Another process held a lock for longer than the caller would wait; the message says which."""


class StateError(ValueError):
    """A state file's content is not the shape it must be; the message says what is wrong."""


def publish_dir(tmp: Path, target: Path) -> None:
    """Move the finished folder ``tmp`` to ``target``, replacing what is there.

    Call it while holding the :func:`exclusive` lock that guards ``target``: the old
    copy is renamed aside first (a private name), so ``target`` is never a half-deleted
    folder, and removed after the new one is in place.
    """
    old: Path | None = None
    if target.is_symlink():  # a link planted in the cache: drop the link, never what it points to
        target.unlink()
    elif target.exists():
        old = private_name(target)
        os.replace(target, old)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temps(folder: Path, name: str) -> None:
    """Remove ``NAME.tmp-<pid>-*`` siblings left in ``folder`` by processes that no longer run."""
    if not folder.is_dir():
        return
    for path in folder.glob(f"{glob_escape(name)}.tmp-*"):
        match = re.fullmatch(re.escape(name) + r"\.tmp-(\d+)-[0-9a-f]+", path.name)
        if match and not _alive(int(match.group(1))):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(name: str) -> Path:
    """The lock file for ``name`` (a short key such as ``model-<sha256>``) under ``<data>/locks``."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,120}", name):
        raise ValueError(f"not a lock name: {name!r}")
    folder = data_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.lock"


@contextmanager
def exclusive(
    name: str,
    on_wait: Callable[[], None] | None = None,
    timeout: float = 1800.0,
    what: str = "preparing the model",
) -> Iterator[None]:
    """Hold the inter-process lock ``name`` for the ``with`` block.

    If another process holds it, ``on_wait()`` is called once (say "another Brisk is
    preparing the model") and this one waits up to ``timeout`` seconds, then raises
    :class:`LockTimeout`.  The lock is released when the block ends, and by the operating
    system when the process dies, so a killed process never leaves it held.
    """
    lock = FileLock(str(lock_path(name)))
    try:
        lock.acquire(timeout=0)
    except _FileLockTimeout:
        if on_wait is not None:
            on_wait()
        else:
            log.warning("Another Brisk process is %s; waiting for it to finish.", what)
        try:
            lock.acquire(timeout=timeout)
        except _FileLockTimeout as exc:
            raise LockTimeout(
                f"Another Brisk process has been {what} for over {timeout:.0f} s "
                f"(lock {lock_path(name)}). Close the other Brisk, or delete that file if none runs."
            ) from exc
    try:
        yield
    finally:
        lock.release()


def is_digest(value: object, length: int | None = None) -> bool:
    """True when ``value`` is a lower-case hex digest (of ``length`` characters): safe to use as a file name."""
    return isinstance(value, str) and bool(_DIGEST.fullmatch(value)) and (length is None or len(value) == length)


def parse_json(data: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` as JSON, refusing absurd nesting; raises :class:`StateError` with a short reason."""
    # json's C parser recurses once per bracket; reject deep nesting before it can.
    depth = 0
    deepest = 0
    in_string = False
    escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                raise StateError(f"nested deeper than {max_depth} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StateError(f"not valid JSON ({str(exc).splitlines()[0][:120]})") from None


def quarantine(path: Path, reason: str) -> Path | None:
    """Move ``path`` aside to ``NAME.bad`` (replacing an older one) and say so in one warning line."""
    bad = path.with_name(path.name + ".bad")
    try:
        os.replace(path, bad)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s is damaged (%s) and could not be moved aside (%s); it is ignored.", path, reason, exc)
        return None
    log.warning("%s was damaged (%s); moved it to %s and went on without it.", path, reason, bad.name)
    return bad


def load_state(path: Path, validate: Callable[[Any], T], max_bytes: int = MAX_STATE_BYTES) -> T | None:
    """Read the JSON state file ``path`` and return ``validate(parsed)``; None when it is missing or bad.

    ``validate`` returns the value in the shape the caller uses and raises ``ValueError``
    (or :class:`StateError`), ``TypeError`` or ``KeyError`` when the content is not that
    shape.  A file that is too big, not JSON, too deep or fails ``validate`` is moved aside
    to ``NAME.bad`` (:func:`quarantine`) and None is returned.  A file that cannot be read
    (permissions, a special file) is left where it is, with a warning.
    """
    try:
        if not path.exists():
            return None
        if not path.is_file():
            log.warning("%s is not a regular file; it is ignored.", path)
            return None
        if path.stat().st_size > max_bytes:
            quarantine(path, f"{path.stat().st_size:,} bytes, more than {max_bytes:,}")
            return None
        data = path.read_bytes()
    except OSError as exc:
        log.warning("Could not read %s (%s); going on without it.", path, exc)
        return None
    try:
        return validate(parse_json(data))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        quarantine(path, str(exc)[:200] or type(exc).__name__)
        return None


def string_map(value: Any, check: Callable[[str, Any], bool] | None = None) -> dict[str, Any]:
    """Validator helper: ``value`` must be a JSON object with string keys (and values passing ``check``)."""
    if not isinstance(value, dict):
        raise StateError(f"expected an object, found {type(value).__name__}")
    for key, item in value.items():
        if check is not None and not check(key, item):
            raise StateError(f"unexpected value for {key[:80]!r}: {str(item)[:80]!r}")
    return value
