"""A small MCP server for tests (stdio): ``add``, ``slow_echo``, ``fail`` and ``crash``.

Run as ``python tests/support/mcp_servers/demo.py``.  ``crash`` ends the process in the
middle of a call, as a server that dies would.  With ``--crash-at-start`` the
process writes a message to stderr and exits before speaking MCP; with
``--hang-at-start`` it never answers.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

app = MCPServer("demo")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@app.tool()
def slow_echo(text: str, seconds: float = 0.2) -> str:
    """Wait ``seconds``, then return ``text``."""
    time.sleep(seconds)
    return text


@app.tool()
def fail(reason: str) -> str:
    """Always fail with ``reason``."""
    raise ValueError(reason)


@app.tool()
def crash() -> str:
    """End the server process in the middle of this call."""
    os._exit(3)


if __name__ == "__main__":
    if "--crash-at-start" in sys.argv:
        print("demo server: cannot open its database (on purpose)", file=sys.stderr)
        sys.exit(2)
    if "--hang-at-start" in sys.argv:
        time.sleep(3600)
    app.run()
