"""What an MCP server is and where it stands, as plain frozen values (no SDK, no threads).

:class:`ServerSpec` describes a server a user added: a command line run over
stdio, or a URL spoken to over streamable HTTP.  :meth:`ServerSpec.parse`
reads what a user typed (an http(s) URL, or a shell-style command line; its
name defaults to the URL's host or the script's stem) and raises
``ValueError`` for an empty line; :meth:`~ServerSpec.to_dict` and
:meth:`~ServerSpec.from_dict` round-trip it through saved settings.
:class:`ServerState` is a server's status (one of ``STATUSES``), a message that
says what went wrong and what to do when it is not ready, and the
:class:`McpTool` s it lists.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STATUSES: tuple[str, ...] = ("starting", "ready", "failed", "died", "stopped")


@dataclass(frozen=True)
class ServerSpec:
    """An MCP server: ``command`` (argv, run over stdio) or ``url`` (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: Mapping[str, str] | None = None
    cwd: str | None = None

    @classmethod
    def parse(cls, target: str, name: str | None = None) -> ServerSpec:
        """A spec from what a user typed: an http(s) URL, or a shell-style command line."""
        target = target.strip()
        if target.startswith(("http://", "https://")):
            return cls(name=name or (urlsplit(target).hostname or "mcp"), url=target)
        argv = tuple(shlex.split(target))
        if not argv:
            raise ValueError("an MCP server needs a command line (stdio) or an http(s) URL")
        guess = next((Path(a).stem for a in reversed(argv) if not a.startswith("-")), Path(argv[0]).stem)
        return cls(name=name or guess or "mcp", command=argv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": list(self.command),
            "url": self.url,
            "env": dict(self.env or {}),
            "cwd": self.cwd,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerSpec:
        return cls(
            name=str(data["name"]),
            command=tuple(str(a) for a in data.get("command") or ()),
            url=str(data.get("url") or ""),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()} or None,
            cwd=data.get("cwd") or None,
        )


@dataclass(frozen=True)
class McpTool:
    """One tool a server lists."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ServerState:
    """Where a server stands; ``message`` says what went wrong and what to do when it is not ready."""

    name: str
    status: str  # one of STATUSES
    message: str = ""
    tools: tuple[McpTool, ...] = ()
