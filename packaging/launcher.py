"""The bundle's entry point: the same command line as ``brisk`` (the window, ``ask``, ``chat``, ``doctor``...)."""

import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
