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

__all__ = ["RunDelay", "usable_cores"]

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
