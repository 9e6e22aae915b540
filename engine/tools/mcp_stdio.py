"""The stdio transport for MCP servers, bounded against a server that misbehaves on its stdout.

:func:`bounded_stdio` is a transport for ``mcp.Client`` (an async context
manager giving the read and write streams), like the SDK's ``stdio_client``
with three differences:

- A line (one JSON-RPC message) is held only up to ``max_line_bytes``; past
  that its bytes are dropped as they arrive, so a 50 MB reply costs neither
  memory nor a 20 s parse.  When such a line ends, the request it answers
  (its ``"id"``, read from the line's start or end) gets an error saying how
  large the reply was, so the call fails at once instead of waiting out its
  timeout.
- A line that is not a JSON-RPC message (a ``print`` in a tool, a banner,
  bytes that are not UTF-8) is dropped and counted in :class:`Strays`, never
  logged one traceback per line; the hub reports the count once.
- Shutdown closes the server's stdin, waits ``GRACE_S``, then ends its whole
  process group (``terminate_posix_process_tree``).

The server's stderr goes to ``errlog`` as with the SDK.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, Any

import anyio
import mcp_types as types
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

MAX_LINE_BYTES = 4 << 20  # one message from a server; a tool result is cut to far less before the model sees it
GRACE_S = 2.0  # for the server to exit after its stdin closes
KILL_S = 2.0  # after SIGTERM, before SIGKILL
HEAD_BYTES = 4096  # kept of an over-long line, to find its id
_ID = rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")'
_BODY = re.compile(rb'"(?:result|error|params)"\s*:')
_HEAD_ID = re.compile(_ID)
_TAIL_ID = re.compile(_ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?}\s*$')


@dataclass
class Strays:
    """What a server wrote on stdout that was not a usable MCP message."""

    lines: int = 0  # lines that are not JSON-RPC messages
    first: str = ""  # the first of them, cut short
    oversized: int = 0  # messages over the size limit, dropped
    largest: int = 0  # bytes of the largest of those

    def __bool__(self) -> bool:
        return bool(self.lines or self.oversized)

    def note_line(self, line: bytes) -> None:
        if not self.lines:
            self.first = line[:80].decode("utf-8", errors="replace")
        self.lines += 1

    def note_oversized(self, size: int) -> None:
        self.oversized += 1
        self.largest = max(self.largest, size)

    def summary(self) -> str:
        """One clause for a message: what was dropped (empty when nothing was)."""
        parts = []
        if self.lines:
            lines = f"{self.lines:,} line{'s' if self.lines > 1 else ''}"
            parts.append(f"{lines} on stdout that are not MCP messages (the first: {self.first!r})")
        if self.oversized:
            messages = f"{self.oversized:,} message{'s' if self.oversized > 1 else ''}"
            parts.append(f"{messages} over {MAX_LINE_BYTES >> 20} MB (the largest {self.largest:,} bytes)")
        return "; ".join(parts)


@dataclass(frozen=True)
class _Oversized:
    head: bytes
    tail: bytes
    size: int


class _Lines:
    """Splits a byte stream into lines, holding at most ``limit`` bytes of one line."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.head = b""
        self.tail = b""
        self.skipped = 0  # bytes of the over-long line being dropped (0: none)

    def feed(self, chunk: bytes) -> Iterator[bytes | _Oversized]:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self.skipped:
                self.skipped += len(piece)
                self.tail = (self.tail + piece)[-256:]
            else:
                self.buffer += piece
                if len(self.buffer) > self.limit:
                    self.head, self.tail = bytes(self.buffer[:HEAD_BYTES]), bytes(self.buffer[-256:])
                    self.skipped = len(self.buffer)
                    self.buffer = bytearray()
            if end < 0:
                return
            if self.skipped:
                yield _Oversized(self.head, self.tail, self.skipped)
                self.skipped, self.head, self.tail = 0, b"", b""
            else:
                line = bytes(self.buffer)
                self.buffer.clear()
                yield line
            start = end + 1


def _request_id(item: _Oversized) -> int | str | None:
    """The id of the JSON-RPC message an over-long line was, from its start or its end (None if not found)."""
    before_body = _BODY.split(item.head, maxsplit=1)[0]
    found = _HEAD_ID.search(before_body) or _TAIL_ID.search(item.tail.rstrip(b"\r"))
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return None
    return value if isinstance(value, int | str) else None


def _message(item: bytes | _Oversized, strays: Strays, limit: int) -> SessionMessage | None:
    """A line as the session's message, or None when it is dropped (and counted)."""
    if isinstance(item, _Oversized):
        strays.note_oversized(item.size)
        request = _request_id(item)
        if request is None:
            return None
        reason = (
            f"the MCP server's reply was {item.size:,} bytes, more than the {limit >> 20} MB Brisk reads in one "
            "message, so it was dropped; ask the tool for less"
        )
        error = {"jsonrpc": "2.0", "id": request, "error": {"code": -32603, "message": reason}}
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(error, by_name=False))
    line = item.strip()
    if not line:
        return None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        strays.note_line(line)
        return None


@asynccontextmanager
async def bounded_stdio(
    params: StdioServerParameters, errlog: IO[str], strays: Strays, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server ``params`` names and give the session's (read, write) streams."""
    from mcp.os.posix.utilities import terminate_posix_process_tree

    process = await anyio.open_process(
        [params.command, *params.args],
        env=get_default_environment() | (params.env or {}),
        stderr=errlog,
        cwd=params.cwd,
        start_new_session=True,
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        lines = _Lines(max_line_bytes)
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            async with read_writer:
                async for chunk in process.stdout:
                    for item in lines.feed(chunk):
                        message = _message(item, strays, max_line_bytes)
                        if message is not None:
                            await read_writer.send(message)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for outgoing in write_reader:
                    text = outgoing.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the server stopped reading: the session sees the connection end

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
        with anyio.move_on_after(GRACE_S):
            while process.returncode is None:
                await anyio.sleep(0.01)
        if process.returncode is None:
            await terminate_posix_process_tree(process, KILL_S)
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdout.aclose()
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            group.cancel_scope.cancel()
