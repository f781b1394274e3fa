"""Work on one large trace shared with a forked process, its result sent back.

advisor reads a large plain trace in parts (advisor.importers.parts), each part after the
first in a process of its own. A forked process sees this one's memory as it was, so the
work it is handed (a closure over the reader) is not pickled; only its result comes back,
through a pipe. Built on ``multiprocessing`` with the ``fork`` start method.

``ADVISOR_PROCESSES`` caps the processes advisor uses for one trace (1: none forked);
without it, the CPUs this process may run on, at most ``MAX_PROCESSES``, in processes that
asked for them (``use_cpus``: advisor's command line does); the process of a user's job
(advisor.profiler's API) is never forked unasked. Where ``fork`` is missing, or in a
daemonic process (a worker of a pool), everything runs in this process.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PROCESSES", "Forked", "processes_allowed", "use_cpus"]

MAX_PROCESSES = 8
WAIT_TICK_S = 0.05


_use_cpus = False


def use_cpus() -> None:
    """Let this process fork helpers, as many as it has CPUs (advisor's own commands)."""
    global _use_cpus
    _use_cpus = True


def processes_allowed() -> int:
    """How many processes advisor may use for one trace, this one included."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return 1
    wanted = os.environ.get("ADVISOR_PROCESSES", "").strip()
    if wanted:
        try:
            return max(1, int(wanted))
        except ValueError:
            return 1
    if not _use_cpus:
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
        self._process.join()
        self._done = True
        ok = self._process.exitcode == 0 and isinstance(value, tuple) and value[0] == "ok"
        return value[1] if ok else None

    def stop(self) -> None:
        """Stop the process if it is still working (a result not wanted after all)."""
        if self._done:
            return
        self._receive.close()
        self._process.kill()
        self._process.join()
        self._done = True


def _run(work: Callable[[], Any], send) -> None:
    """In the forked process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent hears Ctrl-C and stops this one
    try:
        value = ("ok", work())
    except BaseException as exc:  # noqa: BLE001  (any failure: the parent does the work itself)
        value = ("failed", f"{type(exc).__name__}: {exc}")
    try:
        _send(send, value)
    except BaseException:  # noqa: BLE001  (a result that cannot be sent: the parent hears EOF)
        pass
    send.close()


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
