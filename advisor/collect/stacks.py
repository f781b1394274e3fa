"""Where the host's time goes in Python: a statistical sampler of Python stacks.

torch.profiler sees operators; the time a script spends in its own Python (tokenizing in
``Dataset.__getitem__``, a per-sample augmentation, building a batch by hand) launches no
operator and shows as a gap. Tracing every Python call (torch.profiler's ``with_stack``)
finds it but records a million events a step in such code and slows it several times.
Sampling does not: every ``interval_s`` of the process's CPU time (5 ms by default) an
interval timer interrupts the main thread, which reads its own stack and keeps it with
the step and phase it was in (a background thread reading ``sys._current_frames()`` is
the fallback; see :class:`StackSampler`). The cost is one stack walk per sample, a few
microseconds for a deep stack; benchmarks/stack_sampler.py measures it.

A sample stands for the time since the previous one. The sampler's handler runs only
where the interpreter checks for a pending signal (after a call returns, at a loop's jump
back, at a function's entry), not where the timer fired: a long C call (a regex over a
long text, a big list sort) is sampled on its own line when it returns, but an operator's C
code (``a * b`` on tensors, a slice of a long list) has no check after it, and its time
would land on the next Python function called. A sample taken at a function's entry is
therefore the caller's, on its last operator since its previous check (else on the call's
line), and one at a loop's jump back is the body's last operator (see ``_landing``).
Samples are not spread evenly over time for the same reason (a
thread in torch ops releases the GIL and is sampled at the full rate), so the tables
take each phase's time from the step clock and use the samples only to share it out
among the lines that ran in the phase. Stacks are interned: a run that loops over the
same code keeps each distinct stack once.

DataLoader worker processes are sampled too: while a run is collected,
``torch.utils.data._utils.worker._worker_loop`` is replaced by :func:`sampled_worker_loop`,
which starts a sampler in the worker and writes its samples to the folder named by
``ADVISOR_STACKS_DIR`` (every second, and when the worker ends). It is a module-level
function, so a loader with the ``spawn`` or ``forkserver`` start method pickles it by
name, and the worker imports it from the installed package.
"""

from __future__ import annotations

import bisect
import dis
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.collect.hooks.base import hide_from_dynamo

__all__ = ["DEFAULT_INTERVAL_S", "ENV_DIR", "ENV_INTERVAL", "LOADER_WORKER", "MAIN", "StackSampler", "StackSamples",
           "install_worker_sampling", "read_worker_samples", "sampled_worker_loop"]

DEFAULT_INTERVAL_S = 0.005
MAX_DEPTH = 64
MAX_SAMPLES = 500_000  # about 40 minutes at 200 Hz; later samples are counted, not kept
ENV_DIR = "ADVISOR_STACKS_DIR"
ENV_INTERVAL = "ADVISOR_STACKS_INTERVAL_S"
WORKER_FLUSH_S = 1.0
MAIN, LOADER_WORKER = "main", "loader worker"


@dataclass
class StackSamples:
    """What one sampler took: per sample its time, weight, stack id, step and phase; the
    stacks as Kineto spells call stacks ("file(line): function;..." innermost first)."""

    role: str
    pid: int
    tid: int
    interval_ns: int
    time_ns: list[int] = field(default_factory=list)
    weight_ns: list[int] = field(default_factory=list)
    stack_id: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.time_ns)

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "tid": self.tid, "interval_ns": self.interval_ns,
                "time_ns": self.time_ns, "weight_ns": self.weight_ns, "stack_id": self.stack_id,
                "step": self.step, "phase": self.phase, "stacks": self.stacks, "dropped": self.dropped}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackSamples:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


class StackSampler:
    """Samples one thread's Python stack every ``interval_s``.

    Two ways, chosen at start: ``signal`` (the sampled thread is the main thread, this is
    the main thread, and nobody else handles SIGPROF): an interval timer on the process's
    CPU time (ITIMER_PROF) raises SIGPROF and the handler reads the interrupted frame, so
    a sample lands where the thread is, at its next bytecode. ``thread``: a background
    thread reads ``sys._current_frames()``; it needs the GIL to do so, which a thread
    giving the GIL up often (every torch op) hands it mostly at those points, so samples
    pile up there. The signal way is used where it can be.

    ``state()`` (optional) says where the sampled thread is when a sample is taken:
    (step, phase); the host collector gives its open step and phase."""

    def __init__(self, thread_id: int | None = None, *, interval_s: float = DEFAULT_INTERVAL_S,
                 state: Callable[[], tuple[int, str]] | None = None, role: str = MAIN,
                 clock: Callable[[], int] = time.time_ns, flush_to: Path | None = None, how: str = "auto"):
        self._tid = threading.get_ident() if thread_id is None else thread_id
        self._interval_s = interval_s
        self._state = state
        self._clock = clock
        self._ids: dict[tuple, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ns = 0
        self._flush_to = flush_to
        self._next_flush = 0.0
        self._how = how
        self._old_handler: Any = None
        self._in_handler = False
        # Whether the handler is marked for torch.compile to leave alone (hide_from_dynamo):
        # at start where torch is loaded, else at the first signal after it is (its C module
        # is there from ``import torch`` on, long before any compiled call).
        self._hidden = False
        self.way = ""
        self.samples = StackSamples(role=role, pid=os.getpid(), tid=self._tid, interval_ns=int(interval_s * 1e9))

    def _can_signal(self) -> bool:
        if self._how == "thread" or not hasattr(signal, "setitimer"):
            return False
        if threading.current_thread() is not threading.main_thread() or self._tid != threading.main_thread().ident:
            return False
        return signal.getsignal(signal.SIGPROF) in (signal.SIG_DFL, signal.SIG_IGN, None)

    def start(self) -> StackSampler:
        self._last_ns = self._clock()
        self._next_flush = time.monotonic() + WORKER_FLUSH_S
        if self._can_signal():
            self._hidden = hide_from_dynamo(StackSampler._on_signal)
            self._old_handler = signal.signal(signal.SIGPROF, self._on_signal)
            # Restart interrupted system calls: C and C++ libraries that do not retry on
            # EINTR must never see the sampler.
            signal.siginterrupt(signal.SIGPROF, False)
            signal.setitimer(signal.ITIMER_PROF, self._interval_s, self._interval_s)
            self.way = "signal"
        else:
            self._thread = threading.Thread(target=self._run, name="advisor-stacks", daemon=True)
            self._thread.start()
            self.way = "thread"
        return self

    def stop(self) -> StackSamples:
        if self.way == "signal":
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, self._old_handler if self._old_handler is not None else signal.SIG_DFL)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if self._flush_to is not None:
            self.write(self._flush_to)
        return self.samples

    def write(self, path: Path) -> None:
        """The samples as JSON, written whole and renamed into place."""
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.samples.as_dict()))
        os.replace(temporary, path)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A handler slower than the interval (the first sight of a large code object) is
        # itself interrupted: that sample is one, not a nest of them. A signal that came as
        # the handler was being called is handled at the handler's own entry, before it
        # marks itself: the call it interrupted takes that sample.
        if self._in_handler or frame is None or frame.f_code is StackSampler._on_signal.__code__:
            return
        self._in_handler = True
        try:
            if not self._hidden:
                self._hidden = hide_from_dynamo(StackSampler._on_signal)
            self._record(frame)
            self._maybe_flush()
        except Exception:  # noqa: BLE001  (a sampler must never take the user's run down)
            pass
        finally:
            self._in_handler = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.take()
                self._maybe_flush()
            except Exception:  # noqa: BLE001  (a sampler must never take the user's run down)
                continue

    def _maybe_flush(self) -> None:
        if self._flush_to is not None and time.monotonic() >= self._next_flush:
            self._next_flush = time.monotonic() + WORKER_FLUSH_S
            self.write(self._flush_to)

    def take(self) -> None:
        """Take one sample of the sampled thread's stack, now (from another thread)."""
        self._record(sys._current_frames().get(self._tid))

    def _record(self, frame: Any) -> None:
        now = self._clock()
        weight = now - self._last_ns
        self._last_ns = now
        if frame is None:
            return
        samples = self.samples
        if len(samples.time_ns) >= MAX_SAMPLES:
            samples.dropped += 1
            return
        step, phase = self._state() if self._state is not None else (-1, "")
        frames = []
        depth = 0
        landed = None
        if self.way == "signal":
            frame, landed = _landing(frame)
        while frame is not None and depth < MAX_DEPTH:
            line = frame.f_lineno if landed is None else landed
            landed = None
            if line is None:  # an instruction of no line: a loop's jump back (see _line_at)
                line = _line_at(frame.f_code, frame.f_lasti)
            frames.append((frame.f_code, line))
            frame = frame.f_back
            depth += 1
        key = tuple(frames)
        stack_id = self._ids.get(key)
        if stack_id is None:
            stack_id = self._ids[key] = len(samples.stacks)
            samples.stacks.append(";".join(f"{code.co_filename}({line}): {code.co_name}" for code, line in frames))
        samples.time_ns.append(now)
        samples.weight_ns.append(weight)
        samples.stack_id.append(stack_id)
        samples.step.append(step)
        samples.phase.append(phase)


# Instructions that run C code of their own (an operator's, a subscript's, a formatting's)
# with no check for a pending signal after them: a signal that came during one is handled
# at the next check (a call, a loop's jump back, a function's entry), on another line.
_OPERATORS = frozenset({"BINARY_OP", "BINARY_SUBSCR", "STORE_SUBSCR", "DELETE_SUBSCR", "COMPARE_OP",
                        "CONTAINS_OP", "UNARY_NEGATIVE", "UNARY_INVERT", "FORMAT_VALUE", "BUILD_STRING",
                        "LIST_EXTEND", "GET_ITER"})
# Where a pending signal is handled, besides after a call returns.
_ENTRY, _JUMP_BACK = "RESUME", "JUMP_BACKWARD"
_CHECKS = frozenset({"CALL", "CALL_FUNCTION_EX", _ENTRY, "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT",
                     "YIELD_VALUE", "RETURN_VALUE"})


def _landing(frame: Any) -> tuple[Any, int | None]:
    """The frame and line a signal sample stands for, where that is not the interrupted
    frame's own line. The handler runs at the first check for a pending signal after the
    timer fired, not where the time went: at a function's entry (RESUME), the time was the
    caller's (the callee has run nothing yet), spent in the caller's last operator since its
    previous check (``a * b`` on tensors, a slice of a long list), else in the call's own
    line; at a loop's jump back, in the loop body's last operator. Elsewhere (after a call
    returned) the line is the call's own: the time was the called function's or an
    operator's before it, and nothing tells which. Returns (frame, None) to keep the line."""
    kind = _checkpoint(frame.f_code, frame.f_lasti)
    if kind is None:
        return frame, None
    opname, operator_line = kind
    if opname == _ENTRY:
        caller = frame.f_back
        if caller is None:
            return frame, None
        found = _checkpoint(caller.f_code, caller.f_lasti)
        return caller, found[1] if found is not None else None
    if opname.startswith(_JUMP_BACK):
        return frame, operator_line
    return frame, None


def _checkpoint(code: Any, lasti: int) -> tuple[str, int | None] | None:
    """The check for a pending signal at ``lasti`` (which may point into the instruction's
    inline caches, as a caller's does during a call): see ``_checkpoints``; None where the
    instruction there is no such check."""
    offsets, found = _checkpoints(code)
    at = bisect.bisect_right(offsets, lasti) - 1
    return found.get(offsets[at]) if at >= 0 else None


@functools.lru_cache(maxsize=8192)
def _checkpoints(code: Any) -> tuple[list[int], dict[int, tuple[str, int | None]]]:
    """The offsets of ``code``'s instructions, and for each one where a pending signal is
    handled: its name and the line of the last operator that ran before it since the
    previous such instruction (None where none did). The scan stops at jump targets too:
    code before one may not have run."""
    offsets: list[int] = []
    found: dict[int, tuple[str, int | None]] = {}
    last: int | None = None
    line: int | None = code.co_firstlineno
    for instruction in dis.get_instructions(code):
        offsets.append(instruction.offset)
        if instruction.starts_line is not None:
            line = instruction.starts_line
        if instruction.is_jump_target:
            last = None
        name = instruction.opname
        if name in _CHECKS:
            found[instruction.offset] = (name, last)
            last = None
        elif name in _OPERATORS:
            last = line
    return offsets, found


@functools.lru_cache(maxsize=4096)
def _line_at(code: Any, lasti: int) -> int:
    """The line of the instruction at ``lasti`` where ``f_lineno`` is None. A frame stopped
    at an instruction the compiler gave no line (in CPython 3.11 a loop's jump back to its
    start, where a signal handler runs) reports no line, and the sample would land on the
    caller's line instead of the loop's: a jump back counts for the loop's own line (where
    it jumps to), any other such instruction for the nearest line before it."""
    lines = {}
    found = code.co_firstlineno
    for start, _end, line in code.co_lines():
        if line is not None:
            lines.setdefault(start, line)
            if start <= lasti:
                found = line
    for instruction in dis.get_instructions(code):
        if instruction.offset == lasti:
            if instruction.opname.startswith("JUMP_BACKWARD") and isinstance(instruction.argval, int):
                target = max((o for o in lines if o <= instruction.argval), default=None)
                return lines[target] if target is not None else found
            break
    return found


# -- DataLoader workers -----------------------------------------------------------------------

_ORIGINAL_WORKER_LOOP: Any = None


def install_worker_sampling(directory: Path, interval_s: float) -> Callable[[], None]:
    """Sample the DataLoader workers this process starts from now on; returns the undo."""
    global _ORIGINAL_WORKER_LOOP
    from torch.utils.data._utils import worker  # noqa: PLC0415

    original = worker._worker_loop
    if original is sampled_worker_loop:
        return lambda: None
    _ORIGINAL_WORKER_LOOP = original
    worker._worker_loop = sampled_worker_loop
    saved = {name: os.environ.get(name) for name in (ENV_DIR, ENV_INTERVAL)}
    os.environ[ENV_DIR] = str(directory)
    os.environ[ENV_INTERVAL] = repr(interval_s)

    def undo() -> None:
        global _ORIGINAL_WORKER_LOOP
        if worker._worker_loop is sampled_worker_loop:
            worker._worker_loop = original
        _ORIGINAL_WORKER_LOOP = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return undo


def sampled_worker_loop(*args: Any, **kwargs: Any) -> Any:
    """A DataLoader worker's loop with a stack sampler running beside it."""
    from torch.utils.data._utils import worker  # noqa: PLC0415

    # A forked worker inherits the original from the parent; a spawned one imported torch
    # afresh, so torch's own loop is still in place.
    loop = _ORIGINAL_WORKER_LOOP or worker._worker_loop
    directory = os.environ.get(ENV_DIR)
    sampler = None
    if directory:
        try:
            # A forked worker inherits the parent sampler's SIGPROF handler (not its
            # timer): it is the parent's, and would keep this worker's from using signals.
            if hasattr(signal, "SIGPROF") and getattr(signal.getsignal(signal.SIGPROF), "__self__", None) is not None:
                signal.signal(signal.SIGPROF, signal.SIG_DFL)
            interval = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL_S))
            path = Path(directory) / f"worker-{os.getpid()}.json"
            sampler = StackSampler(interval_s=interval, role=LOADER_WORKER, flush_to=path).start()
        except Exception:  # noqa: BLE001  (no samples is better than a broken worker)
            sampler = None
    try:
        return loop(*args, **kwargs)
    finally:
        if sampler is not None:
            try:
                sampler.stop()
            except Exception:  # noqa: BLE001
                pass


def read_worker_samples(directory: Path) -> tuple[list[StackSamples], list[str]]:
    """The samples the workers wrote into ``directory``, and a line per file that could
    not be read (a worker killed while writing leaves its last complete file)."""
    found: list[StackSamples] = []
    problems: list[str] = []
    for path in sorted(Path(directory).glob("worker-*.json")):
        try:
            found.append(StackSamples.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"{path.name}: {exc}")
    return found, problems
