"""Reading one large plain trace in parts, each part in a process of its own.

The event array of a plain (not gzipped) Kineto file is cut where one event ends and the
next begins (``},{``) into about equal parts. Each part after the first is read by a forked
process with the same reader (advisor.importers.kineto), while this process reads the
first; the parts' columns come back through a pipe and are joined in file order, their text
codes renumbered into this process's tables, so the frame is the one a single process
reads (tests/test_parts.py compares them).

Where that could fail to hold, the parts are dropped and the file is read again, from the
start, by this process alone (kineto.ReadAgain): slower, never different. That is where a
part's process fails (memory, a signal); where any part took the careful path, which a
cut inside an event always causes (a name holding ``},{``: neither part holds whole events
there) and which damage causes too (the pieces it recovers depend on where chunks start);
and where a part after the first numbered a thread label or an id past int64 (numbers
given in order of first sight across the file). A file that reads cleanly, the usual
case, is read in parts.

Used where the file holds at least ``PART_MIN_BYTES`` a part and the command allows more
than one process (advisor.importers.forked.processes_allowed: systems with ``fork``, the
CPUs free to it, ``ADVISOR_PROCESSES``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from advisor.importers.forked import Forked, Progress

if TYPE_CHECKING:
    from advisor.importers.kineto import EventReader

__all__ = ["PART_MIN_BYTES", "read_in_parts"]

# A part smaller than this is not worth a process (its fork, its columns sent back).
PART_MIN_BYTES = 32 << 20
# This process's part is this much of a part longer than the others: it reads on while the
# others send their columns back, which it then receives, rather than waiting for them.
FIRST_EXTRA = 0.1
# How far past a part's nominal start its first cut is looked for.
_CUT_WINDOW = 4 << 20


def read_in_parts(reader: EventReader, buffer: bytes, start: int, array_form: bool, *,
                  processes: int) -> dict[str, Any]:
    """Read the event array from buffer[start] on (the head already read), in parts where
    that pays, with at most ``processes`` processes (this one included); returns the
    top-level keys after the array, as ``reader.read_array`` does.
    Raises ReadAgain where the parts would not give exactly what one process reads."""
    from advisor.importers.kineto import ReadAgain

    starts = _part_starts(reader, len(buffer), processes)
    if not starts:
        return reader.read_array(buffer, start, array_form)
    slots = Progress(len(starts))  # each part's bytes read and events parsed
    children = [_fork(reader, at, end, array_form, slots, index)
                for index, (at, end) in enumerate(zip(starts, [*starts[1:], None]))]
    try:
        if any(child is None for child in children):  # no process could be started here
            return reader.read_array(buffer, start, array_form)
        reader.stop_at(starts[0])
        progress = reader.progress
        if progress is not None:
            reader.progress = _with_parts(progress, reader.progress_events, slots)
        reader.read_array(buffer, start, array_form)
        reader.progress = progress
        if reader.careful_used:  # damage in this part, or a part cut inside an event
            raise ReadAgain
        results = [child.result() for child in children]
        if not all(_exact(result) for result in results):
            raise ReadAgain
        for result in results:
            reader.absorb(result)
        reader.stop_at(None)
        return results[-1]["metadata"]
    finally:
        _stop_all(children)
        slots.close()


def _exact(result: dict[str, Any] | None) -> bool:
    """Whether a part's rows are what one process would have read there: its process
    came back, no chunk of it needed the careful path (whose pieces depend on where
    chunks start), and it numbered no thread label or id past int64 (numbered in order
    of first sight across the whole file)."""
    return result is not None and not result["careful_used"] and not result["numbered"]


def _part_starts(reader: EventReader, head_bytes: int, processes: int) -> list[int]:
    """Where the parts after the first start (the offset of an event's '{'), or [] where
    the file is read in one."""
    if reader.gzipped or not _reads_the_file(reader):
        return []
    size = reader.file_size
    count = min(processes, size // PART_MIN_BYTES)
    if count < 2:
        return []
    from advisor.importers.kineto import EVENT_CUT

    starts: list[int] = []
    try:
        with open(reader.path, "rb") as file:
            for i in range(1, count):
                nominal = max(int(size * (i + FIRST_EXTRA) / (count + FIRST_EXTRA)), head_bytes,
                              starts[-1] + 1 if starts else 0)
                file.seek(nominal)
                match = EVENT_CUT.search(file.read(_CUT_WINDOW))
                if match is not None and nominal + match.end() - 1 < size:
                    starts.append(nominal + match.end() - 1)
    except OSError:
        return []
    return starts


def _reads_the_file(reader: EventReader) -> bool:
    """Whether the reader's stream is the file at its path (the parts read that file)."""
    try:
        return os.path.samefile(reader.stream.name, reader.path)
    except (AttributeError, OSError, TypeError, ValueError):
        return False


def _with_parts(progress: Callable[..., None], with_events: bool, slots: Progress) -> Callable[..., None]:
    """The user's progress callable, hearing of every part's bytes and events."""

    most = [0]

    def heard(done: int, total: int, events: int | None = None) -> None:
        more_bytes, more_events = slots.total()
        # A progress bar never goes back: the sum of the parts' slots, read while their
        # processes write them, once came out lower than a sum heard before it (a CI run,
        # not reproduced since), and a bar that shrinks reads as a restart.
        done = most[0] = max(most[0], min(total, done + more_bytes))
        if with_events:
            progress(done, total, events=(events or 0) + more_events)
        else:
            progress(done, total)

    return heard


def _fork(reader: EventReader, start: int, end: int | None, array_form: bool, slots: Progress,
          index: int) -> Forked | None:
    """A process reading the bytes [start, end) of the file (to its end: None)."""
    return Forked.start(lambda: _read_part(reader, start, end, array_form, slots, index))


def _stop_all(children: list[Forked | None]) -> None:
    for child in children:
        if child is not None:
            child.stop()


def _read_part(parent: EventReader, start: int, end: int | None, array_form: bool, slots: Progress,
               index: int) -> dict[str, Any]:
    """In the part's process: read it with a reader of its own, and return its columns
    joined, its text tables and what it counted."""
    reader = type(parent).part(parent.path, start, end, lambda done, events: slots.put(index, done, events))
    return reader.part_result(reader.read_array(b"", 0, array_form))
