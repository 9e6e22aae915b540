"""The ``fetch`` tool: get a web page's text over http(s).  Off unless the user enables it.

Only ``http`` and ``https`` URLs.  The host is resolved first and every
address it resolves to is checked: private, loopback, link-local, multicast,
reserved and unspecified addresses are refused unless ``allow_private``; the
connection then goes to the address that was checked (no second lookup, so a
DNS answer cannot change in between).  Redirects are followed by hand, each
checked the same way, at most ``MAX_REDIRECTS``.  Bounded by a timeout per
request and a cap on the bytes read.  HTML is reduced to its text.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

from engine.tools.registry import Tool, ToolError

MAX_BYTES = 1_000_000
MAX_TEXT_CHARS = 20_000
MAX_REDIRECTS = 5
TIMEOUT_S = 10.0


def check_address(ip: str, allow_private: bool = False) -> None:
    """Raise :class:`ToolError` when ``ip`` is not a public address (unless ``allow_private``)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if allow_private or address.is_global:
        return
    kind = next(
        (
            name
            for name in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified")
            if getattr(address, f"is_{name}")
        ),
        "non-public",
    )
    raise ToolError(
        f"refused: {ip} is a {kind.replace('_', '-')} address; fetch reaches only public addresses "
        "unless local addresses are allowed in the tools panel"
    )


def resolve(host: str, port: int, allow_private: bool) -> list[str]:
    """The host's addresses, each checked; raises :class:`ToolError` if any is refused or none is found."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot resolve host {host!r}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for ip in addresses:
        check_address(ip, allow_private)
    if not addresses:
        raise ToolError(f"host {host!r} has no address")
    return addresses


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ip = ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self._ip, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ip = ip

    def connect(self) -> None:
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript", "template"):
            self._skip += 1
        elif tag in ("p", "br", "div", "li", "h1", "h2", "h3", "h4", "tr", "section", "article"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript", "template") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def fetch(
    url: str,
    *,
    allow_private: bool = False,
    timeout_s: float = TIMEOUT_S,
    max_bytes: int = MAX_BYTES,
    max_chars: int = MAX_TEXT_CHARS,
) -> str:
    """The text at ``url``; raises :class:`ToolError` with what went wrong."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url.strip() if isinstance(url, str) else "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolError(f"only http:// and https:// URLs can be fetched, not {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ToolError(f"bad port in {url!r}") from None
        ip = resolve(parts.hostname, port, allow_private)[0]
        left = deadline - time.monotonic()
        if left <= 0:
            raise ToolError(f"fetching {url} took longer than {timeout_s:g} s")
        kind = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
        conn = kind(parts.hostname, port, ip, timeout=left)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", target, headers={"User-Agent": "Brisk/1 (fetch tool)", "Accept": "text/*, */*;q=0.5"})
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                continue
            body = _read(response, max_bytes, deadline, timeout_s, url)
        except (OSError, http.client.HTTPException) as exc:
            raise ToolError(f"fetching {url} failed: {exc}") from None
        finally:
            conn.close()
        if response.status >= 400:
            raise ToolError(f"{url} answered HTTP {response.status} {response.reason}")
        return _decode(response, body, max_bytes, max_chars)
    raise ToolError(f"{url} redirected more than {MAX_REDIRECTS} times")


def _read(response: http.client.HTTPResponse, max_bytes: int, deadline: float, timeout_s: float, url: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        if time.monotonic() > deadline:
            raise ToolError(f"fetching {url} took longer than {timeout_s:g} s")
        chunk = response.read(min(65536, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _decode(response: http.client.HTTPResponse, body: bytes, max_bytes: int, max_chars: int) -> str:
    ctype = response.getheader("Content-Type", "text/plain") or "text/plain"
    mime = ctype.split(";")[0].strip().lower()
    textual = mime.startswith("text/") or mime.endswith(("json", "xml", "javascript"))
    if not textual:
        raise ToolError(f"the page is {mime}, not text; fetch reads text only")
    charset = response.headers.get_content_charset() or "utf-8"
    try:
        text = body[:max_bytes].decode(charset, errors="replace")
    except LookupError:
        text = body[:max_bytes].decode("utf-8", errors="replace")
    if "html" in mime:
        text = html_text(text)
    cut = len(body) > max_bytes or len(text) > max_chars
    return text[:max_chars] + ("\n[truncated]" if cut else "")


def fetch_tool(allow_private: bool = False, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BYTES) -> Tool:
    return Tool(
        name="fetch",
        description="Fetch a web page (http or https) and return its text.",
        parameters={
            "type": "object",
            "properties": {"url": {"type": "string", "description": "the http(s) URL to fetch"}},
            "required": ["url"],
        },
        fn=lambda arguments: fetch(
            arguments.get("url", ""), allow_private=allow_private, timeout_s=timeout_s, max_bytes=max_bytes
        ),
        timeout_s=timeout_s + 2.0,
    )
