"""Host sampling: how much CPU the script used, how busy the machine was, and the script's
resident memory, read every ~50 ms by a background thread while the script runs.

The host collector's busy time counts operators and CUDA API calls only, so a data loader
that sleeps, or decodes in plain Python, looks idle. The sampler measures CPU use
directly. At each read it records, with ``time.time_ns()``:

- the process's CPU time: ``time.process_time_ns()`` (every thread, ns resolution) plus
  the CPU time of its children, live (DataLoader workers, with their own reaped
  children) and reaped (``os.times()``), less the sampler thread's own CPU time
  (``time.thread_time_ns()``), so the figure is the script's, not the observer's;
- the machine's busy and total CPU time over all cores (busy is everything but idle and
  iowait, as psutil.cpu_percent counts it);
- the process's resident set size (its own; workers are not added: forked workers share
  most of their pages with it).

The machine's counters, the RSS and the live children are read through psutil, or on
Linux from the same /proc files through descriptors kept open (:class:`_ProcCounters`),
one ``pread`` each with the GIL held: while the script runs Python, every GIL release
in a read costs the script a forced switch, and psutil opens, reads and closes each file.
Measured with benchmarks/sampler_overhead.py on a shared 2-core machine: at 50 ms the
sampler uses 0.6-0.9% of a core and stalls a spinning Python thread 0.4-0.7% of the time
(about 0.2-0.3 ms a read); a loop that spends its time in torch ops does not notice it.
run_script starts the thread after torch.profiler has started: a thread already running
when the profiler starts is traced by its Python tracer (with_stack), read by read.

Consecutive reads give one sample per interval: process CPU use in cores, system CPU use
0..1 and the largest RSS read in the interval (:meth:`HostSamples.events`, rows of kind
``sample`` in the Session).

Clock: ``time.time_ns()`` (CLOCK_REALTIME), the clock of the trace's events. torch.profiler
(Kineto) writes an event's ``ts`` in microseconds from ``baseTimeNanoseconds`` on the
realtime clock; the CUPTI collector's host rows and CUPTI's records are realtime ns too
(advisor.collect.cupti). Checked with torch 2.13 (CPU): a ``record_function`` range's
``baseTimeNanoseconds + ts * 1000`` came 8-30 us after a ``time.time_ns()`` read just before
it (the cost of entering the range), against offsets of about 4.4e15 ns from
``perf_counter_ns`` and ``monotonic_ns``. So a sample's Session time is its ``time_ns``
less the Session's ``base_time_ns``, with no offset to measure; collect_script checks that
the samples and the trace's events overlap and drops the samples with a note where they
do not (a trace on another clock).

Children: looked for every ``child_scan_s`` (0.5 s) in ``/proc/<pid>/task/<tid>/children``
(Linux), else through psutil's scan of the process table; found ones are read at every
read. A child found late has CPU time from before it was found; that time is spread
evenly over the reads since it started (or since the previous scan), not put in one
interval as a spike.

Bounded: at most ``max_samples`` reads are kept. Past that, every other read is dropped
(its largest RSS folded into the next) and the interval doubles, so a long run keeps its
whole span at a coarser grain. CPU figures stay exact averages over the longer intervals,
since the reads are cumulative counters.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# Imported here, with advisor, not when the sampler starts: run_script starts it after the
# profiler, and torch's Python tracer (with_stack) keeps pointers to the code objects it
# sees; a module imported while it records frees its comprehensions' code objects, and the
# exported trace then holds garbage names (seen as corrupt JSON, torch 2.13).
try:
    import psutil
except ImportError:  # a declared dependency; without it the script runs unsampled
    psutil = None

DEFAULT_INTERVAL_S = 0.05
DEFAULT_MAX_SAMPLES = 20_000
DEFAULT_CHILD_SCAN_S = 0.5  # looking for new children costs more than a read (~0.2 ms)
SAMPLE_KIND = "sample"
SAMPLE_NAME = "cpu"
SAMPLE_CATEGORY = "advisor_sampler"


@dataclass
class HostSamples:
    """What the sampler read: one entry per kept read, counters cumulative."""

    time_ns: np.ndarray
    """``time.time_ns()`` at each read."""
    process_cpu_ns: np.ndarray
    """CPU time of the process and its children since the first read, the sampler's own
    excluded, ns."""
    system_busy_s: np.ndarray
    """Busy CPU time of all the machine's cores since the first read, s."""
    system_total_s: np.ndarray
    """All CPU time (busy and idle) of all the machine's cores since the first read, s."""
    rss_bytes: np.ndarray
    """The largest resident set size read since the previous kept read, bytes."""
    pid: int
    logical_cores: int
    interval_s: float
    """The interval between reads at the end (the asked-for one, doubled at each halving)."""
    asked_interval_s: float
    downsampled: int = 0
    """How many times the reads were halved to stay within the cap."""
    sampler_cpu_ns: int = 0
    """The sampler thread's own CPU time, ns (left out of process_cpu_ns)."""
    children_seen: int = 0
    counters: str = ""
    """What read the counters: ``proc`` (Linux /proc) or ``psutil``."""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        """Samples (intervals between reads)."""
        return max(len(self.time_ns) - 1, 0)

    def events(self, base_time_ns: int = 0) -> pd.DataFrame:
        """One ``sample`` event per interval between reads, on the Session's clock
        (``time_ns - base_time_ns``): ``value`` the process's CPU use in cores,
        ``system_value`` the machine's CPU use 0..1 (NaN for an interval shorter than the
        kernel's clock tick, where the machine's counters did not move), ``bytes`` the
        largest RSS read. Per sample the children's and the machine's figures are coarse
        (their CPU time is counted in clock ticks, 10 ms on Linux, so +-20% of a core per
        child over a 50 ms sample; the process's own is read in ns); their means over many
        samples are not."""
        t = np.asarray(self.time_ns, dtype=np.int64)
        n = len(self)
        if n == 0:
            return pd.DataFrame({"name": pd.Series([], dtype=object)})
        dt = np.diff(t).astype("float64")
        with np.errstate(divide="ignore", invalid="ignore"):
            cores = np.diff(np.asarray(self.process_cpu_ns, dtype="float64")) / dt
            total = np.diff(np.asarray(self.system_total_s, dtype="float64"))
            busy = np.diff(np.asarray(self.system_busy_s, dtype="float64"))
            system = np.where(total > 0, busy / total, np.nan)
        cores = np.where(dt > 0, np.maximum(cores, 0.0), np.nan)
        return pd.DataFrame({
            "name": [SAMPLE_NAME] * n,
            "kind": [SAMPLE_KIND] * n,
            "category": [SAMPLE_CATEGORY] * n,
            "start_ns": t[:-1] - int(base_time_ns),
            "end_ns": t[1:] - int(base_time_ns),
            "pid": self.pid,
            "value": cores,
            "system_value": np.clip(system, 0.0, 1.0),
            "bytes": np.asarray(self.rss_bytes, dtype=np.int64)[1:],
        })

    def summary(self) -> dict[str, Any]:
        """The sampler's account of itself, for the Session's trace_metadata."""
        span = int(self.time_ns[-1] - self.time_ns[0]) if len(self.time_ns) > 1 else 0
        return {
            "samples": len(self),
            "interval_s": self.interval_s,
            "asked_interval_s": self.asked_interval_s,
            "downsampled": self.downsampled,
            "span_ns": span,
            "logical_cores": self.logical_cores,
            "children_seen": self.children_seen,
            "counters": self.counters,
            "sampler_cpu_ns": int(self.sampler_cpu_ns),
            "notes": list(self.notes),
        }


def _proc_children(pid: int) -> list[int] | None:
    """Direct children of ``pid`` from /proc (every thread's children file); None where
    the kernel does not provide the files (not Linux, or no CONFIG_PROC_CHILDREN)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: list[int] = []
    found_any = False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found_any = True
                out.extend(int(x) for x in handle.read().split())
        except FileNotFoundError:
            continue  # a thread that ended since the listing; or no children files at all
        except OSError:
            continue
    return out if found_any else None


class _PsutilCounters:
    """The counters through psutil, on any platform psutil supports."""

    name = "psutil"

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)

    def system(self) -> tuple[float, float]:
        return _system_busy_total(psutil.cpu_times())

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def open_child(self, pid: int) -> Any:
        return psutil.Process(pid)

    def child_cpu_ns(self, child: Any) -> int:
        try:
            return _cpu_ns(child.cpu_times())
        except psutil.Error as exc:  # gone: callers catch OSError alone
            raise OSError(str(exc)) from None

    def close_child(self, child: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _gil_holding_pread() -> Callable[[int, int], bytes] | None:
    """``pread(fd, size)`` at offset 0 through libc with the GIL held (ctypes.PyDLL), or
    None where libc cannot be reached that way. Each read is one short system call on a
    /proc file (10-80 us); holding the GIL through it costs the script that much, where
    releasing it costs a forced GIL switch to take it back (below)."""
    try:
        import ctypes  # noqa: PLC0415

        libc = ctypes.PyDLL(None, use_errno=True)
        call = getattr(libc, "pread64", None) or libc.pread
        call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_longlong]
        call.restype = ctypes.c_ssize_t
        buffer = ctypes.create_string_buffer(4096)
    except (ImportError, OSError, AttributeError):
        return None

    def pread(fd: int, size: int) -> bytes:
        n = call(fd, buffer, min(size, len(buffer)), 0)
        if n < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        return buffer.raw[:n]

    return pread


class _ProcCounters:
    """The same counters on Linux, read from /proc through descriptors kept open.

    While the script runs Python, a sampler read that releases the GIL hands it back to
    the script, waits for it again up to a switch interval (5 ms) and then forces a
    switch; on a loaded machine a forced switch costs the script the time the sampler
    thread takes to be scheduled. psutil opens, reads and closes each file, three
    releases a file; here each file is one ``pread`` on a kept descriptor, made with the
    GIL held where libc is reachable through ctypes (else ``os.pread``, one release), so
    a read costs the script one switch, the wake-up (see
    benchmarks/sampler_overhead.py). A child's descriptor also pins the process it was
    opened for: once the child is reaped the read fails, whatever pid comes next.
    """

    name = "proc"

    def __init__(self, pid: int):
        self.pread = _gil_holding_pread() or (lambda fd, size: os.pread(fd, size, 0))
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.stat_fd = os.open("/proc/stat", os.O_RDONLY)
        try:
            self.statm_fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        except OSError:
            os.close(self.stat_fd)
            raise
        try:  # fail here, in the caller's thread, not at the first read
            self.system()
            self.rss()
        except Exception:
            self.close()
            raise

    def system(self) -> tuple[float, float]:
        head = self.pread(self.stat_fd, 1024).split(b"\n", 1)[0].split()
        if not head or head[0] != b"cpu":
            raise OSError("/proc/stat does not start with the cpu line")
        # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
        ticks = [int(x) for x in head[1:11]] + [0] * max(0, 10 - len(head[1:11]))
        total = sum(ticks) - ticks[8] - ticks[9]  # guest time is inside user time already
        busy = total - ticks[3] - ticks[4]
        return busy / self.tick, total / self.tick

    def rss(self) -> int:
        return int(self.pread(self.statm_fd, 256).split()[1]) * self.page

    def open_child(self, pid: int) -> int:
        return os.open(f"/proc/{pid}/stat", os.O_RDONLY)

    def child_cpu_ns(self, fd: int) -> int:
        data = self.pread(fd, 2048)
        # After the command name (which may hold spaces and parentheses): state, ppid...;
        # utime, stime, cutime, cstime are fields 14 to 17 of the line (proc(5)).
        fields = data[data.rindex(b")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        return ticks * 1_000_000_000 // self.tick

    def close_child(self, fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            pass

    def close(self) -> None:
        for fd in (getattr(self, "stat_fd", None), getattr(self, "statm_fd", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _counters(pid: int) -> _ProcCounters | _PsutilCounters:
    if sys.platform.startswith("linux"):
        try:
            return _ProcCounters(pid)
        except (OSError, ValueError, IndexError):
            pass
    return _PsutilCounters(pid)


class HostSampler:
    """A daemon thread reading the host's counters every ``interval_s`` (see the module
    docstring). ``start()`` returns once the first read is taken; ``stop()`` takes a last
    read, ends the thread and returns the HostSamples. Usable as a context manager."""

    def __init__(self, *, interval_s: float = DEFAULT_INTERVAL_S, max_samples: int = DEFAULT_MAX_SAMPLES,
                 child_scan_s: float = DEFAULT_CHILD_SCAN_S, clock: Callable[[], int] = time.time_ns):
        if not interval_s > 0:
            raise ValueError(f"the sampling interval must be positive, not {interval_s!r}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples!r}")
        if psutil is None:
            raise RuntimeError("psutil is not installed")
        self.asked_interval_s = float(interval_s)
        self.interval_s = float(interval_s)
        self.max_samples = int(max_samples)
        self.child_scan_s = float(child_scan_s)
        self.clock = clock
        self.pid = os.getpid()
        self.logical_cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self._process = psutil.Process(self.pid)
        self._read_counters = _counters(self.pid)
        self._t: list[int] = []
        self._cpu: list[int] = []
        self._busy: list[float] = []
        self._total: list[float] = []
        self._rss: list[int] = []
        self._children: dict[int, Any] = {}  # pid -> what the counters read it through
        self._children_seen = 0
        self._last_scan_ns = 0
        self._proc_lists = _proc_children(self.pid) is not None
        self._downsampled = 0
        self._sampler_cpu_ns = 0
        self._base: tuple[int, float, float] | None = None
        self._notes: list[str] = []
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: HostSamples | None = None

    # -- control ------------------------------------------------------------------------------

    def start(self) -> HostSampler:
        if self._thread is not None:
            raise RuntimeError("the host sampler was started twice")
        self._thread = threading.Thread(target=self._run, name="advisor-host-sampler", daemon=True)
        self._thread.start()
        self._first.wait(timeout=5.0)
        return self

    def stop(self) -> HostSamples:
        """End sampling (after a last read) and return what was read; safe to call twice."""
        if self._result is not None:
            return self._result
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                self._notes.append("the host sampler did not stop in time: its last reads may be missing")
        if self._thread is None or not self._thread.is_alive():
            for child in self._children.values():
                self._read_counters.close_child(child)
            self._children.clear()
            self._read_counters.close()
        self._result = HostSamples(
            time_ns=np.asarray(self._t, dtype=np.int64),
            process_cpu_ns=np.asarray(self._cpu, dtype=np.int64),
            system_busy_s=np.asarray(self._busy, dtype="float64"),
            system_total_s=np.asarray(self._total, dtype="float64"),
            rss_bytes=np.asarray(self._rss, dtype=np.int64),
            pid=self.pid,
            logical_cores=int(self.logical_cores),
            interval_s=self.interval_s,
            asked_interval_s=self.asked_interval_s,
            downsampled=self._downsampled,
            sampler_cpu_ns=self._sampler_cpu_ns,
            children_seen=self._children_seen,
            counters=self._read_counters.name,
            notes=list(self._notes),
        )
        return self._result

    def __enter__(self) -> HostSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._read()
        except Exception as exc:  # never let the observer break the run
            self._notes.append(f"host sampling failed at its first read ({_one_line(exc)})")
            self._first.set()
            return
        self._first.set()
        next_at = time.monotonic() + self.interval_s
        while True:
            stopping = self._stop.wait(timeout=max(next_at - time.monotonic(), 0.0))
            try:
                self._read()
            except Exception as exc:
                self._notes.append(f"host sampling stopped early ({_one_line(exc)})")
                return
            if stopping:
                self._merge_short_last()
                return
            now = time.monotonic()
            next_at += self.interval_s
            if next_at < now:  # a late wake-up (the GIL, a loaded machine): skip, do not catch up
                next_at = now + self.interval_s

    def _read(self) -> None:
        # The system's counters first: reading them may release the GIL (psutil's file
        # I/O, os.pread), and the script may then hold it for a switch interval (5 ms)
        # before the sampler gets it back. The clock, the process's CPU time, its reaped
        # children's and the sampler's own are read back to back without releasing it, so
        # they share one instant; the live children and the RSS follow within a few ms.
        busy, total = self._read_counters.system()
        now = self.clock()
        own = time.process_time_ns()
        reaped = os.times()
        self._sampler_cpu_ns = time.thread_time_ns()
        reaped_ns = int((reaped.children_user + reaped.children_system) * 1e9)
        # Reaped children before live ones: a child reaped between the two reads is then
        # missed once (a dip, held flat below) rather than counted twice (a spike).
        live_ns = self._children_cpu_ns(now)
        rss = self._read_counters.rss()
        cpu = own + reaped_ns + live_ns - self._sampler_cpu_ns
        if self._base is None:
            self._base = (cpu, busy, total)
        base_cpu, base_busy, base_total = self._base
        cpu -= base_cpu
        if self._cpu:
            cpu = max(cpu, self._cpu[-1])
        self._t.append(now)
        self._cpu.append(cpu)
        # The seconds are whole clock ticks; rounding drops the float noise of the
        # subtraction, which would read as a busy machine's 1e-11.
        self._busy.append(round(busy - base_busy, 6))
        self._total.append(round(total - base_total, 6))
        self._rss.append(int(rss))
        if len(self._t) > self.max_samples:
            self._halve()

    def _children_cpu_ns(self, now: int) -> int:
        """CPU time of the live children (and what they reaped), ns; finds new children."""
        if now - self._last_scan_ns >= self.child_scan_s * 1e9:
            previous_scan = self._last_scan_ns
            self._last_scan_ns = now
            for pid in self._child_pids():
                if pid in self._children:
                    continue
                try:
                    started_ns = int(psutil.Process(pid).create_time() * 1e9)
                    child = self._read_counters.open_child(pid)
                except (psutil.Error, OSError):
                    continue
                try:
                    first = self._read_counters.child_cpu_ns(child)
                except (OSError, ValueError, IndexError):
                    self._read_counters.close_child(child)
                    continue
                self._children[pid] = child
                self._children_seen += 1
                # A child found at the first read is in the baseline; one found later
                # has run since it started or since the last scan.
                if self._t:
                    self._spread(first, max(started_ns, previous_scan), now)
        total = 0
        for pid, child in list(self._children.items()):
            try:
                total += self._read_counters.child_cpu_ns(child)
            except (OSError, ValueError, IndexError):
                del self._children[pid]  # reaped: its time is in os.times() from now on
                self._read_counters.close_child(child)
        return total

    def _child_pids(self) -> list[int]:
        if self._proc_lists:
            found: list[int] = []
            frontier = [self.pid]
            while frontier:
                pid = frontier.pop()
                kids = _proc_children(pid) or []
                found.extend(kids)
                frontier.extend(kids)
            return found
        try:
            return [c.pid for c in self._process.children(recursive=True)]
        except (psutil.Error, OSError):
            return []

    def _spread(self, cpu_ns: int, since_ns: int, now: int) -> None:
        """Add a newly found child's earlier CPU time to the reads after ``since_ns`` in
        proportion to the time since then: the child is assumed to have run evenly, which
        is closer to the truth than all of it in the last interval."""
        span = now - since_ns
        if span <= 0 or not self._t:
            return
        # The current read gets the whole of it through the live children's sum; earlier
        # reads after since_ns get their share.
        j = len(self._t) - 1
        while j >= 0 and self._t[j] > since_ns:
            self._cpu[j] += int(cpu_ns * (self._t[j] - since_ns) / span)
            j -= 1

    def _merge_short_last(self) -> None:
        """Fold the read before the last into the last where the final interval (cut short
        by stop) is under a whole interval: the counters move in 10 ms clock ticks, and one
        tick more in a 15 ms interval reads as a second busy core."""
        if len(self._t) >= 3 and self._t[-1] - self._t[-2] < self.interval_s * 1e9:
            self._rss[-1] = max(self._rss[-1], self._rss[-2])
            for series in (self._t, self._cpu, self._busy, self._total, self._rss):
                del series[-2]

    def _halve(self) -> None:
        """Drop every other read, keeping the first and the last; fold each dropped read's
        RSS into the next kept one; double the interval."""
        n = len(self._t)
        keep = list(range(0, n, 2))
        if keep[-1] != n - 1:
            keep.append(n - 1)
        rss = self._rss
        for i in range(1, n, 2):
            if i + 1 < n:
                rss[i + 1] = max(rss[i + 1], rss[i])
        self._t = [self._t[i] for i in keep]
        self._cpu = [self._cpu[i] for i in keep]
        self._busy = [self._busy[i] for i in keep]
        self._total = [self._total[i] for i in keep]
        self._rss = [rss[i] for i in keep]
        self.interval_s *= 2
        self._downsampled += 1


def _cpu_ns(times: Any) -> int:
    """user + system of a process and of the children it reaped, ns."""
    return int((times.user + times.system + getattr(times, "children_user", 0.0)
                + getattr(times, "children_system", 0.0)) * 1e9)


def _system_busy_total(times: Any) -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores, counted as psutil.cpu_percent counts them:
    guest time is already inside user time on Linux, and idle and iowait are not busy."""
    fields = times._asdict()
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    busy = total - fields.get("idle", 0.0) - fields.get("iowait", 0.0)
    return busy, total


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_MAX_SAMPLES", "SAMPLE_KIND", "HostSampler", "HostSamples"]
