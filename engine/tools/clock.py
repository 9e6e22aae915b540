"""The ``clock`` tool: the time now in any IANA time zone, and date arithmetic.

Arguments: ``zone`` (IANA name such as ``Asia/Tokyo``; default UTC), ``date``
(ISO 8601; default now), ``add_days`` / ``add_hours`` / ``add_minutes`` (added
to the date) and ``until`` (ISO 8601: the difference from the date to it).
Dates without a zone are read in ``zone``.  Zones come from :mod:`zoneinfo`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.tools.registry import Tool, ToolError

MAX_DAYS = 3_650_000  # about 10,000 years either way


def _zone(name: object) -> dt.tzinfo:
    if name in (None, "", "UTC", "utc", "Z"):
        return dt.UTC
    if not isinstance(name, str):
        raise ToolError(f"zone must be an IANA time zone name such as Europe/Paris, not {name!r}")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {name!r}; use an IANA name such as Europe/Paris or Asia/Tokyo") from None


def _parse(text: object, zone: dt.tzinfo, what: str) -> dt.datetime:
    if not isinstance(text, str) or not text.strip():
        raise ToolError(f"{what} must be an ISO 8601 date such as 2025-03-14 or 2025-03-14T15:09")
    raw = text.strip()
    try:
        value = dt.datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)
    except ValueError:
        raise ToolError(f"{what} {text!r} is not an ISO 8601 date such as 2025-03-14 or 2025-03-14T15:09") from None
    return value.replace(tzinfo=zone) if value.tzinfo is None else value.astimezone(zone)


def _show(value: dt.datetime) -> str:
    offset = value.strftime("%z")
    return f"{value:%Y-%m-%d %H:%M:%S} {value.tzname()} (UTC{offset[:3]}:{offset[3:]}), {value:%A}"


def _span(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else ""
    days, rest = divmod(abs(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{days} days {hours} h {minutes} min {secs} s ({delta.total_seconds() / 86400:.4g} days)"


def run_clock(arguments: dict[str, Any], now: Callable[[], dt.datetime] | None = None) -> str:
    """The clock's answer for ``arguments``; ``now`` (an aware datetime) is for tests."""
    zone = _zone(arguments.get("zone"))
    current = (now or (lambda: dt.datetime.now(dt.UTC)))().astimezone(zone)
    base = _parse(arguments["date"], zone, "date") if arguments.get("date") else current
    lines = [f"now: {_show(current)}"] if not arguments.get("date") else [f"date: {_show(base)}"]
    deltas = {k: arguments.get(f"add_{k}") or 0 for k in ("days", "hours", "minutes")}
    for key, amount in deltas.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ToolError(f"add_{key} must be a number, not {amount!r}")
    shift = dt.timedelta(**deltas)
    if abs(shift.days) > MAX_DAYS:
        raise ToolError(f"that shift is too large; the limit is {MAX_DAYS} days")
    if shift:
        try:
            # wall-clock arithmetic in the zone, then normalised (DST changes the offset, not the hour)
            shifted = (base.replace(tzinfo=None) + shift).replace(tzinfo=zone)
            shifted = shifted.astimezone(dt.UTC).astimezone(zone)
        except OverflowError:
            raise ToolError("the resulting date is out of range (years 1 to 9999)") from None
        lines.append(f"plus {_span(shift)}: {_show(shifted)}")
        base = shifted
    if arguments.get("until"):
        end = _parse(arguments["until"], zone, "until")
        lines.append(f"until {_show(end)}: {_span(end.astimezone(dt.UTC) - base.astimezone(dt.UTC))}")
    return "\n".join(lines)


def clock_tool(timeout_s: float = 2.0) -> Tool:
    number = {"type": "number"}
    return Tool(
        name="clock",
        description=(
            "The current date and time in an IANA time zone, and date arithmetic: add days, hours or minutes "
            "to a date, or the time between two dates."
        ),
        parameters={
            "type": "object",
            "properties": {
                "zone": {"type": "string", "description": "IANA time zone, e.g. Asia/Tokyo (default UTC)"},
                "date": {"type": "string", "description": "ISO 8601 date to start from (default: now)"},
                "add_days": {**number, "description": "days to add (may be negative)"},
                "add_hours": {**number, "description": "hours to add"},
                "add_minutes": {**number, "description": "minutes to add"},
                "until": {"type": "string", "description": "ISO 8601 date: report the time from the date to it"},
            },
            "required": [],
        },
        fn=run_clock,
        timeout_s=timeout_s,
    )
