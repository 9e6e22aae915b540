"""Small MCP servers that tests start over stdio."""
