"""What the Models view shows for each model on disk, and the download line: plain Python, no Qt.

:func:`model_rows` turns the library's entries (``engine.library.scan.ModelEntry``,
read by attribute) into table rows: the cells, a tooltip, whether the row can
be loaded, and whether it is the model in use.  :func:`speed_cell` says which
of Brisk's paths runs the model; :func:`memory_cell` what it needs in the mode
Brisk picks first on a CPU (fp16) against the free memory.  :func:`progress_text`
is the download's one line: bytes, speed, time left.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.state.model_facts import count_text, size_text

COLUMNS = ("Name", "Found in", "Architecture", "Parameters", "Format", "Size", "Memory (fp16)", "Speed")
SOURCE_NAMES = {
    "bundled": "Bundled with Brisk",
    "huggingface": "Hugging Face cache",
    "lmstudio": "LM Studio",
    "gpt4all": "GPT4All",
    "jan": "Jan",
    "ollama": "Ollama",
    "folder": "Your folder",
}
SOURCES = ("bundled", "huggingface", "lmstudio", "gpt4all", "jan", "ollama", "folder")  # engine.library.scan's order
MODE = "fp16-cpu"
AS_IS = "gguf"  # a GGUF file Brisk runs on its own blocks: its memory as it is (engine.model.headers.AS_IS)


@dataclass(frozen=True)
class ModelRow:
    cells: tuple[str, ...]
    tooltip: str
    path: str  # what Settings.model takes ("" for the bundled model)
    loadable: bool
    in_use: bool
    entry: Any


def speed_cell(entry: Any) -> str:
    if getattr(entry, "problem", ""):
        return "Cannot load"
    if getattr(entry, "native_step", False):
        return "Fast path + native step"
    if getattr(entry, "fast_path", False):
        return "Fast path"
    return "Slower (transformers)"


def memory_cell(entry: Any) -> str:
    needs = dict(getattr(entry, "memory_bytes", {}) or {})
    mode = AS_IS if AS_IS in needs else MODE
    need = needs.get(mode, 0)
    if not need:
        return "unknown"
    fits = mode in (getattr(entry, "fits", ()) or ())
    return size_text(need) + ("" if fits else " (too big)")


def settings_path_of(entry: Any) -> str:
    return "" if getattr(entry, "source", "") == "bundled" else str(getattr(entry, "path", ""))


def in_use(entry: Any, model_setting: str) -> bool:
    if getattr(entry, "source", "") == "bundled":
        return not model_setting
    path = str(getattr(entry, "path", ""))
    return bool(model_setting) and (model_setting in (path, getattr(entry, "name", "")) or _same(model_setting, path))


def _same(a: str, b: str) -> bool:
    try:
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def tooltip(entry: Any) -> str:
    lines = [str(getattr(entry, "path", ""))]
    needs = dict(getattr(entry, "memory_bytes", {}) or {})
    if needs:
        lines.append("Memory: " + ", ".join(f"{mode} {size_text(n)}" for mode, n in needs.items()))
    context = int(getattr(entry, "context", 0) or 0)
    if context:
        lines.append(f"Context: {context:,} tokens")
    problem, support = getattr(entry, "problem", ""), getattr(entry, "support", "")
    if problem:
        lines.append(f"Cannot load: {problem}")
    elif support:
        lines.append(support)
    return "\n".join(lines)


def model_rows(entries: Iterable[Any], model_setting: str, text_filter: str = "") -> list[ModelRow]:
    """Rows for ``entries``; ``text_filter`` keeps those whose name, source, architecture or quantization has it."""
    wanted = text_filter.strip().lower()
    rows = []
    for entry in entries:
        fmt = f"{getattr(entry, 'format', '')} {getattr(entry, 'quant', '')}".strip()
        source = SOURCE_NAMES.get(getattr(entry, "source", ""), getattr(entry, "source", ""))
        params = int(getattr(entry, "parameters", 0) or 0)
        cells = (
            str(getattr(entry, "name", "")),
            source,
            str(getattr(entry, "architecture", "") or "unknown"),
            count_text(params) if params else "unknown",
            fmt or "unknown",
            size_text(int(getattr(entry, "size_bytes", 0) or 0)),
            memory_cell(entry),
            speed_cell(entry),
        )
        if wanted and not any(wanted in c.lower() for c in (cells[0], cells[1], cells[2], cells[4])):
            continue
        rows.append(
            ModelRow(
                cells,
                tooltip(entry),
                settings_path_of(entry),
                not getattr(entry, "problem", ""),
                in_use(entry, model_setting),
                entry,
            )
        )
    return rows


def progress_text(done: int, total: int, speed_bps: float, eta_s: float | None) -> str:
    """``"12.0 MB of 94.0 MB · 5.1 MB/s · 17 s left"``."""
    parts = [f"{size_text(done)} of {size_text(total)}" if total else size_text(done)]
    if speed_bps > 0:
        parts.append(f"{size_text(speed_bps)}/s")
    if eta_s is not None and done < total:
        parts.append(f"{eta_s:.0f} s left" if eta_s < 120 else f"{eta_s / 60:.0f} min left")
    return " \u00b7 ".join(parts)
