"""How long and how much Brisk takes from one server reply, with defaults, and their overrides from the environment.

``Limits()`` holds the defaults; ``Limits.from_env()`` reads the overrides
(``BRISK_REMOTE_FIRST_EVENT_S``, ``BRISK_REMOTE_EVENT_GAP_S``,
``BRISK_REMOTE_REPLY_S``, ``BRISK_REMOTE_MAX_EVENT_MB``,
``BRISK_REMOTE_MAX_REPLY_MB``, ``BRISK_ALLOW_INSECURE_KEY``) and raises
:class:`~engine.remote.errors.RemoteError` naming the variable for a value that
is not a positive number, so a typo is said, not ignored.

Deadlines count whole server-sent events (one chat-completion chunk each),
never bytes: a server that drips one byte a second, or sends only keep-alive
comments, is as silent as one that sends nothing.  The defaults, and why:

- ``first_event_s`` 300 s from sending the request to the first event: a big
  model on a CPU, or a busy vLLM queue, can spend minutes on a long prompt
  before its first token; five minutes covers that and still ends a dead one.
- ``event_gap_s`` 60 s between events after the first: once decoding runs,
  even a slow CPU model sends a token every second or two; a minute of silence
  means stuck.
- ``reply_s`` 1800 s for the whole reply: thousands of tokens at a few tokens
  a second, and a bound on a server that keeps sending forever.
- ``max_event_bytes`` 1 MiB for one event: a real chunk is under a few KB;
  a bigger one is refused while it arrives, never held whole.
- ``max_reply_bytes`` 64 MiB for one response body: some 200,000 tokens of a
  server's chunks (about 300 bytes each).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import RemoteError

ALLOW_INSECURE_ENV = "BRISK_ALLOW_INSECURE_KEY"
_MB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Deadlines (seconds) and sizes (bytes) for one reply; see the module docstring for the defaults."""

    connect_s: float = 10.0
    first_event_s: float = 300.0
    event_gap_s: float = 60.0
    reply_s: float = 1800.0
    max_event_bytes: int = _MB
    max_reply_bytes: int = 64 * _MB
    allow_insecure_key: bool = False  # send a key over plain http to a host that is not this machine

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults with the ``BRISK_REMOTE_*`` overrides that are set; RemoteError for a bad value."""
        env = os.environ if environ is None else environ
        seconds = {"first_event_s": "FIRST_EVENT_S", "event_gap_s": "EVENT_GAP_S", "reply_s": "REPLY_S"}
        sizes = {"max_event_bytes": "MAX_EVENT_MB", "max_reply_bytes": "MAX_REPLY_MB"}
        changes: dict[str, object] = {}
        for field, suffix in [*seconds.items(), *sizes.items()]:
            name = f"BRISK_REMOTE_{suffix}"
            raw = env.get(name, "").strip()
            if not raw:
                continue
            value = _positive(name, raw)
            changes[field] = max(1, int(value * _MB)) if field in sizes else value
        flag = env.get(ALLOW_INSECURE_ENV, "").strip().lower()
        if flag:
            if flag not in ("1", "true", "yes", "0", "false", "no"):
                raise RemoteError(f"{ALLOW_INSECURE_ENV} must be 1 or 0, not {flag!r}.")
            changes["allow_insecure_key"] = flag in ("1", "true", "yes")
        return dataclasses.replace(cls(), **changes)  # type: ignore[arg-type]


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise RemoteError(f"{name} must be a number above 0, not {raw!r}; unset it for the default.")
    return value
