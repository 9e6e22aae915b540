"""Tests of ``engine.tools``: built-in tools, parsers, the concurrent runner and MCP servers."""
