"""Helpers shared by the tests: the tiny model, the engine runner, the CLI runner, the GUI harness and fakes,
the replay server and its recorded streams, MCP servers; ``ROOT``, the repository root."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of the child processes that tests start."""
