"""Where the window's parts go: default proportions, the View menu, and the layout remembered across starts.

:data:`CHAT_SHARE` is the least share of the window's width the chat column keeps
by default (sidebar and latency panel share the rest); :func:`default_widths`
computes the sidebar and panel widths for a window width, and at widths where
the panel would leave the chat less than that the panel starts closed (View >
Latency panel, or Ctrl+Shift+L, opens it).

:class:`LayoutFile` keeps the window's geometry and its docks' state
(``QMainWindow.saveGeometry`` / ``saveState``) in ``window.json`` in the data
folder, written by rename; a damaged file is moved aside by
:func:`engine.datafiles.load_state` and the defaults are used.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.storage import StateError, atomic_write, data_dir, load_state

log = logging.getLogger("brisk.layout")

CHAT_SHARE = 0.6  # the chat column keeps at least this share of the window's width by default
SIDEBAR_WIDTH = 180
PANEL_WIDTH = 300  # the latency panel's default width where the chat keeps its share; at least PANEL_MIN
PANEL_MIN = 240
FRAMES = 12  # the splitter's handle and the dock's separator
LAYOUT_FILE = "window.json"
LAYOUT_VERSION = 2  # 2: the parameters panel joined the latency panel on the right
PANEL_SHORTCUT = "Ctrl+Shift+L"
PARAMETERS_SHORTCUT = "Ctrl+Shift+P"


def default_widths(window_width: int) -> tuple[int, int | None]:
    """(sidebar width, panel width or None when the panel should start closed) for ``window_width``."""
    room = int(window_width * (1 - CHAT_SHARE))  # what the sidebar and the panel may take together
    sidebar = SIDEBAR_WIDTH  # its least width
    panel = min(PANEL_WIDTH, room - sidebar - FRAMES)
    return sidebar, panel if panel >= PANEL_MIN else None


@dataclass(frozen=True)
class SavedLayout:
    geometry: bytes
    state: bytes


def _check(value: Any) -> SavedLayout:
    if not isinstance(value, dict) or value.get("version") != LAYOUT_VERSION:
        raise StateError("not a window layout of this version")
    try:
        geometry = base64.b64decode(str(value["geometry"]), validate=True)
        state = base64.b64decode(str(value["state"]), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise StateError(f"not base64: {exc}") from exc
    return SavedLayout(geometry, state)


class LayoutFile:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or data_dir() / LAYOUT_FILE

    def load(self) -> SavedLayout | None:
        return load_state(self.path, _check)

    def save(self, geometry: bytes, state: bytes) -> None:
        text = json.dumps(
            {
                "version": LAYOUT_VERSION,
                "geometry": base64.b64encode(geometry).decode("ascii"),
                "state": base64.b64encode(state).decode("ascii"),
            }
        )
        try:
            atomic_write(self.path, text)
        except OSError as exc:  # only the layout is lost: the next start uses the defaults
            log.warning("Could not keep the window's layout in %s (%s).", self.path, exc)
