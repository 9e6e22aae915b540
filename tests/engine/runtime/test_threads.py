"""The thread governor as a pure policy: scripted step times in, thread counts out (no timing here)."""

from __future__ import annotations

import threading

import pytest

from engine.runtime import threads
from engine.runtime.threads import ThreadGovernor, context_bucket, isolated


def feed(gov: ThreadGovernor, times: list[float]) -> list[int]:
    """The thread count in force after each step."""
    out = []
    for t in times:
        gov.observe(t)
        out.append(gov.threads)
    return out


def test_steady_steps_keep_all_threads() -> None:
    gov = ThreadGovernor(2)
    assert feed(gov, [0.10, 0.11, 0.09, 0.10] * 20) == [2] * 80
    assert gov.baseline is not None and 0.09 <= gov.baseline <= 0.11 and gov.switches == 0


def test_a_busy_core_drops_to_one_thread() -> None:
    gov = ThreadGovernor(2)
    feed(gov, [0.10] * 8)  # the idle baseline
    counts = feed(gov, [1.9] * 8)  # a program took one core: two threads stall at every barrier
    assert counts[-1] == 1 and gov.switches == 1
    assert 2 not in counts[counts.index(1) :]


def test_a_single_slow_step_is_not_load() -> None:
    gov = ThreadGovernor(2)
    feed(gov, [0.10] * 8)
    assert feed(gov, [0.10, 0.10, 2.0, 0.10, 0.10, 0.10, 0.10, 0.10] * 3)[-1] == 2


def test_probes_two_threads_and_keeps_one_while_the_load_lasts() -> None:
    gov = ThreadGovernor(2, probe_every=10, probe_steps=3, longest_wait=80)
    feed(gov, [0.10] * 8 + [1.9] * 8)
    assert gov.threads == 1
    # one thread: 0.11 s a step; every probe at two threads is slow again, so one thread comes back
    counts = []
    for _ in range(300):
        gov.observe(1.9 if gov.threads == 2 else 0.11)
        counts.append(gov.threads)
    probes = [i for i in range(1, len(counts)) if counts[i] == 2 and counts[i - 1] == 1]
    assert len(probes) >= 3, "two threads were tried again"
    assert counts.count(2) == len(probes), "a slow probe step ends the probe at once"
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] <= 81, "failed probes wait longer, up to longest_wait"
    assert counts.count(2) * 1.9 < 0.2 * counts.count(1) * 0.11 + 1.9 * 2, "probing costs little under load"


def test_returns_to_all_threads_when_the_core_is_free_again() -> None:
    gov = ThreadGovernor(2, probe_every=10, probe_steps=4)
    feed(gov, [0.10] * 8 + [1.9] * 8)
    assert gov.threads == 1
    counts = []
    for _ in range(40):  # the other program ended: two threads are fast again, one thread is slower
        gov.observe(0.10 if gov.threads == 2 else 0.15)
        counts.append(gov.threads)
    assert counts[-10:] == [2] * 10


def test_a_long_context_is_not_load() -> None:
    """A question about a document: steps over 3,500 positions cost three times a short chat's, cores free."""
    gov = ThreadGovernor(2)
    feed(gov, [0.006] * 16)  # a short chat: its baseline
    counts = []
    for i in range(40):
        gov.observe(0.019, 3_500 + i)
        counts.append(gov.threads)
    assert counts == [2] * 40 and gov.switches == 0
    assert gov.baselines[context_bucket(3_500)] == pytest.approx(0.019)


def test_load_during_a_long_context_still_drops_to_one_thread() -> None:
    gov = ThreadGovernor(2)
    feed(gov, [0.006] * 16)
    for i in range(16):
        gov.observe(0.019, 3_500 + i)  # the document's baseline
    for i in range(16):
        gov.observe(0.35, 3_516 + i)  # a program took one core
    assert gov.threads == 1 and gov.switches == 1


def test_a_probe_in_a_context_with_no_baseline_keeps_the_faster_count() -> None:
    gov = ThreadGovernor(2, probe_every=10, probe_steps=3)
    feed(gov, [0.10] * 8 + [1.9] * 8)
    assert gov.threads == 1
    # the load ends while the chat moved on to a long context two threads were never timed at
    for i in range(40):
        gov.observe(0.05 if gov.threads == 2 else 0.09, 5_000 + i)
    assert gov.threads == 2


def test_context_buckets_are_half_octaves() -> None:
    assert context_bucket(0) == 0 and context_bucket(1) == 1
    assert context_bucket(40) == context_bucket(47) != context_bucket(48) == context_bucket(63)
    assert context_bucket(3_100) == context_bucket(3_500) != context_bucket(3_000) == context_bucket(2_048)
    buckets = [context_bucket(n) for n in range(1, 100_000, 37)]
    assert buckets == sorted(buckets)


def test_one_thread_machine_is_left_alone() -> None:
    gov = ThreadGovernor(1)
    assert all(gov.observe(t) is None for t in [0.1] * 8 + [5.0] * 20)


def test_observe_step_sets_torch_threads_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def run() -> tuple[int, int]:
        threads.set_adaptive(False)  # forget a governor an earlier engine left (its counts are another thread's)
        torch.set_num_threads(2)
        threads.set_adaptive(True)
        for t in [0.1] * 8 + [2.0] * 8:
            threads.observe_step(t)
        dropped = torch.get_num_threads()
        threads.set_adaptive(False)
        for t in [0.1] * 8 + [2.0] * 8:
            threads.observe_step(t)
        return dropped, torch.get_num_threads()

    try:
        dropped, off = isolated(run)  # torch's thread count is per thread: keep it off the test's own
    finally:
        threads.set_adaptive(threads.os.environ.get("BRISK_ADAPT_THREADS", "1") != "0")
    assert dropped == 1 and off == 2


def test_isolated_runs_on_another_thread_and_reraises() -> None:
    assert isolated(lambda: threading.current_thread().name) == "brisk-isolated"
    with pytest.raises(ZeroDivisionError):
        isolated(lambda: 1 / 0)


def test_default_threads_follows_omp_num_threads_or_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores = threads.default_threads()
    assert 1 <= cores <= len(threads.os.sched_getaffinity(0))


def test_a_new_engine_thread_takes_the_default_count_whatever_another_thread_set(tiny_dir: object) -> None:
    """A thread's first torch op takes the count last set by any thread (the answer cache's embedder sets 1)."""
    import queue

    import torch

    from tests.support.engine_runner import EngineRunner

    isolated(lambda: torch.set_num_threads(1))  # as the embedder does on its own thread
    assert isolated(torch.get_num_threads) == 1  # a new thread now starts with one
    runner = EngineRunner(str(tiny_dir))
    try:
        seen: queue.Queue[int] = queue.Queue()
        runner.engine.call(lambda _engine: seen.put(torch.get_num_threads()))
        assert seen.get(timeout=60) == threads.default_threads()
    finally:
        runner.close()
        isolated(lambda: torch.set_num_threads(threads.default_threads()))
