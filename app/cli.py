"""Console entry point ``brisk``: the window by default, headless commands by name.

``brisk [--model M]`` opens the window; ``brisk ask|chat|doctor|bench`` run
without Qt (see ``engine.cli``).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from engine.cli import build_parser

    args = build_parser().parse_args(argv)
    if getattr(args, "func", None) is not None:
        return int(args.func(args))
    from app.main_window import run_gui

    return run_gui(args.model)


if __name__ == "__main__":
    sys.exit(main())
