"""Converting a stranger's files in a child process, each within a deadline, so no parser can hang Brisk.

:class:`Reader` runs :func:`engine.documents.convert.convert` in a child of this interpreter
(``sys.executable -c``, which the bundle's launcher runs too), one file at a time, and keeps the child for
the next file.  ``Reader.convert(path, ...)`` returns the same :class:`~engine.documents.convert.Converted`
or raises the same :class:`~engine.documents.convert.DocumentError` as ``convert``, with three more
outcomes, each one sentence naming the file:

* the file took longer than ``deadline_s`` (default :data:`DEADLINE_S`): the child is killed, the file is
  skipped, and the next file gets a new child;
* ``cancel()`` came true (checked every 0.1 s while the child works): the child is killed, and
  :class:`~engine.documents.convert.Cancelled` is raised;
* the child died (out of memory, a crash in a parser's C code): the file is skipped, the caller goes on.

The child's memory is capped at :data:`MEMORY_BYTES` where the system allows it, and it exits by itself
once the file it reads passes the deadline by :data:`GRACE_S` or its parent is gone (a ``kill -9``), so
no orphan keeps parsing.  Requests and answers are JSON lines on its stdin and stdout; progress (a PDF's
pages) comes back as it happens.

Why a child, not a time check between pages: the slow parts are single library calls that no check can
interrupt (mammoth parsing one ``document.xml``: 143 s for 20 MB; pypdf parsing one page's instructions:
2.5 s for 5 MB).  What it costs, measured by ``python -m engine.documents.worker FILES...`` on the
2-core machine (shared, three runs): 200 small Markdown files took 15 ms in process and 117-164 ms through
one child, 63-85 ms of it the start and the first file, so about 0.3 ms a file after that; a 3-page PDF and
a 2 MB-of-XML DOCX took 8.8 s in process and 8.0 s through the child (the start is lost in the parsing).
One :class:`Reader` serves one ``attach`` (a folder is one), so a child starts once per attach.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from engine.documents.convert import Cancelled, Converted, DocumentError, convert

DEADLINE_S = 120.0
GRACE_S = 5.0
MEMORY_BYTES = 4 << 30
POLL_S = 0.1
_CHILD = "from engine.documents.worker import serve; serve()"


class Reader:
    """Converts files in a child process (see the module docstring); close it, or use it as a context manager."""

    def __init__(self, deadline_s: float = DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._child: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._lock = threading.Lock()  # one file at a time per child

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def convert(
        self,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
        cancel: Callable[[], bool] | None = None,
        inside: str | os.PathLike[str] | None = None,
    ) -> Converted:
        """``convert(path, ...)`` in the child, bounded by the deadline; raises DocumentError (or Cancelled)."""
        name = Path(path).name or str(path)
        if cancel is not None and cancel():
            raise Cancelled(f"Attaching {name} was cancelled.")
        with self._lock:
            child = self._start(name)
            request = {"path": os.fspath(path), "inside": None if inside is None else os.fspath(inside)}
            try:
                assert child.stdin is not None
                child.stdin.write(json.dumps(request).encode() + b"\n")
                child.stdin.flush()
            except OSError as exc:  # the child died between two files
                self._stop()
                raise DocumentError(f"{name} could not be read: the reader stopped ({exc}); try again.") from exc
            return self._answer(name, progress, cancel)

    def _answer(
        self, name: str, progress: Callable[[int, int], None] | None, cancel: Callable[[], bool] | None
    ) -> Converted:
        deadline = time.monotonic() + self.deadline_s
        while True:
            if cancel is not None and cancel():
                self._stop()
                raise Cancelled(f"Attaching {name} was cancelled.")
            if time.monotonic() > deadline:
                self._stop()
                raise DocumentError(
                    f"{name} took longer than {self.deadline_s:.0f} s to read, so it was skipped; if it is very"
                    " large, split it or save it as plain text and attach that."
                )
            try:
                line = self._lines.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if line is None:  # the child ended: out of memory, or a crash in a parser
                raise DocumentError(
                    f"{name} could not be read: the reader stopped ({self._stop()}) while reading it; it may be"
                    " damaged or too large, so open it, save a smaller copy and attach that."
                )
            answer = json.loads(line.decode("utf-8", "surrogatepass"))
            if "progress" in answer:
                if progress is not None:
                    progress(*answer["progress"])
            elif "error" in answer:
                raise (Cancelled if answer.get("cancelled") else DocumentError)(str(answer["error"]))
            else:
                fields = answer["converted"]
                for key in ("notes", "page_starts"):
                    fields[key] = tuple(fields[key])
                return Converted(**fields)

    def _start(self, name: str) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # where ``engine`` is, for a child started elsewhere
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(self.deadline_s + GRACE_S)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # pypdf's warnings about odd files; every answer comes on stdout
                env=env,
            )
        except OSError as exc:
            raise DocumentError(f"{name} could not be read: the reader could not start ({exc}).") from exc
        self._child, self._lines = child, queue.Queue()
        threading.Thread(target=_pump, args=(child.stdout, self._lines), daemon=True, name="document-reader").start()
        return child

    def _stop(self) -> str:
        """Kill the child (the next file starts another); how it ended, in words."""
        child, self._child = self._child, None
        if child is None:
            return "it was not running"
        if child.poll() is None:
            child.kill()
        code = child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
        return f"signal {-code}" if code < 0 else f"exit code {code}"

    def close(self) -> None:
        """End the child: it exits at the end of its input."""
        with self._lock:
            child, self._child = self._child, None
            if child is None:
                return
            try:
                if child.stdin is not None:
                    child.stdin.close()
                child.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def _pump(stream: IO[bytes] | None, lines: queue.Queue[bytes | None]) -> None:
    """Pass the child's answer lines to the parent's queue; None at its end."""
    assert stream is not None
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):  # closed by _stop
        pass
    lines.put(None)


# -- the child -----------------------------------------------------------------------------------------------


def serve() -> None:
    """The child's loop: one JSON request a line on stdin, JSON answers on stdout (see :class:`Reader`)."""
    limit_s = float(sys.argv[1]) if len(sys.argv) > 1 else DEADLINE_S + GRACE_S
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing a library prints can break an answer
    _cap_memory()
    busy: list[float] = []  # when the file being read was started
    threading.Thread(target=_watch, args=(os.getppid(), busy, limit_s), daemon=True).start()

    def send(answer: dict[str, Any]) -> None:
        out.write(json.dumps(answer, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
        out.flush()

    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        busy[:] = [time.monotonic()]
        try:
            done = convert(
                request["path"], inside=request.get("inside"), progress=lambda d, n: send({"progress": [d, n]})
            )
            send({"converted": done.__dict__})
        except Cancelled as exc:
            send({"error": str(exc), "cancelled": True})
        except DocumentError as exc:
            send({"error": str(exc)})
        except MemoryError:
            name = Path(request["path"]).name
            send({"error": f"{name} needs more memory to read than Brisk gives one file, so it was skipped."})
        except RecursionError:
            name = Path(request["path"]).name
            send({"error": f"{name} is nested too deeply to read, so it was skipped; it may be damaged."})
        except Exception as exc:  # a reader's own bug: the file is named, the next one is read
            name = Path(request["path"]).name
            send({"error": f"{name} could not be read ({type(exc).__name__}: {str(exc)[:200]})."})
        busy.clear()


def _watch(parent: int, busy: list[float], limit_s: float) -> None:
    """Exit the child when its parent is gone or the file it reads is past the deadline and the grace."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent or (busy and time.monotonic() - busy[0] > limit_s):
            os._exit(3)


def _cap_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_BYTES, hard)
        if soft == resource.RLIM_INFINITY or soft > want:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ImportError, ValueError, OSError):  # not on this system: the deadline still bounds the file
        pass


def main(argv: list[str]) -> None:
    """Time the child's cost: each file converted in-process and through one :class:`Reader`."""
    start = time.perf_counter()
    with Reader() as reader:
        for path in argv:
            try:
                reader.convert(path)
            except DocumentError as exc:
                print(f"{path}: {exc}")
            if path == argv[0]:
                first = time.perf_counter() - start
        through = time.perf_counter() - start
    start = time.perf_counter()
    for path in argv:
        with contextlib.suppress(DocumentError):
            convert(path)
    inside = time.perf_counter() - start
    print(f"{len(argv)} files: in process {inside * 1000:.0f} ms; through the child {through * 1000:.0f} ms,"
          f" the first (with the start) {first * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
