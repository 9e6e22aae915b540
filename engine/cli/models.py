"""``brisk models``: the model library from the command line (what the window's Models view shows).

``brisk models`` lists the models found on disk (``engine.library.scan``): name,
where it was found, architecture, size, quantization, the memory it needs in
Brisk's fp16-cpu mode against this machine's free memory, and whether the fast
path and the native decode step take it, or why it cannot load.  ``--json``
prints one object per line with ``path``, ``source``, ``architecture``,
``format``, ``quant``, ``size_bytes``, ``memory_bytes`` (mode -> bytes),
``fast_path``, ``native_step`` and the rest of ``ModelEntry``.

``brisk models use NAME`` makes a listed model the one the window and the
commands load (Settings ``model``); ``--model NAME`` takes a listed name for one
command.  ``brisk models add FOLDER`` / ``remove FOLDER`` change the folders the
library also scans (``/``, ``/proc``, ``/sys``, ``/dev`` and what lies in them are
refused).  ``brisk models pull REPO [--file NAME | --quant Q4_K_M]``
downloads from the Hugging Face hub into its cache (``engine.library.pull``),
with progress, a disk-space check first, resume and a checksum.
``brisk models drafts [NAME]`` lists the models that can draft for NAME (default:
the model in use).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.cli.common import EXIT_MODEL, EXIT_REQUEST, fail
from engine.model.headers import AS_IS, headline_mode
from engine.storage import Settings


def add_models_parser(sub: Any) -> None:
    models = sub.add_parser("models", help="the models on disk (LM Studio, Ollama, GPT4All, Jan, Hugging Face cache)")
    models.add_argument("--json", action="store_true", help="one JSON object per model, one per line")
    actions = models.add_subparsers(dest="action")
    use = actions.add_parser("use", help="load this listed model from now on (the window and every command)")
    use.add_argument("name")
    add = actions.add_parser("add", help="also scan this folder for models")
    add.add_argument("folder")
    remove = actions.add_parser("remove", help="stop scanning this folder")
    remove.add_argument("folder")
    pull = actions.add_parser("pull", help="download a model from the Hugging Face hub into its cache")
    pull.add_argument("repo", help="a repo id such as bartowski/Qwen2.5-0.5B-Instruct-GGUF")
    which = pull.add_mutually_exclusive_group()
    which.add_argument("--file", default=None, help="the GGUF file to fetch from a repo that holds several")
    which.add_argument("--quant", default=None, help="pick the GGUF file of this quantization (e.g. Q4_K_M)")
    pull.add_argument("--use", action="store_true", help="load it from now on once downloaded")
    drafts = actions.add_parser("drafts", help="models on disk that can draft for NAME (default: the model in use)")
    drafts.add_argument("name", nargs="?", default=None)
    for action in (use, add, remove, pull, drafts):
        action.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON output")
    models.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    as_json = bool(getattr(args, "json", False))
    settings, _ = Settings.load_with_problems()
    if args.action == "add":
        return _folders(settings, args.folder, True, as_json)
    if args.action == "remove":
        return _folders(settings, args.folder, False, as_json)
    if args.action == "pull":
        return _pull(args, settings, as_json)
    from engine.library.scan import drafts_for, lookup, scan

    library = scan(settings.model_folders)
    if args.action == "use":
        entry = lookup(args.name, library)
        if entry is None:
            return fail(_unknown(args.name, library), as_json, EXIT_MODEL)
        if entry.problem:
            return fail(f"{entry.name} cannot be loaded: {entry.problem}", as_json, EXIT_MODEL)
        settings.model = "" if entry.source == "bundled" else entry.path
        settings.save()
        _say({"type": "use", "name": entry.name, "path": entry.path}, f"Brisk now loads {entry.name}.", as_json)
        return 0
    if args.action == "drafts":
        name = args.name or settings.model
        target = lookup(name, library) if name else next((e for e in library.entries if e.source == "bundled"), None)
        if target is None:
            return fail(_unknown(name or "the bundled model", library), as_json, EXIT_MODEL)
        found = drafts_for(target, library)
        if as_json:
            for entry in found:
                print(json.dumps(entry.to_json()))
        elif not found:
            print(
                f"No model on disk shares {target.name}'s vocabulary with fewer parameters, so none can draft for it."
            )
        else:
            print(f"Models that can draft for {target.name} (smallest first):")
            for entry in found:
                print(f"  {entry.name}  {_count(entry.parameters)}  {entry.path}")
        return 0
    if as_json:
        for entry in library.entries:
            print(json.dumps(entry.to_json()))
        return 0
    _table(library, settings)
    return 0


def _unknown(name: str, library: Any) -> str:
    names = ", ".join(e.name for e in library.entries[:8])
    return f"No model named {name!r} in the library (`brisk models` lists them: {names})."


def _say(payload: dict[str, Any], text: str, as_json: bool) -> None:
    print(json.dumps(payload) if as_json else text)


def _folders(settings: Settings, folder: str, add: bool, as_json: bool) -> int:
    from engine.library.scan import system_folder_problem

    try:
        path = str(Path(folder).expanduser().resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop, a NUL in the name
        return fail(f"{folder!r} cannot be used as a folder ({exc}).", as_json, EXIT_REQUEST)
    folders = [f for f in settings.model_folders if f not in (path, folder)]
    if add:
        if problem := system_folder_problem(folder):
            return fail(problem, as_json, EXIT_REQUEST)
        if not Path(path).is_dir():
            return fail(f"{folder} is not a folder.", as_json, EXIT_REQUEST)
        folders.append(path)
    elif len(folders) == len(settings.model_folders):
        return fail(f"{folder} is not one of the library's folders.", as_json, EXIT_REQUEST)
    settings.model_folders = folders
    settings.save()
    _say({"type": "folders", "folders": folders}, f"The library scans {len(folders)} folder(s) of yours.", as_json)
    return 0


def _count(n: int) -> str:
    if n <= 0:
        return "?"
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def _table(library: Any, settings: Settings) -> None:
    if not library.entries:
        print("No models found. `brisk models pull REPO` downloads one; `brisk models add FOLDER` adds a folder.")
        return
    in_use = settings.model
    rows = [("", "Name", "Found in", "Arch", "Params", "Format", "Size", "Needs", "Fast path")]
    notes = []
    for entry in library.entries:
        mark = "*" if (entry.path == in_use or (not in_use and entry.source == "bundled")) else ""
        mode = headline_mode(entry.memory_bytes)  # the file as it is (a GGUF Brisk runs on its blocks), or fp16
        need = entry.memory_bytes.get(mode, 0)
        fits = "" if not need else (" ok" if mode in entry.fits else " too big")
        fits += f" ({'as is' if mode == AS_IS else 'fp16'})" if need else ""
        fast = "fast + native" if entry.native_step else "fast" if entry.fast_path else "slow"
        if entry.problem:
            fast = "cannot load"
            notes.append(f"{entry.name}: {entry.problem}")
        elif entry.support:
            notes.append(f"{entry.name}: {entry.support}")
        fmt = f"{entry.format} {entry.quant}".strip()
        rows.append(
            (
                mark,
                entry.name,
                entry.source,
                entry.architecture or "?",
                _count(entry.parameters),
                fmt,
                _gb(entry.size_bytes),
                (_gb(need) + fits) if need else "?",
                fast,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    widths[1] = min(widths[1], 48)
    for row in rows:
        cells = [str(c)[: widths[i]].ljust(widths[i]) for i, c in enumerate(row)]
        print("  ".join(cells).rstrip())
    print(
        f"\n{len(library.entries)} models, scanned in {library.seconds * 1000:.0f} ms; "
        f"{_gb(library.free_memory_bytes)} of memory free. * = in use."
    )
    for note in notes:
        print(f"  {note}")


def _pull(args: argparse.Namespace, settings: Settings, as_json: bool) -> int:
    from engine.library.pull import PullCancelled, PullError, pull

    last = [0.0]

    def progress(p: Any) -> None:
        now = time.monotonic()
        if as_json:
            if now - last[0] >= 0.5 or p.done_bytes >= p.total_bytes:
                last[0] = now
                print(
                    json.dumps(
                        {
                            "type": "progress",
                            "file": p.file,
                            "done_bytes": p.done_bytes,
                            "total_bytes": p.total_bytes,
                            "speed_bps": p.speed_bps,
                            "eta_s": p.eta_s,
                        }
                    )
                )
            return
        if now - last[0] < 0.2 and p.done_bytes < p.total_bytes:
            return
        last[0] = now
        share = p.done_bytes / p.total_bytes if p.total_bytes else 0.0
        eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
        bar = "#" * int(share * 30)
        sys.stderr.write(
            f"\r[{bar:<30}] {share:6.1%} {_gb(p.done_bytes)} of {_gb(p.total_bytes)} at {_gb(int(p.speed_bps))}/s{eta} "
        )
        sys.stderr.flush()

    cancel = threading.Event()
    try:
        result = pull(args.repo, args.file, args.quant, progress=progress, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        return fail("Download stopped; run the same command again to resume it.", as_json, EXIT_REQUEST)
    except PullCancelled as exc:
        return fail(str(exc), as_json, EXIT_REQUEST)
    except PullError as exc:
        if not as_json:
            sys.stderr.write("\n")
        return fail(str(exc), as_json, EXIT_REQUEST)
    if not as_json:
        sys.stderr.write("\n")
    if args.use:
        settings.model = str(result.path)
        settings.save()
    resumed = f" ({_gb(result.resumed_bytes)} resumed)" if result.resumed_bytes else ""
    _say(
        {
            "type": "pulled",
            "repo": result.repo,
            "path": str(result.path),
            "files": list(result.files),
            "bytes": result.bytes,
            "resumed_bytes": result.resumed_bytes,
        },
        f"Downloaded {result.repo}: {_gb(result.bytes)}{resumed} to {result.path}"
        + ("; Brisk now loads it." if args.use else f". Load it with `brisk models use {result.path}`."),
        as_json,
    )
    return 0
