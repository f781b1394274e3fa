"""Memory pages for advisor's own large arrays.

numpy asks the kernel to back every array of 4 MiB or more with transparent huge pages
(``madvise``). Where the kernel compacts memory to honour that advice
(``/sys/kernel/mm/transparent_hugepage/defrag`` set to ``madvise``, a common default), a
fresh array can stall while pages are moved: on a 1 GB trace (3.5 M events) `advisor
diagnose` spent 3.0 s of system time, half of it there, and 1.5 s of wall time (16.0 ->
14.5 s; ``benchmarks/ingest.py``). advisor's arrays are written once and read a few times,
so ordinary pages cost it less.

Freed memory is given back (``give_back_freed``) once a trace is read. glibc's malloc keeps
the memory a program frees for its next allocations, and after the first large arrays are
freed it takes arrays of up to 32 MiB from that kept memory too: a 1 GB trace's columns
(28 MB each on 3.5 M events) then leave 550 MB freed but still held by the process
through the rest of the command, its tables included, where the peak is.

The advice is turned off, and freed memory given back, for advisor's analysis only. A
user's script that advisor runs in its own process gets numpy's setting back while it runs
(``numpy_pages``): advisor must not change how the job it measures uses memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["give_back_freed", "numpy_pages", "plain_pages"]

_before: bool | None = None  # numpy's own setting, once plain_pages has changed it
_analysis = False  # whether this process is advisor's analysis (plain_pages), not a user's job


def _setter() -> Callable[[bool], bool] | None:
    """numpy's switch (it returns the previous setting), or None where this numpy has none."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage  # numpy 1.x
        except ImportError:
            return None
    return _set_madvise_hugepage


def plain_pages() -> None:
    """Stop numpy asking for huge pages in this process (for advisor's analysis), and let
    ``give_back_freed`` give memory back in it."""
    global _before, _analysis
    _analysis = True
    switch = _setter()
    if switch is None:
        return
    previous = switch(False)
    if _before is None:
        _before = previous


@contextmanager
def numpy_pages() -> Iterator[None]:
    """numpy's own setting while a user's code runs; advisor's after."""
    switch = _setter()
    if switch is None or _before is None:
        yield
        return
    ours = switch(_before)
    try:
        yield
    finally:
        switch(ours)


def give_back_freed() -> None:
    """Give the kernel back the memory this process has freed but malloc still holds
    (glibc's ``malloc_trim``: a few ms); nothing where the C library is another, nor in a
    process that is not advisor's analysis (no ``plain_pages``): advisor.Profiler reads
    and summarises inside the user's job, whose memory advisor leaves as it is."""
    import ctypes
    import sys

    if not _analysis or not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
