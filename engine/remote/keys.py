"""API keys for servers, kept in the system keyring (``keyring``), or in memory only: never in a settings file.

``save_key(base_url, key)``, ``load_key(base_url)`` and ``delete_key(base_url)``
key each secret by the server's normalised base URL under the service name
``brisk``.  When the system has no usable keyring backend (``keyring``'s
``fail`` or ``null`` backend, or a backend that raises), keys live in this
process's memory and are gone at exit; ``persistent()`` says which, so a
settings dialog can tell the user "the key will be asked again next time".
``save_key`` returns True when the key went to the keyring.
Nothing here logs or prints a key.
"""

from __future__ import annotations

import contextlib
import threading

from .errors import check_base_url

SERVICE = "brisk"

_memory: dict[str, str] = {}
_lock = threading.Lock()


def _backend() -> object | None:
    """The system keyring backend, or None when there is none that stores anything."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # a broken keyring configuration: fall back to memory
        return None
    if isinstance(backend, fail.Keyring) or type(backend).__module__.startswith("keyring.backends.null"):
        return None
    return backend


def persistent() -> bool:
    """True when keys are kept in the system keyring (they outlive this process)."""
    return _backend() is not None


def _name(base_url: str) -> str:
    return check_base_url(base_url)


def save_key(base_url: str, key: str) -> bool:
    """Keep ``key`` for ``base_url``; True when it went to the system keyring, False when only to memory."""
    name = _name(base_url)
    backend = _backend()
    if backend is not None:
        try:
            backend.set_password(SERVICE, name, key)  # type: ignore[attr-defined]
            with _lock:
                _memory.pop(name, None)
            return True
        except Exception:  # locked or refused keyring: keep it for this session only
            pass
    with _lock:
        _memory[name] = key
    return False


def load_key(base_url: str) -> str | None:
    """The key kept for ``base_url``, or None."""
    name = _name(base_url)
    with _lock:
        if name in _memory:
            return _memory[name]
    backend = _backend()
    if backend is None:
        return None
    try:
        value = backend.get_password(SERVICE, name)  # type: ignore[attr-defined]
    except Exception:  # a locked keyring reads as "no key"; the user is asked again
        return None
    return value if isinstance(value, str) else None


def delete_key(base_url: str) -> None:
    """Forget the key for ``base_url`` everywhere it is kept."""
    name = _name(base_url)
    with _lock:
        _memory.pop(name, None)
    backend = _backend()
    if backend is None:
        return
    with contextlib.suppress(Exception):  # not there, or the keyring refused: nothing more to do
        backend.delete_password(SERVICE, name)  # type: ignore[attr-defined]
