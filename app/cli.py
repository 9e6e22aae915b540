"""Console entry point ``brisk``: the window by default, headless commands by name.

``brisk [--model M]`` opens the window; ``brisk ask|chat|compare|doctor|bench`` run
without Qt (see ``engine.cli``).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from engine.cli import build_parser

    parser = build_parser()
    parser.add_argument("--version", action="store_true", help="print the version, commit and build date")
    args = parser.parse_args(argv)
    if args.version:
        from app.version import describe

        print(describe())
        return 0
    if getattr(args, "func", None) is not None:
        if args.command == "doctor":  # the engine's facts, and whether the window can open here
            from app.qt_libs import doctor_line

            args.window_facts = {"qt libraries": doctor_line()}
        code = int(args.func(args))
        if argv is None:  # the `brisk` process itself: leave now, with the work done and flushed
            # Background threads may still be inside native code (the answer cache's embedding model
            # loading, MCP servers); an ordinary interpreter exit would tear them down and abort.
            from engine.client import finish_writes

            finish_writes()  # a first start's converted copy is written behind the load: keep it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    problem = display_problem()
    if problem:
        print(f"brisk: {problem}", file=sys.stderr)
        return 1
    from app.launch import run_gui

    return run_gui(args.model)


def display_problem() -> str | None:
    """Why a window cannot open here, or None."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "no display found (DISPLAY and WAYLAND_DISPLAY are unset), so the window cannot open. "
        'Use `brisk ask "..."` or `brisk chat` in a terminal, or run under a desktop session or Xvfb.'
    )


if __name__ == "__main__":
    sys.exit(main())
