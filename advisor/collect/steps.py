"""Which steps a collector records, and the clock that times every step, recorded or not.

``StepWindow``: ``--steps A:B`` records steps A to B-1. By default steps 2 to 6 are
recorded, after two warm-up steps (the first steps of a run pay for lazy initialisation,
allocator growth and autotuning), so a long job records a handful of steps with bounded
memory whatever its length. Both collectors use it: the CUPTI collector on a GPU and the
host collector (torch.profiler) everywhere.

``StepClock``: the hooks tell it where each step and phase begins and ends, and it keeps
every step's duration and its time per phase on ``time.time_ns()`` (the trace's clock),
whether or not the profiler was recording, and the time the hooks' own code took in the
step. The steps after the window ran without the profiler: their times, less the hooks'
own, are what the job takes unprofiled, and the recorded steps' excess over them is the
profiler's overhead. It costs two clock reads per step and per phase, and two per hook.

Each step also keeps the main thread's CPU time (``time.thread_time_ns``) and how many
times each phase opened, a forward with autograd off counted apart: a step's shape and its
own CPU time do not swing with the machine's load as its wall time does, so periodic work
(a validation pass every N steps) is found on a busy machine too. And the whole process's
CPU time (``time.process_time_ns``: torch's operator threads too): over the step's wall
time, the cores the training loop keeps busy, which worker processes would compete for.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from advisor.errors import UsageError
from advisor.session.meta import FORWARD_NO_GRAD

__all__ = ["DEFAULT_RECORDED_STEPS", "DEFAULT_WARMUP_STEPS", "FORWARD_NO_GRAD", "MAX_TIMED_STEPS", "EnoughSteps",
           "StepClock", "StepWindow", "StopAfter"]

DEFAULT_WARMUP_STEPS = 2
DEFAULT_RECORDED_STEPS = 5
MAX_TIMED_STEPS = 100_000  # a run longer than this keeps its first steps' times only


@dataclass(frozen=True)
class StepWindow:
    """Steps ``start`` to ``stop - 1`` (``stop`` None: to the end), as ``--steps A:B``."""

    start: int = DEFAULT_WARMUP_STEPS
    stop: int | None = DEFAULT_WARMUP_STEPS + DEFAULT_RECORDED_STEPS

    @classmethod
    def parse(cls, value: str) -> StepWindow | None:
        """``A:B`` (steps A..B-1), ``A:`` (from A on), ``:B``, ``N`` (step N only) or
        ``all`` (the whole run, steps or not: returns None)."""
        text_value = value.strip()
        if text_value == "all":
            return None
        match = re.fullmatch(r"(\d*)(:(\d*))?", text_value)
        if not match or (not match[1] and not match[3]):
            raise UsageError(f"--steps {value!r}: expected A:B (steps A to B-1), A:, :B, N or all")
        start = int(match[1]) if match[1] else 0
        if match[2] is None:
            return cls(start, start + 1)
        stop = int(match[3]) if match[3] else None
        if stop is not None and stop <= start:
            raise UsageError(f"--steps {value!r}: the window is empty (B must be greater than A)")
        return cls(start, stop)

    def __contains__(self, step: int) -> bool:
        return step >= self.start and (self.stop is None or step < self.stop)

    def __str__(self) -> str:
        return f"{self.start}:{'' if self.stop is None else self.stop}"

    def describe(self) -> str:
        """``steps 2-6``, ``steps 5 on``, ``step 3``."""
        if self.stop is None:
            return f"steps {self.start} on"
        if self.stop == self.start + 1:
            return f"step {self.start}"
        return f"steps {self.start}-{self.stop - 1}"


class EnoughSteps(BaseException):
    """Raised in the script's main thread where a step would open once the diagnosis has
    what it needs (``StopAfter``): the script's code unwinds, its ``finally`` blocks and
    context managers run, and the run ends as stopped by advisor. A BaseException, so the
    script's own ``except Exception`` does not take it for an error of its own."""

    def __init__(self, step: int, after: int):
        super().__init__(f"advisor stopped the script at step {step}, {after} steps after the recorded window")
        self.step = step
        self.after = after


@dataclass
class StopAfter:
    """When a script diagnosed under advisor has run long enough: the recorded window is
    over and ``steps`` steps have been timed after it, or (not in a distributed job, whose
    ranks must stop at the same step) ``seconds`` have passed since it ended and at least
    ``min_steps`` were timed. The steps after the window give the job's own pace and the
    work that comes every N steps; a script that trains for hours, or never ends, is not
    run whole for them (``advisor diagnose --run-to-end`` runs it whole)."""

    steps: int = 300
    seconds: float = 60.0
    min_steps: int = 5
    distributed: Any = None  # a callable: whether the job is distributed (its ranks stop by count alone)
    _first: int | None = None
    _since: float = 0.0

    def enough(self, number: int) -> bool:
        """Whether step ``number``, the next to open after the window, need not run."""
        if self._first is None:
            self._first, self._since = number, time.monotonic()
        after = number - self._first
        if after >= self.steps:
            return True
        if after < self.min_steps or time.monotonic() - self._since < self.seconds:
            return False
        return not (self.distributed is not None and self.distributed())

    def after(self, number: int) -> int:
        """Steps timed after the window before step ``number``."""
        return 0 if self._first is None else number - self._first


class StepClock:
    """Every step's start, duration and time per phase, on ``time.time_ns()``.

    ``rows`` holds one list per finished step: [step, start_ns, duration_ns, recorded,
    partial, {phase: ns}] (see :meth:`as_records`). A phase's time is the sum of its
    stretches in the step; what no phase covers is the step's "Others"."""

    def __init__(self, clock: Any = time.time_ns, cpu_clock: Any = time.thread_time_ns,
                 process_clock: Any = time.process_time_ns):
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._process_clock = process_clock
        self._cpu_start = 0
        self._process_start = 0
        self._calls: dict[str, int] = {}
        self.rows: list[list[Any]] = []
        self.dropped = 0
        self._step: int | None = None
        self._start = 0
        self._recorded = False
        self._phases: dict[str, int] = {}
        self._phase: str | None = None
        self._phase_start = 0
        self._own = 0  # the collector's own time in the open step (its hooks' code), ns

    def step_opened(self, number: int, *, recorded: bool) -> None:
        self._step = number
        self._start = self._clock()
        self._cpu_start = self._cpu_clock()
        self._process_start = self._process_clock()
        self._recorded = recorded
        self._phases = {}
        self._calls = {}
        self._phase = None
        self._own = 0

    def own(self, ns: int) -> None:
        """Count ``ns`` of the collector's own work (a hook's code) in the open step: the
        step's time less it is the job's own (on a step of tens of microseconds the hooks
        are a real part of it)."""
        self._own += ns

    def phase_opened(self, name: str, *, counted_as: str | None = None) -> None:
        """``counted_as``: the name the phase's call is counted under, where not its own
        (a forward with autograd off: ``FORWARD_NO_GRAD``)."""
        if self._step is not None:
            self._phase = name
            self._phase_start = self._clock()
            key = counted_as or name
            self._calls[key] = self._calls.get(key, 0) + 1

    def phase_closed(self) -> None:
        if self._step is not None and self._phase is not None:
            self._phases[self._phase] = self._phases.get(self._phase, 0) + self._clock() - self._phase_start
            self._phase = None

    def step_closed(self, *, partial: bool, recorded: bool | None = None) -> None:
        """``recorded``: False where the profiler stopped during the step."""
        if self._step is None:
            return
        self.phase_closed()
        if len(self.rows) < MAX_TIMED_STEPS:
            kept = self._recorded if recorded is None else (self._recorded and recorded)
            self.rows.append([self._step, self._start, self._clock() - self._start, kept, partial, self._phases,
                              self._own, self._cpu_clock() - self._cpu_start, self._calls,
                              self._process_clock() - self._process_start])
        else:
            self.dropped += 1
        self._step = None

    def as_records(self) -> list[dict[str, Any]]:
        """The rows as dicts: step, start_ns, duration_ns, recorded, partial, phases, own_ns
        (the collector's own time in the step), cpu_ns (the main thread's CPU time in the
        step), calls (times each phase opened) and process_cpu_ns (the whole process's CPU
        time in the step)."""
        keys = ("step", "start_ns", "duration_ns", "recorded", "partial", "phases", "own_ns", "cpu_ns", "calls",
                "process_cpu_ns")
        return [dict(zip(keys, row)) for row in self.rows]
