"""The built-in tools, built from the user's settings.

:func:`builtin_tools` returns ``calculator``, ``clock``, ``units``, ``files``
and ``fetch``; none is enabled by this module (the registry decides), and
``fetch`` is meant to stay off unless the user turns it on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.tools.calculator import calculator_tool
from engine.tools.clock import clock_tool
from engine.tools.fetch import fetch_tool
from engine.tools.files import files_tool
from engine.tools.registry import Tool
from engine.tools.units import units_tool

BUILTIN_NAMES: tuple[str, ...] = ("calculator", "clock", "units", "files", "fetch")
DEFAULT_ENABLED: tuple[str, ...] = ("calculator", "clock", "units")  # files needs a granted folder; fetch is off


def builtin_tools(granted: Iterable[str | os.PathLike[str]] = (), *, fetch_allow_private: bool = False) -> list[Tool]:
    """Fresh built-in tools; ``files`` reads only in ``granted``, ``fetch`` refuses local addresses unless allowed."""
    return [
        calculator_tool(),
        clock_tool(),
        units_tool(),
        files_tool(granted),
        fetch_tool(allow_private=fetch_allow_private),
    ]
