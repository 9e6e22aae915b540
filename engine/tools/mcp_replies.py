"""What an MCP server sends back, turned into plain values: its tool list, a call's text, why it failed.

:func:`list_tools` walks a client's paged tool list (at most 50 pages) into
:class:`~engine.tools.mcp_spec.McpTool` s.  :func:`result_text` joins a call
result's text blocks (a resource's text too; other blocks become
``[kind omitted]``; structured content as JSON when there is no block).
:func:`root_cause` names the first exception inside nested exception groups
(anyio wraps transport failures in them).  :func:`stderr_size` and
:func:`stderr_tail` read a stdio server's stderr log: its size now, and what it
wrote after an offset, squeezed to one line of its last ``STDERR_TAIL_CHARS``
characters.  Reading a closed or broken log gives 0 or "", never an error.
"""

from __future__ import annotations

import json
from typing import IO, Any

from engine.tools.mcp_spec import McpTool

STDERR_TAIL_CHARS = 600


async def list_tools(client: Any) -> tuple[McpTool, ...]:
    tools: list[McpTool] = []
    cursor = None
    for _ in range(50):  # a bounded walk over pages
        page = await client.list_tools(cursor=cursor)
        tools.extend(
            McpTool(t.name, t.description or "", dict(t.input_schema or {"type": "object", "properties": {}}))
            for t in page.tools
        )
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(tools)


def result_text(result: Any) -> str:
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def root_cause(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def stderr_size(errlog: IO[str] | None) -> int:
    try:
        return errlog.seek(0, 2) if errlog is not None else 0
    except (OSError, ValueError):
        return 0


def stderr_tail(errlog: IO[str] | None, since: int = 0) -> str:
    """The server's stderr written after offset ``since``, squeezed to one line of its last characters."""
    if errlog is None:
        return ""
    try:
        errlog.flush()
        errlog.seek(since)
        text = errlog.read()
    except (OSError, ValueError):
        return ""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return " | ".join(lines)[-STDERR_TAIL_CHARS:]
