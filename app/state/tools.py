"""The user's tools in plain Python (no Qt): what is enabled, what the engine is given, how calls are shown.

* :data:`BUILTIN`: the built-in tools (``engine.tools.BUILTIN_NAMES``) with a
  line each for the tools dialog; kept here so the window never imports the
  tools' libraries at start-up (a test checks the names match).
* :func:`enabled_tools` (``Request.tools``), :func:`tool_settings` and
  :func:`answer_cache_settings` (what the local backend is built with) read
  :class:`~engine.storage.Settings`.
* :func:`probe_server` starts one MCP server (a command line or an http(s)
  URL) through ``engine.tools.mcp_client``, lists its tools and stops it; it
  blocks, so the dialog calls it on a worker thread.  It never raises: a
  server that fails is a :class:`ServerProbe` with ``status="failed"`` and the
  hub's message.
* :func:`call_record` turns a ``ToolCall`` event into the dict saved with the
  reply (``metrics["tool_calls"]``); :func:`calls_from_metrics` reads them back
  (damaged entries are skipped); :func:`tools_text` is the collapsible section
  shown under a reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.api import AnswerCacheSettings, ToolCall, ToolSettings
from engine.client import probe_tool_server
from engine.storage import Settings

BUILTIN: dict[str, str] = {
    "calculator": "Exact arithmetic (+ - * / ** %, functions); no code runs",
    "clock": "The time now in any time zone, and date arithmetic",
    "units": "Converts between units (km to miles, \u00b0C to \u00b0F, ...)",
    "files": "Searches and reads text files, only inside the folders granted below",
    "fetch": "Downloads a web page (http/https); off unless you turn it on",
}
RESULT_CHARS = 600  # the most of a result shown in the conversation (the whole text stays stored)
FOLDED_CHARS = 60  # a result this short, on one line, stays on its call's line while the section is folded
PROBE_TIMEOUT_S = 20.0


def enabled_tools(settings: Settings) -> tuple[str, ...]:
    """The tool names a request carries: the enabled ones, in order, once each."""
    return tuple(dict.fromkeys(settings.tools_enabled))


def tool_settings(settings: Settings) -> ToolSettings:
    return ToolSettings(
        granted_dirs=tuple(settings.granted_dirs),
        fetch_allow_private=settings.fetch_allow_private,
        mcp_servers=tuple(settings.mcp_servers),
    )


def answer_cache_settings(settings: Settings) -> AnswerCacheSettings:
    """The engine's cache stays on; the panel's switch decides per request (``Request.answer_cache``)."""
    return AnswerCacheSettings(
        threshold=settings.answer_cache_threshold, ttl_s=settings.answer_cache_ttl_days * 24 * 3600.0
    )


def backend_changes(old: Settings, new: Settings) -> bool:
    """Whether the backend's tool settings differ (granted folders, private fetch, MCP servers)."""
    return tool_settings(old) != tool_settings(new)


# -- MCP servers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerProbe:
    target: str
    status: str  # "running" | "failed" | "checking"
    message: str = ""
    tools: tuple[tuple[str, str], ...] = ()  # (name as offered, description)


def probe_server(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> ServerProbe:
    """Start the MCP server ``target``, list its tools, stop it (blocks up to about ``timeout_s``)."""
    status, message, tools = probe_tool_server(target, timeout_s, taken=lambda name: name in BUILTIN)
    return ServerProbe(target, status, message, tuple((t.name, t.description) for t in tools))


# -- tool calls in the conversation ------------------------------------------------------------------


def call_record(call: ToolCall) -> dict[str, Any]:
    """One call as saved with its reply (JSON-ready)."""
    return {
        "name": call.name,
        "arguments": dict(call.arguments),
        "start": call.start,
        "end": call.end,
        "ok": call.ok,
        "result": call.result,
    }


def calls_from_metrics(metrics: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The calls saved in a reply's metrics; entries without a name or times are skipped."""
    raw = metrics.get("tool_calls") if isinstance(metrics, Mapping) else None
    out: list[dict[str, Any]] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        start, end = entry.get("start"), entry.get("end")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (start, end)):
            continue
        arguments = entry.get("arguments")
        out.append(
            {
                "name": entry["name"],
                "arguments": dict(arguments) if isinstance(arguments, Mapping) else {},
                "start": float(start),  # type: ignore[arg-type]
                "end": float(end),  # type: ignore[arg-type]
                "ok": entry.get("ok") is not False,
                "result": str(entry.get("result", "")),
            }
        )
    return out


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def tools_header(calls: Sequence[Mapping[str, Any]], expanded: bool) -> str:
    """The clickable line over a reply's calls, e.g. ``▸ 3 tool calls · 0.40 s (0.90 s one after another)``."""
    if not calls:
        return ""
    wall = max(c["end"] for c in calls) - min(c["start"] for c in calls)
    sequential = sum(c["end"] - c["start"] for c in calls)
    failed = sum(1 for c in calls if not c["ok"])
    count = f"{len(calls)} tool call" + ("s" if len(calls) != 1 else "")
    arrow = "\u25be" if expanded else "\u25b8"
    line = f"{arrow} {count} \u00b7 {_seconds(wall)}"
    if len(calls) > 1:
        line += f" ({_seconds(sequential)} one after another)"
    if failed:
        line += f" \u00b7 {failed} failed"
    return line


def call_line(call: Mapping[str, Any]) -> str:
    """``✓ calculator {"expression": "2*3"} · 1 ms``."""
    mark = "\u2713" if call["ok"] else "\u2717"
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return f"{mark} {call['name']} {arguments} \u00b7 {_seconds(call['end'] - call['start'])}"


def tools_text(calls: Sequence[Mapping[str, Any]], expanded: bool) -> str:
    """The section's body: one line per call, and when expanded each result (or error) under it.  Folded, a
    short one-line result stays at the end of its call's line (``… · 6 ms → 7006652``): the value a user asked
    for with ``/calculator`` is in view even when the model's reply garbles it."""
    lines: list[str] = []
    for call in calls:
        lines.append(call_line(call))
        short = str(call["result"]).strip()
        if not expanded and short and call["ok"] and "\n" not in short and len(short) <= FOLDED_CHARS:
            lines[-1] += f" \u2192 {short}"
        if expanded:
            result = str(call["result"]).strip() or "(no output)"
            if len(result) > RESULT_CHARS:
                result = result[:RESULT_CHARS] + f"\u2026 ({len(result) - RESULT_CHARS} more characters)"
            label = "\u2192 " if call["ok"] else "\u2192 error: "
            lines.append(label + result.replace("\n", "\n   "))
    return "\n".join(lines)
