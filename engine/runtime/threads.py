"""Run torch work of a passing thread in a thread of its own, so the engine's decode keeps its speed.

torch's CPU kernels run on OpenMP (libgomp).  Each thread that starts a
parallel region gets a team of helper threads that lives as long as that
thread does.  Measured here (2 cores): once any thread other than the
engine's has run one parallelised op (a 64x576 matmul, a bf16 probe of a
quantization kernel), the engine thread's decode runs at about half speed
(16 tok/s before, 7-9 after, for the rest of the process); the same op in a
thread that then exits leaves it at 16.  ``OMP_WAIT_POLICY`` and
``GOMP_SPINCOUNT`` did not help.

So code that may be called from the main thread of the CLI, a benchmark or a
test, and runs torch ops (the device report and its probes), goes through
:func:`isolated`.  The engine's own work needs nothing: it runs on the
engine thread.

Under background load the engine adapts its thread count
(:class:`ThreadGovernor`, fed by :func:`observe_step` from the decode loop;
``BRISK_ADAPT_THREADS=0`` or :func:`set_adaptive` turns it off).
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def default_threads() -> int:
    """The engine's torch thread count: ``OMP_NUM_THREADS`` if set, else the physical cores it may run on.

    Not ``torch.get_num_threads()``: a thread's first torch op takes the count last set by any
    thread (the answer cache's embedder sets one for itself), so a later engine thread would start
    with that.
    """
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:  # hyperthreads of one core count once, as torch's own default does
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topology}/physical_package_id") as a, open(f"{topology}/core_id") as b:
                cores.add((a.read().strip(), b.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def claim_threads() -> None:
    """Set the calling (engine) thread's torch thread count to :func:`default_threads`; the governor starts anew."""
    global _GOVERNOR
    import torch

    torch.set_num_threads(default_threads())
    _GOVERNOR = None


def isolated(work: Callable[[], T]) -> T:
    """``work()`` on a new thread that ends with it; its result, or its exception re-raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller as it was
            box["error"] = exc

    thread = threading.Thread(target=run, name="brisk-isolated")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


# --- Adapting the thread count to the cores that are free -----------------------------------------------
#
# With two threads and a program busy on one of the two cores, every parallel op waits at its barrier for
# the descheduled sibling: measured here, a decode step went from about 0.1 s to 1.9 s, while one thread
# under the same load took 0.1 s.  ``ThreadGovernor`` watches plain decode step times and says when to
# change ``torch.set_num_threads``; it is a pure policy (step times in, thread counts out) so it can be
# tested on step times given by the test.


def context_bucket(positions: int) -> int:
    """Half-octaves of the context a step attends to: steps in one bucket cost within about 1.4x of each other
    for their attention, so their times compare; steps of different buckets do not (a step over 3,500 positions
    of a document costs three times a step over 40 on the bundled model, with the cores free)."""
    bits = max(0, positions).bit_length()
    return bits if bits < 2 else 2 * bits + ((positions >> (bits - 2)) & 1)


@dataclass
class ThreadGovernor:
    """When the median of the last ``window`` steps at ``most`` threads exceeds ``slow`` times the idle
    baseline (the lowest such median seen for steps over a context of that size, :func:`context_bucket`), drop
    to one thread; after ``probe_every`` steps on one thread, try ``most`` again for ``probe_steps`` steps and
    keep it only if those steps are faster than the recent one-thread steps and within ``recover`` of the
    baseline.  A probe step slower than ``slow`` times the baseline ends the probe at once, and each failed
    probe doubles the wait before the next (up to ``longest_wait`` steps): under load a two-thread step can
    cost 20 one-thread steps.  ``observe(seconds, positions)`` returns the thread count to set now, or None
    to leave it.  Baselines are per context size because a long context's steps are slower with the cores
    free: compared with a short chat's baseline they looked like load, and a question about a document left
    the engine on one thread for the next replies."""

    most: int
    window: int = 8
    slow: float = 1.8
    probe_every: int = 32
    probe_steps: int = 3
    recover: float = 1.25
    longest_wait: int = 512
    threads: int = 0  # the count in force (0: ``most``)
    baselines: dict[int, float] = field(default_factory=dict)  # context bucket -> idle median step at ``most``
    _recent: list[tuple[float, int]] = field(default_factory=list)  # (seconds, bucket) since the last change
    _single: list[tuple[float, int]] = field(default_factory=list)  # the last one-thread steps
    _bucket: int = 0  # the last step's
    _since: int = 0
    _probing: int = 0
    _wait: int = 0
    switches: int = 0

    def __post_init__(self) -> None:
        self.threads = self.threads or self.most
        self._wait = self.probe_every

    @property
    def baseline(self) -> float | None:
        """The idle baseline for steps over the last step's context size."""
        return self.baselines.get(self._bucket)

    def observe(self, seconds: float, positions: int = 0) -> int | None:
        if self.most <= 1:
            return None
        bucket = self._bucket = context_bucket(positions)
        self._recent.append((seconds, bucket))
        del self._recent[: -max(self.window, self.probe_steps)]  # all it reads: it grew by a step forever before
        if self.threads == 1:
            self._single = (self._single + [(seconds, bucket)])[-self.window :]
            self._since += 1
            if self._since >= self._wait:
                self._probing = self.probe_steps
                return self._set(self.most)
            return None
        base = self.baselines.get(bucket)
        if self._probing:
            self._probing -= 1
            hopeless = base is not None and seconds > self.slow * base
            if self._probing and not hopeless:
                return None
            probe = statistics.median(s for s, _ in self._recent[-self.probe_steps :])
            singles = [s for s, b in self._single if b == bucket]
            near = not hopeless and (probe <= self.recover * base if base is not None else bool(singles))
            if near and (not singles or probe < statistics.median(singles)):
                self._probing = 0
                self._wait = self.probe_every
                return None  # the cores are free again: stay
            self._probing = 0
            self._wait = min(2 * self._wait, self.longest_wait)
            return self._set(1)
        same = [s for s, b in self._recent[-self.window :] if b == bucket]
        if len(same) < self.window:
            return None
        median = statistics.median(same)
        if base is None or median < base:
            self.baselines[bucket] = median
            return None
        if median > self.slow * base:
            return self._set(1)
        return None

    def _set(self, threads: int) -> int:
        self.threads = threads
        self._recent = []
        self._since = 0
        self.switches += 1
        return threads


_GOVERNOR: ThreadGovernor | None = None
ADAPT = os.environ.get("BRISK_ADAPT_THREADS", "1") != "0"


def set_adaptive(on: bool) -> None:
    """Turn thread adaptation on or off for this process (benchmarks compare both); off restores the count."""
    global ADAPT, _GOVERNOR
    ADAPT = on
    if _GOVERNOR is not None:
        import torch

        torch.set_num_threads(_GOVERNOR.most)
    _GOVERNOR = None


def observe_step(seconds: float, positions: int = 0) -> None:
    """Feed one plain decode step's time and the positions it attended to (on the thread that runs the model)
    and apply the governor's answer."""
    global _GOVERNOR
    if not ADAPT:
        return
    import torch

    if _GOVERNOR is None:
        _GOVERNOR = ThreadGovernor(torch.get_num_threads())
    change = _GOVERNOR.observe(seconds, positions)
    if change is not None:
        torch.set_num_threads(change)
