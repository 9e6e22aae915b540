"""What went wrong talking to a server, said for a user: URL checks, key redaction, one message per fault.

``check_base_url(url)`` returns the normalised base URL (``http(s)://host[:port]/path``
without a trailing slash, ``/v1`` added when no path is given) or raises
:class:`RemoteError`.  ``describe(exc, ...)`` turns whatever the ``openai`` SDK
(or the transport under it) raised into one sentence that says what happened
and what to do: connection refused, DNS failure, 401/403, 404, 429 (with when
to retry, from ``Retry-After``), 5xx, a stream cut in the middle, a malformed
chunk, a read timeout, and :class:`Refused` (Brisk's own stop, its message
already said for the user).  ``redact(text, secret)`` removes the API key from
any text; every message this package builds goes through it, so a server that
echoes the key back ("Incorrect API key provided: sk-...") does not leak it,
and :class:`KeyFilter` does the same for the streamed reply itself.
"""

from __future__ import annotations

import email.utils
import errno
import json
import socket
import time
from urllib.parse import urlsplit, urlunsplit

import openai


class RemoteError(Exception):
    """A server could not be used; the message is meant for the user and never holds the API key."""


class Refused(Exception):
    """Brisk stopped talking to a server on purpose (a redirect elsewhere, a reply too big); the message is final."""


class MalformedChunk(Exception):
    """A streamed chunk that is not a chat-completion chunk; the message quotes the start of it."""


def check_base_url(url: str) -> str:
    """The normalised base URL of an OpenAI-compatible server, or :class:`RemoteError` saying what to change."""
    text = (url or "").strip()
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https"):
        shown = parts.scheme or text or "an empty URL"
        raise RemoteError(
            f"The server URL must start with http:// or https:// (got {shown!r}); for example http://127.0.0.1:8080/v1."
        )
    if not parts.hostname:
        raise RemoteError(f"The server URL {text!r} names no host; for example http://127.0.0.1:8080/v1.")
    if parts.username or parts.password:
        raise RemoteError("Put the API key in the key field (or BRISK_API_KEY), not in the server URL.")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise RemoteError(f"The server URL {text!r} has a port that is not a number from 1 to 65535.") from None
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (and of its longer prefixes, as servers quote them) hidden."""
    if not secret:
        return text
    text = text.replace(secret, "***")
    # servers often quote the key shortened ("sk-abc...xyz"): hide any long-enough prefix or suffix too
    for n in range(len(secret) - 1, 7, -1):
        text = text.replace(secret[:n], "***").replace(secret[-n:], "***")
    return text


def secret_key(api_key: str | None) -> str | None:
    """The key worth filtering from replies: a real secret, not a placeholder such as ``ollama`` or ``EMPTY``.

    Local servers take any key, and their docs use short words; filtering those would rewrite ordinary
    text ("Install ***"), and a short word cannot be told apart from the reply anyway.
    """
    return api_key if api_key and len(api_key) >= 16 else None


class KeyFilter:
    """Streamed text with the key taken out as it arrives, even when the key comes split over several deltas.

    ``feed(delta)`` returns what may be shown now.  When the text shown so far
    (its last ``SHOWN - 1`` characters) and the delta end in the first
    ``SHOWN`` or more characters of the key, that end is held back until the
    next delta says whether the key follows; a key that completes is then
    hidden by :func:`redact` (which hides any 8 or more of its characters).
    So at most ``SHOWN - 1`` characters of a key ever show, and ordinary text
    ("s", " ask") is never held.  ``flush()`` returns the held end (redacted);
    ``text`` is all that was returned.  Without a key text passes unchanged.
    """

    SHOWN = 4

    def __init__(self, secret: str | None) -> None:
        self.secret = secret or ""
        self.held = ""
        self.shown_end = ""  # the last SHOWN - 1 characters returned
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, delta: str) -> str:
        if not self.secret:
            self.parts.append(delta)
            return delta
        pending = (self.held + delta).replace(self.secret, "***")
        joined = self.shown_end + pending
        keep = 0
        for n in range(min(len(self.secret) - 1, len(joined)), self.SHOWN - 1, -1):
            if joined.endswith(self.secret[:n]):
                keep = min(n, len(pending))
                break
        self.held = pending[len(pending) - keep :]
        return self._show(redact(pending[: len(pending) - keep], self.secret))

    def flush(self) -> str:
        held, self.held = self.held, ""
        return self._show(redact(held, self.secret))

    def _show(self, out: str) -> str:
        self.parts.append(out)
        self.shown_end = (self.shown_end + out)[-(self.SHOWN - 1) :]
        return out


def retry_after_s(headers: object) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms``; None when absent."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    ms = get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own explanation, from the usual error bodies (OpenAI, vLLM, llama.cpp, Ollama)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail")
            if isinstance(message, str):
                return message.strip()
        if isinstance(inner, str):
            return inner.strip()
        detail = body.get("detail") or body.get("message")
        if isinstance(detail, str):
            return detail.strip()
    if isinstance(body, str):
        return body.strip()[:200]
    return ""


def _with_server(message: str, server: str) -> str:
    return f"{message} The server said: {server}" if server else message


def describe(exc: BaseException, *, where: str, model: str = "", read_timeout: float | None = None) -> str:
    """One user-facing sentence for ``exc`` raised while talking to ``where`` (a base URL); never holds the key."""
    refused = next((e for e in _chain(exc) if isinstance(e, Refused)), None)
    if refused is not None:
        return str(refused)
    if isinstance(exc, MalformedChunk):
        return f"The server at {where} sent a chunk that is not a chat-completion chunk ({exc}); the reply stops there."
    if isinstance(exc, json.JSONDecodeError):
        return (
            f"The server at {where} sent a chunk that is not valid JSON ({exc.doc[:60]!r}); the reply stopped there. "
            "Check that the URL points at an OpenAI-compatible server."
        )
    if isinstance(exc, openai.APITimeoutError) or any(isinstance(e, socket.timeout) for e in _chain(exc)):
        waited = f" for {read_timeout:g} s" if read_timeout else ""
        return (
            f"The server at {where} stopped sending{waited}; the reply stopped there. "
            "It may be overloaded or stuck: try again, or raise the read timeout for a slow server."
        )
    if isinstance(exc, openai.APIConnectionError):
        chain = _chain(exc)
        if any(isinstance(e, socket.gaierror) for e in chain) or any(
            "name or service not known" in str(e).lower() or "nodename nor servname" in str(e).lower() for e in chain
        ):
            host = urlsplit(where).hostname
            return f"Could not find the host {host!r} (DNS lookup failed). Check the server URL and your network."
        if any(
            isinstance(e, ConnectionRefusedError)
            or getattr(e, "errno", None) == errno.ECONNREFUSED
            or "connection refused" in str(e).lower()
            for e in chain
        ):
            return f"Connection refused by {where}. Is the server running and listening on that port?"
        if any(_is_cut(e) for e in chain):
            return (
                f"The server at {where} closed the connection in the middle of the reply; the partial reply is kept. "
                "Check the server's log (it may have crashed or run out of memory) and try again."
            )
        return f"Could not talk to the server at {where}: {chain[-1]!s}. Check the URL and that the server is up."
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        server = _server_message(exc)
        if code in (401, 403):
            what = "401 Unauthorized" if code == 401 else "403 Forbidden"
            return _with_server(
                f"The server at {where} refused the request ({what}). "
                "Check the API key in Settings (or BRISK_API_KEY / --api-key).",
                server,
            )
        if code == 404:
            return _with_server(
                f"The server at {where} has no model {model!r} or no chat endpoint there (404 Not Found). "
                "Pick one of the models it lists at /v1/models, and check that the URL ends in /v1.",
                server,
            )
        if code == 429:
            wait = retry_after_s(exc.response.headers)
            when = f"retry in {wait:.0f} s" if wait is not None else "retry in a little while"
            return _with_server(f"The server at {where} is busy (429 Too Many Requests); {when}.", server)
        if code >= 500:
            return _with_server(
                f"The server at {where} failed ({code}). Try again; if it keeps failing, see the server's log.",
                server,
            )
        return _with_server(f"The server at {where} rejected the request ({code}).", server)
    if isinstance(exc, openai.APIError):  # an error object sent inside the stream
        return f"The server at {where} reported an error in the middle of the reply: {exc.message}"
    return f"Talking to the server at {where} failed: {type(exc).__name__}: {exc}"


def _is_cut(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc).lower()
    return (
        name in ("RemoteProtocolError", "ReadError")
        or isinstance(exc, ConnectionResetError | BrokenPipeError)
        or "peer closed" in text
        or "incomplete" in text
    )
