"""Reading a trace in a forked process while this one starts up.

On a trace of tens of MB, a command used to spend longer importing what it needs (pandas,
the rules, the report models) than reading the file; on two CPUs the two need not wait for
each other. ``start(path)``, called by ``diagnose``, ``summary``, ``timeline`` and ``compare``
(for each of its traces) before those imports, forks a process that reads the
trace (advisor.importers.loader.read_kineto, the same code as ever) and sends back its
events and the metadata's fields (advisor.importers.forked: the columns' memory as it is, a few ms
for 35 MB of JSON), of which this process makes the Session (``session_from``, as
load_kineto does): the forked read does not wait to import the Session's models, which
this process imports meanwhile. ``load(path, ahead=...)`` takes it from there.

Only where it pays and cannot change the result:
- a file the one-process reader would read (gzipped, or plain and too small to be read in
  parts, advisor.importers.parts), of at most ``MAX_BYTES`` of JSON: its events come
  back through a pipe, whose cost grows with them while the start-up it hides does not;
- not a file the session cache holds (loading the cached Session is this process's work);
- more than one process allowed by the command (advisor.importers.forked.processes_allowed).

A forked read that fails for any reason (a damaged trace, memory, a signal) gives nothing
back, and the file is read again here, where the failure is reported as it always is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.importers.forked import Forked, Progress

if TYPE_CHECKING:
    import pandas as pd

    from advisor.session import Session

__all__ = ["MAX_BYTES", "Ahead", "start"]

# The JSON a read ahead may hold (a gzipped file's size as its trailer gives it): sending
# the events back grows with the trace, while the imports it overlaps do not
# (benchmarks/RESULTS.md).
MAX_BYTES = 128 << 20


class Ahead:
    """A trace being read by a forked process."""

    def __init__(self, path: Path, child: Forked, read: Progress):
        self.path = path
        self._child = child
        self._read = read

    def session(self, progress: Callable[..., None] | None = None) -> Session | None:
        """The Session read, or None where the process failed (the caller reads the file
        itself). ``progress(done, total, events=...)`` hears of the forked read while
        this process waits for it."""
        heard = None
        if progress is not None:
            total = self.path.stat().st_size

            def heard() -> None:
                done, events = self._read.total()
                progress(min(done, total), total, events=events)

        try:
            read = self._child.result(waiting=heard)
        finally:
            self._read.close()
        if read is None:
            return None
        from advisor.importers.loader import session_from

        return session_from(*read)

    def stop(self) -> None:
        """Stop the read where its result is not wanted (the command stopped first)."""
        self._child.stop()
        self._read.close()


def start(path: Path, *, processes: int, use_cache: bool = True) -> Ahead | None:
    """A forked read of the trace at ``path``, or None where one does not pay here,
    ``processes`` (the command's allowance, this process included) is one, or the session
    cache (``use_cache``) already holds the trace."""
    if processes < 2 or not _small(path):
        return None
    from advisor.importers import cache

    if use_cache and cache.holds(path):
        return None
    # Both processes need numpy: imported once, before the fork, rather than in each after
    # it. Each import also starts OpenBLAS's threads, which spin for a while and would
    # take the CPUs the two processes need; the fork stops them here.
    import numpy  # noqa: F401

    read = Progress()
    child = Forked.start(lambda: _read(path, read))
    if child is None:
        read.close()
        return None
    return Ahead(path, child, read)


def _small(path: Path) -> bool:
    """Whether the one-process reader reads ``path`` and its JSON is at most MAX_BYTES."""
    from advisor.importers.parts import PART_MIN_BYTES

    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            gzipped = file.read(2) == b"\x1f\x8b"
            if not gzipped:
                return size < min(2 * PART_MIN_BYTES, MAX_BYTES)
            # A gzip member's trailer holds its uncompressed size modulo 4 GiB: more
            # compressed bytes than that (past a tiny file's headers) means it wrapped.
            file.seek(-4, os.SEEK_END)
            unpacked = int.from_bytes(file.read(4), "little")
    except OSError:
        return False
    return unpacked <= MAX_BYTES and (size <= unpacked or size < 1 << 16)


def _read(path: Path, read: Progress) -> tuple[pd.DataFrame, dict[str, Any]]:
    """In the forked process: the events and the metadata's fields (read_kineto), of
    which this process makes the Session; the forked one never imports the Session's
    models (pydantic), which its read would otherwise wait for."""
    from advisor.importers.loader import read_kineto

    def heard(done: int, total: int, events: int | None = None) -> None:
        read.put(0, done, events or 0)

    return read_kineto(path, progress=heard)
