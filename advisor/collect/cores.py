"""The CPU the job may use, and the time a thread waited for it.

Advice about worker processes and threads is sized from the cores the job may use: its CPU
affinity (``taskset``, a batch scheduler's cpuset) and its cgroup's CPU quota (a container's
``--cpus``), whichever is fewer. What other processes happened to use while the profile was
taken is not that: on a shared machine it changes from one minute to the next, and a loader
that waits on files or sleeps overlaps the step without a free core at all.

A thread that is ready to run but finds every core taken waits on the kernel's run queue;
Linux counts that time per thread (``/proc/<pid>/task/<tid>/schedstat``, its second field).
Work that was descheduled is CPU work, not waiting on I/O, and a run whose loop waited much
of its time for a core was measured on a busy machine: both are said, not mistaken for
something else.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

__all__ = ["RunDelay", "probe_threads", "usable_cores"]

# The thread probe: work torch splits across its operator threads, elementwise (an add) and
# matrix (a matmul) at a few sizes each, since the cost of too many threads falls mostly on
# short operators (each parallel region waits for its slowest thread to get a core). Timed
# on the wall clock, rounds alternating between the thread counts so that a change of load
# during the probe falls on both.
PROBE_ADD_ELEMENTS = (1 << 16, 1 << 18, 1 << 20, 1 << 22)
PROBE_MATMUL_SIZES = (128, 256, 512, 1024)
# Calls per timing, so that each lasts a millisecond or so at any size: one short call is
# mostly the clock's and the scheduler's noise.
PROBE_CALLS = {("add", 1 << 16): 16, ("add", 1 << 18): 8, ("add", 1 << 20): 2, ("add", 1 << 22): 1,
               ("matmul", 128): 16, ("matmul", 256): 4, ("matmul", 512): 1, ("matmul", 1024): 1}
PROBE_ROUNDS = 5

_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def _quota() -> float:
    """The cgroup's CPU quota in cores (inf: none set, or not readable)."""
    try:
        quota, _, period = _CGROUP_V2.read_text().partition(" ")
        if quota.strip() != "max":
            return int(quota) / int(period)
        return math.inf
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota, period = (int(p.read_text()) for p in _CGROUP_V1)
        return quota / period if quota > 0 and period > 0 else math.inf
    except (OSError, ValueError):
        return math.inf


def usable_cores() -> float:
    """The cores this process may use: its affinity and its cgroup quota, the fewer."""
    try:
        affinity = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        affinity = float(os.cpu_count() or 1)
    return min(affinity, _quota())


class RunDelay:
    """The time one thread (the one that makes it) has spent ready to run but waiting for a
    core, ns. The file stays open so a read is one ``pread`` (under a microsecond), cheap
    enough around each batch a loader makes; ``read()`` is None where the system does not
    say (not Linux, schedstats off) or after ``close()``."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except (OSError, AttributeError):
            self._fd = None
        if self.read() is None:
            self.close()

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass


def probe_threads(torch, threads: int, cores: int) -> dict | None:
    """Seconds a call of each probe operation takes at ``threads`` and at ``cores`` operator threads,
    the median of ``PROBE_ROUNDS`` alternated rounds, on this machine as loaded now (a few
    hundred milliseconds, after the user's script has ended): ``{"add": {elements: [at
    threads, at cores]}, "matmul": {size: [...]}}``; the thread setting is restored. None
    where torch cannot run it."""
    import time  # noqa: PLC0415

    try:
        before = torch.get_num_threads()
        try:
            work = [("add", n, (torch.randn(n), torch.randn(n))) for n in PROBE_ADD_ELEMENTS]
            work += [("matmul", n, (torch.randn(n, n), torch.randn(n, n))) for n in PROBE_MATMUL_SIZES]
            times: dict[tuple[str, int, int], list[float]] = {}
            for round_ in range(PROBE_ROUNDS + 1):
                for count in (threads, cores):
                    torch.set_num_threads(count)
                    for kind, n, (a, b) in work:
                        calls = PROBE_CALLS[(kind, n)]
                        start = time.perf_counter()
                        for _ in range(calls):
                            torch.add(a, b) if kind == "add" else torch.mm(a, b)
                        took = (time.perf_counter() - start) / calls
                        if round_:  # the first round warms each setting's thread pool
                            times.setdefault((kind, n, count), []).append(took)
        finally:
            torch.set_num_threads(before)
    except Exception:  # noqa: BLE001  (a probe that cannot run costs the figure, never the run)
        return None

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return {kind: {str(n): [median(times[(kind, n, threads)]), median(times[(kind, n, cores)])]
                   for k, n, _ in work if k == kind} for kind in ("add", "matmul")}
