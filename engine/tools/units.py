"""The ``units`` tool: unit conversion through pint (its registry, not hand-written tables).

Arguments: ``quantity`` (``"3 miles"``, or ``"3 miles to km"`` / ``"100 degF in
degC"``) and ``to`` (the target unit, when not given in ``quantity``).  pint's
registry is built once, on first use (it takes a fraction of a second).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from engine.tools.registry import Tool, ToolError

MAX_CHARS = 200
_SPLIT = re.compile(r"^(.*\S)\s+(?:to|in|as|->|into)\s+(\S.*)$", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*)$")
_lock = threading.Lock()
_registry: Any = None


def _ureg() -> Any:
    global _registry
    with _lock:
        if _registry is None:
            import pint

            _registry = pint.UnitRegistry(autoconvert_offset_to_baseunit=True)
        return _registry


def convert(quantity: str, to: str | None = None) -> str:
    """``quantity`` converted to ``to`` (or to the unit after "to"/"in" in ``quantity``)."""
    import pint

    if not isinstance(quantity, str) or not quantity.strip() or len(quantity) > MAX_CHARS:
        raise ToolError(f"give a quantity such as '3 miles to km' (at most {MAX_CHARS} characters)")
    if not to:
        match = _SPLIT.match(quantity.strip())
        if match is None:
            raise ToolError(f"say which unit to convert {quantity!r} to, e.g. '{quantity.strip()} to m'")
        quantity, to = match.group(1), match.group(2)
    ureg = _ureg()
    try:
        number = _NUMBER.match(quantity)
        if number and number.group(2):
            value = ureg.Quantity(float(number.group(1)), number.group(2).strip())
        else:
            value = ureg.Quantity(quantity)
        result = value.to(to.strip())
    except pint.DimensionalityError as exc:
        raise ToolError(f"cannot convert {exc.units1} to {exc.units2}: they measure different things") from None
    except pint.UndefinedUnitError as exc:
        names = ", ".join(map(str, exc.unit_names)) if isinstance(exc.unit_names, tuple | list) else exc.unit_names
        raise ToolError(f"unknown unit {names!r}; use names like km, mile, degC, kWh") from None
    except (pint.PintError, ValueError, TypeError, AttributeError, SyntaxError) as exc:
        raise ToolError(f"cannot read {quantity!r} as a quantity: {exc}") from None
    return f"{value:~P} = {result.magnitude:.6g} {result.units:~P}"


def _run(arguments: dict[str, Any]) -> str:
    return convert(arguments.get("quantity", ""), arguments.get("to"))


def units_tool(timeout_s: float = 5.0) -> Tool:
    return Tool(
        name="units",
        description="Convert a quantity between units, e.g. '3 miles to km', '100 degF in degC', '2 kWh to J'.",
        parameters={
            "type": "object",
            "properties": {
                "quantity": {"type": "string", "description": "a number and unit, optionally 'to UNIT'"},
                "to": {"type": "string", "description": "the unit to convert to"},
            },
            "required": ["quantity"],
        },
        fn=_run,
        timeout_s=timeout_s,
    )
