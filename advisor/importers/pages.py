"""Memory pages for advisor's own large arrays: plain pages, and freed memory given back.

numpy asks the kernel to back every array of 4 MiB or more with transparent huge pages
(``madvise``). Where the kernel compacts memory to honour that advice
(``/sys/kernel/mm/transparent_hugepage/defrag`` set to ``madvise``, a common default), a
fresh array can stall while pages are moved: on a 1 GB trace (3.5 M events) `advisor
diagnose` spent 3.0 s of system time, half of it there, and 1.5 s of wall time. advisor's
arrays are written once and read a few times, so ordinary pages cost it less. A command
that reads profiles and runs none of the user's code sets numpy's documented switch,
``NUMPY_MADVISE_HUGEPAGE=0``, before numpy is imported (``plain_pages``; the processes
it starts inherit it); a user's script run by advisor keeps numpy's own setting, since
advisor must not change how the job it measures uses memory.

Freed memory is given back (``give_back_freed``), where the command asks for it, once a
trace is read and after each summary table of a large session. glibc's malloc keeps the
memory a program frees for its next allocations, and after the first large arrays are
freed it takes arrays of up to 32 MiB from that kept memory too: a 1 GB trace's columns
(28 MB each on 3.5 M events) then leave 550 MB freed but still held by the process
through the rest of the command, its tables included, where the peak is. advisor.Profiler,
which reads and summarises inside the user's job, does not ask: the job's memory is the
job's.
"""

from __future__ import annotations

import os
import sys

__all__ = ["HUGE_PAGES_SWITCH", "give_back_freed", "plain_pages"]

HUGE_PAGES_SWITCH = "NUMPY_MADVISE_HUGEPAGE"


def plain_pages() -> None:
    """numpy's huge-page advice off for this process and those it starts, where numpy is not
    imported yet (the switch is read at its import) and the user has not set it."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(HUGE_PAGES_SWITCH, "0")


def give_back_freed() -> None:
    """Give the kernel back the memory this process has freed but malloc still holds
    (glibc's ``malloc_trim``: a few ms); nothing where the C library is another."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
