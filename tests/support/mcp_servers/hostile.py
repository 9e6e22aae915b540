"""A misbehaving MCP server for the hostile suite (stdio): it writes garbage on stdout and sends huge replies.

Run as ``python tests/support/mcp_servers/hostile.py [--garbage N] [--binary] [--flood MB]``.
With ``--garbage N`` it writes N lines that are not MCP messages on stdout
before it starts speaking MCP (``--binary``: lines of bytes that are not
UTF-8), as a server that prints a banner or logs to stdout does (once it runs,
the SDK moves a tool's own prints off stdout); ``--flood MB`` first writes one
line of MB megabytes.  Its tools: ``big`` returns ``megabytes`` of text in one
reply; ``words`` returns ``count`` words of ordinary text (a long result that
still fits one message).
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("hostile")


@app.tool()
def big(megabytes: float = 50.0) -> str:
    """Return ``megabytes`` MB of text in one reply."""
    return "x" * int(megabytes * (1 << 20))


@app.tool()
def words(count: int = 20000) -> str:
    """Return ``count`` words of ordinary text, numbered."""
    return " ".join(f"word{i}" for i in range(count))


if __name__ == "__main__":
    if "--garbage" in sys.argv:
        count = int(sys.argv[sys.argv.index("--garbage") + 1])
        line = b"\xff\xfe not utf-8 \xc0\n" if "--binary" in sys.argv else b"Starting hostile server... ready!\n"
        sys.stdout.buffer.write(line * count)
        sys.stdout.buffer.write(b'{"jsonrpc": "2.0", "method": 12}\n{"half": \n')  # JSON, but not MCP
        sys.stdout.buffer.flush()
    if "--flood" in sys.argv:
        size = int(float(sys.argv[sys.argv.index("--flood") + 1]) * (1 << 20))
        for _ in range(size >> 16):
            sys.stdout.buffer.write(b"z" * (1 << 16))
        sys.stdout.buffer.write(b"\n")
        sys.stdout.buffer.flush()
    app.run()
