"""Which Brisk this is: the installed version and, in a git checkout, the commit (for About and bug reports).

:func:`version` reads the installed package's metadata (``pyproject.toml``'s version); :func:`commit` asks
git for the checkout's short commit, with a star when files differ from it, and is ``None`` outside a
checkout (an installed bundle) or without git.  :func:`describe` is the one line About shows.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def version() -> str:
    try:
        return importlib.metadata.version("brisk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


@functools.cache
def commit() -> str | None:
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
    found = commit()
    return f"Brisk {version()}" + (f" \u00b7 commit {found}" if found else "")
