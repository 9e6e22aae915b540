"""Which quantization modes this machine can run, asked of a child process (no Qt).

:func:`quant_choices` returns ``engine.quant.MODES`` with, for each mode, the
reason it cannot run on the chosen device (``None``: usable), from
``engine.quant.availability(torch.device(...))``.  ``device_name`` is the
Settings value: ``cuda``, ``cpu``, or ``auto`` (CUDA when it is available, as
the loader decides).

The check runs in a child Python process, not in the GUI's: it imports torch
and probes back-ends such as bitsandbytes (whose import pulls in torch.compile
and dynamo), seconds of Python work that would hold the GIL and make the
window stutter if done on a thread here, and it keeps torch out of the GUI
process until the engine needs it.  The child runs at the lowest CPU priority
(nice 19): opened while a reply decodes, it takes only the CPU the reply leaves.
Callers run it in the background; answers
are cached per device for the session, and checks run one at a time.  When
the child fails (no ``engine.quant``, no torch, a probe that breaks) only
``none`` is offered, with the reason.  :func:`quant_descriptions` gives, from the same
check, what each mode does (``engine.quant.descriptions``: one line for a tooltip, with a
caveat such as int4-cpu's where a mode has one); :func:`quant_check` gives both at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

QUANT_MODULE = "engine.quant"
QUANT_UNAVAILABLE = "Quantization is unavailable in this installation"
TIMEOUT_S = 120
ROOT = Path(__file__).resolve().parent.parent

Choices = list[tuple[str, str | None]]

_PROBE = """
import importlib, json, os, sys
if hasattr(os, "nice"):
    os.nice(19)  # seconds of imports and probes: a reply being decoded meanwhile keeps the CPU
import torch
quant = importlib.import_module(sys.argv[1])
name = sys.argv[2]
use_cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
reasons = quant.availability(torch.device("cuda" if use_cuda else "cpu"))
described = getattr(quant, "descriptions", dict)()
print(json.dumps([[mode, reasons.get(mode), described.get(mode)] for mode in quant.MODES]))
"""
_lock = threading.Lock()
_cache: dict[tuple[str, str], Choices] = {}
_descriptions: dict[str, dict[str, str]] = {}  # QUANT_MODULE -> mode -> what it does (the same on every device)


def quant_choices(device_name: str) -> Choices:
    key = (QUANT_MODULE, device_name)
    with _lock:
        if key not in _cache:
            choices, complete = _probe(device_name)
            if not complete:
                return choices
            _cache[key] = choices
        return list(_cache[key])


def quant_descriptions(device_name: str) -> dict[str, str]:
    """mode -> one line saying what it does, with its caveat (``engine.quant.descriptions``), for a
    tooltip; from the same check as :func:`quant_choices` (run now unless it already ran); empty
    when the check failed or the module describes nothing."""
    return quant_check(device_name)[1]


def quant_check(device_name: str) -> tuple[Choices, dict[str, str]]:
    """:func:`quant_choices` and :func:`quant_descriptions` from one check (a failed check is not run twice)."""
    choices = quant_choices(device_name)
    with _lock:
        return choices, dict(_descriptions.get(QUANT_MODULE, {}))


def _probe(device_name: str) -> tuple[Choices, bool]:
    """The choices, and whether the check completed (only those are cached)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, QUANT_MODULE, device_name],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=ROOT,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [("none", f"{QUANT_UNAVAILABLE}: the check did not finish ({exc}).")], False
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        why = lines[-1] if lines else f"the check exited with code {done.returncode}"
        return [("none", f"{QUANT_UNAVAILABLE}: {why}.")], True
    try:
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        _descriptions[QUANT_MODULE] = {str(row[0]): str(row[2]) for row in rows if len(row) > 2 and row[2]}
        return [(str(row[0]), None if row[1] is None else str(row[1])) for row in rows], True
    except (ValueError, IndexError, TypeError) as exc:
        return [("none", f"{QUANT_UNAVAILABLE}: the check answered something unexpected ({exc}).")], False
