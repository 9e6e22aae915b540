"""Which Brisk this is: the installed version and, in a git checkout, the commit (for About and bug reports).

:func:`version` reads the installed package's metadata (``pyproject.toml``'s version); :func:`commit` asks
git for the checkout's short commit, with a star when files differ from it, and is ``None`` outside a
checkout or without git.  A bundle (``packaging/``) carries both, and its build date, in
``build_info.json`` beside this module, written when it was packaged (:func:`build_info`).
:func:`describe` is the one line About and ``brisk --version`` show.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


BUILD_INFO = Path(__file__).resolve().parent / "build_info.json"


@functools.cache
def build_info() -> dict[str, str]:
    """The bundle's version, commit and build date (empty outside a bundle)."""
    import json

    try:
        data = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@functools.cache
def version() -> str:
    if build_info().get("version"):
        return build_info()["version"]
    try:
        return importlib.metadata.version("brisk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


@functools.cache
def commit() -> str | None:
    if build_info().get("commit"):
        return build_info()["commit"]
    if not (ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=3
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=3,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    return head.stdout.strip() + ("*" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def describe() -> str:
    """``Brisk 0.1.0 · commit 769086e`` (a star: changed since that commit), or without the commit."""
    found, built = commit(), build_info().get("built")
    parts = [f"Brisk {version()}", f"commit {found}" if found else "", f"built {built}" if built else ""]
    return " \u00b7 ".join(p for p in parts if p)
