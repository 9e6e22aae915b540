"""Tools the user enables (built in and from MCP servers), parsed from model output or slash lines, run in parallel.

The public surface: :class:`Tool`, :class:`Registry`, :class:`ToolError`,
:func:`tool_schemas` (for ``apply_chat_template(tools=...)``), the parsers
:func:`parse_model_output` and :func:`parse_slash_lines` (giving :class:`Call`),
the runner :func:`run_calls` / :func:`run_calls_async` (giving a
:class:`TurnResult` and ``engine.api.ToolCall`` events), the message helpers
in :mod:`engine.tools.run`, :func:`builtin_tools`, and :class:`McpHub` with
:class:`ServerSpec` for MCP servers (imported lazily: ``engine.tools.mcp_client``).
"""

from __future__ import annotations

from engine.tools.builtin import BUILTIN_NAMES, DEFAULT_ENABLED, builtin_tools
from engine.tools.parse import Call, Parsed, parse_model_output, parse_slash_lines
from engine.tools.registry import Registry, Tool, ToolError, check_arguments, tool_schemas
from engine.tools.run import (
    CallResult,
    TurnResult,
    assistant_message,
    result_messages,
    results_as_text,
    run_calls,
    run_calls_async,
)

__all__ = [
    "BUILTIN_NAMES",
    "DEFAULT_ENABLED",
    "Call",
    "CallResult",
    "Parsed",
    "Registry",
    "Tool",
    "ToolError",
    "TurnResult",
    "assistant_message",
    "builtin_tools",
    "check_arguments",
    "parse_model_output",
    "parse_slash_lines",
    "result_messages",
    "results_as_text",
    "run_calls",
    "run_calls_async",
    "tool_schemas",
]
