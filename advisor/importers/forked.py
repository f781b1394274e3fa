"""Work on one trace shared with a forked process, its result sent back.

advisor reads a large plain trace in parts (advisor.importers.parts), each part after the
first in a process of its own, and reads a smaller trace in a process forked before the
command's imports (advisor.importers.ahead). A forked process sees this one's
memory as it was, so the work it is handed (a closure over the reader, the session) is not
pickled; only its result comes back, through a pipe (``Progress``: how far they have read,
in shared memory, for a progress bar meanwhile). Built on ``multiprocessing`` with the
``fork`` start method.

How many processes may be used is the command's to say (``processes_allowed``), passed
down as a parameter: a library call forks nothing unless told to, so the process of a
user's job (advisor.profiler's API) never does. ``ADVISOR_PROCESSES`` sets how many
processes a command uses for one trace (1: none forked); without it, the CPUs the command
may run on, at most ``MAX_PROCESSES``. Where ``fork`` is missing, or in a daemonic process
(a worker of a pool), everything runs in this process.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PROCESSES", "Forked", "Progress", "processes_allowed"]

MAX_PROCESSES = 8
WAIT_TICK_S = 0.05
JOIN_TIMEOUT_S = 10.0


def processes_allowed() -> int:
    """How many processes advisor's own command may use for one trace, this one included:
    ADVISOR_PROCESSES, else the CPUs free to it (up to MAX_PROCESSES); 1 without fork or in
    a daemon process (a job's worker). Only the command asks, and passes the answer down
    (``load(..., processes=)``): a user's job (advisor.Profiler) is never forked."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return 1
    wanted = os.environ.get("ADVISOR_PROCESSES", "").strip()
    if wanted:
        try:
            return max(1, int(wanted))
        except ValueError:
            return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_PROCESSES))


class Forked:
    """``work()`` run in a forked process. ``result()`` is what it returned, or None
    where the process failed (an exception, memory, a signal): the caller then does the
    work itself. A Ctrl-C reaches this process only, which stops the forked one."""

    def __init__(self, work: Callable[[], Any]):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_run, args=(work, send), daemon=True)
        self._process.start()
        send.close()  # this process only receives: the pipe ends when the forked one's end closes
        self._done = False

    @classmethod
    def start(cls, work: Callable[[], Any]) -> Forked | None:
        """The process doing ``work``, or None where one cannot be started here."""
        try:
            return cls(work)
        except (OSError, AssertionError, ValueError):  # no fork, too many processes, a daemon's child
            return None

    def result(self, *, waiting: Callable[[], None] | None = None) -> Any | None:
        """``waiting()``, where given, is called every ``WAIT_TICK_S`` until the result
        begins to come (a progress bar's update)."""
        try:
            if waiting is not None:
                while not self._receive.poll(WAIT_TICK_S):
                    waiting()
                waiting()
            value = _receive(self._receive)
        except (EOFError, OSError, MemoryError, pickle.UnpicklingError):
            value = None
        finally:
            self._receive.close()
        self._process.join(JOIN_TIMEOUT_S)  # all it has left to do is end
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
        self._done = True
        if not isinstance(value, tuple) or len(value) != 3:
            return None
        for text, category, filename, lineno in value[2]:
            warnings.warn_explicit(text, category, filename, lineno)
        return value[1] if value[0] == "ok" else None

    def stop(self) -> None:
        """Stop the process if it is still working (a result not wanted after all)."""
        if self._done:
            return
        self._receive.close()
        self._process.kill()
        self._process.join()
        self._done = True


class Progress:
    """How far forked processes have read (bytes, events), in memory shared with them:
    each writes its own slot as it goes, this process sums them for a progress bar."""

    _SLOT = struct.Struct("qq")

    def __init__(self, count: int = 1):
        self._memory = mmap.mmap(-1, self._SLOT.size * count)
        self.count = count

    def put(self, index: int, done: int, events: int) -> None:
        """In a forked process: slot ``index`` has read ``done`` bytes, ``events`` events."""
        self._SLOT.pack_into(self._memory, index * self._SLOT.size, done, events)

    def total(self) -> tuple[int, int]:
        """(bytes, events) of every slot together."""
        slots = [self._SLOT.unpack_from(self._memory, i * self._SLOT.size) for i in range(self.count)]
        return sum(done for done, _ in slots), sum(events for _, events in slots)

    def close(self) -> None:
        if not self._memory.closed:
            self._memory.close()


def _run(work: Callable[[], Any], send) -> None:
    """In the forked process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent hears Ctrl-C and stops this one
    _own_streams()
    with warnings.catch_warnings(record=True) as caught:
        try:
            value = ("ok", work())
        except BaseException as exc:  # noqa: BLE001  (any failure: the parent does the work itself)
            value = ("failed", f"{type(exc).__name__}: {exc}")
    # Said by the parent, under its filters, as if it had done the work itself.
    value = (*value, [(str(w.message), w.category, w.filename, w.lineno) for w in caught])
    try:
        _send(send, value)
    except BaseException:  # noqa: BLE001  (a result that cannot be sent: the parent hears EOF)
        pass
    send.close()


def _own_streams() -> None:
    """Standard output and error of this process's own, on the same descriptors: the
    parent's may be a progress display's proxy, whose lock another of its threads (the
    display's refresh) may have held at the fork, and would then never be let go here."""
    for name, descriptor in (("stdout", 1), ("stderr", 2)):
        try:
            stream = open(descriptor, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
        except OSError:
            stream = open(os.devnull, "w")  # noqa: SIM115
        setattr(sys, name, stream)


def _send(connection, value: Any) -> None:
    """The value pickled, its large buffers (numpy arrays' memory) sent as they are after
    it rather than copied into the pickle: a part of a 1 GB trace sends ~300 MB of them."""
    buffers: list[pickle.PickleBuffer] = []
    header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    connection.send((header, [view.nbytes for view in views]))
    for view in views:
        connection.send_bytes(view)


def _receive(connection) -> Any:
    header, sizes = connection.recv()
    buffers = []
    for size in sizes:
        buffer = bytearray(size)  # writable, so the arrays made on it are too
        if size:
            connection.recv_bytes_into(buffer)
        else:
            connection.recv_bytes()
        buffers.append(buffer)
    return pickle.loads(header, buffers=buffers)
