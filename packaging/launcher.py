"""The bundle's entry point: the same command line as ``brisk`` (the window, ``ask``, ``chat``, ``doctor``...).

``brisk -c CODE ARGS...`` runs CODE as ``python -c`` would: Brisk starts some checks in a child of its own
interpreter (``sys.executable -c``: the quantization modes' probe), and in the bundle that interpreter is
this program.
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    if len(sys.argv) > 2 and sys.argv[1] == "-c":
        code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    from app.cli import main

    sys.exit(main())
