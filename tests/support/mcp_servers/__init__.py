"""Small MCP servers that tests start over stdio: ``DEMO`` is the path of the demo server's script."""

from pathlib import Path

DEMO = Path(__file__).with_name("demo.py")
