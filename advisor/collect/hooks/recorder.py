"""torch.profiler's life cycle in a profiled run, and the ranges it records.

The host side runs ``torch.profiler.profile`` with CPU activities only (the GPU collector,
where one runs, owns CUPTI, and then no profiler runs at all: ``profiler=False``). With a
window of steps the profiler is prepared at start, records from the window's first step and
stops at its end; without one the whole run is recorded in parts of ``PART_STEPS`` steps
until an event budget is spent. Each range (a step, a phase, a host-blocking call) is a
``record_function`` range while torch.profiler records; where the GPU collector records
instead, the collector alone hears of it (no record_function: nothing else listens).

Why not ``prof.step()``: in torch 2.x a profiler made without a ``schedule`` does not record
steps at all (``record_steps`` is False), and one made with a schedule opens
``ProfilerStep#0`` in ``start()``, so step 0 would hold the imports and model set-up, and it
cannot end a step without starting another one. The collector therefore records the
``ProfilerStep#N`` ranges itself.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import HostCollection
from advisor.collect.steps import StepWindow
from advisor.importers.advisor_metadata import METADATA_KEY, trace_metadata_json

# A whole-run recording (--steps all) is written in parts of this many steps, so the event
# budget can be checked at each part's end and no part holds more than this many steps.
PART_STEPS = 20
# Kineto writes these lines straight to file descriptor 2 on every profiler start and stop,
# whatever KINETO_LOG_LEVEL says; they are noise in the user's terminal.
_KINETO_NOISE = ("USDT:", "STAGE:")
NO_RANGE = contextlib.nullcontext()


class ReportedRange:
    """A record_function range that the listening GPU collector also hears of."""

    __slots__ = ("_recorder", "_name", "_handle", "_token")

    def __init__(self, recorder: "Recorder", name: str):
        self._recorder = recorder
        self._name = name

    def __enter__(self) -> "ReportedRange":
        self._handle = self._recorder.enter(self._name)
        self._token = self._recorder.opened(self._name)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.__exit__(*exc)
        self._recorder.closed(self._token)


class Recorder:
    """torch.profiler for one run: prepared, recording, stopped; parts and export."""

    def __init__(self, torch: Any, *, profiler: bool, listener: Any, record_shapes: bool, with_stack: bool,
                 window: StepWindow | None, event_budget: int | None, parts_dir: Path | None,
                 manual: bool, warmup: bool, say: Callable[[str], None],
                 metadata: Callable[[], dict[str, Any]]):
        """``metadata()``: the run's facts so far, written into each trace or part as it
        is finished."""
        self._torch = torch
        self.use_profiler = profiler
        self.listener = listener
        self._record_shapes = record_shapes
        self._with_stack = with_stack
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        self.window = window
        self._event_budget = event_budget
        self._parts_dir = parts_dir
        self._manual = manual
        self._warming = warmup and profiler
        self._say = say
        self._metadata = metadata
        self._prof: Any = None
        # "off" (none runs), "prepared" (warmed up, recording nothing yet), "recording",
        # "done" (stopped before the run ended).
        self.state = "off"
        self.own_start = False  # set while this recorder starts its own profiler
        self._recorded_steps: list[int] = []
        self._parts: list[Path] = []
        self._events_written = 0
        self._part_steps = 0
        self._facts: dict[str, Any] = {}
        if window is not None:
            self._facts["window"] = str(window)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        if not self.use_profiler:
            return
        self._prof = self._new_profiler()
        with quiet_kineto(), inductor_left_alone(self._torch):
            if self._warming or self.window is not None:
                self._prof.prepare_trace()
                self.state = "prepared"
            else:
                self._prof.start()
                self.state = "recording"

    def abandon(self) -> None:
        """Stop a profiler started by a start whose hooks then failed to install."""
        if self._prof is not None:
            with quiet_kineto():
                self._prof.stop()

    def _new_profiler(self) -> Any:
        return self._torch.profiler.profile(activities=self.activities, record_shapes=self._record_shapes,
                                            with_stack=self._with_stack)

    def record(self) -> None:
        """Start recording, after a ``warmup`` start or where a window's first step opens
        (a no-op otherwise)."""
        if self.state != "prepared":
            return
        self._warming = False
        self.own_start = True  # the hooks must not take this start for the script's own profiler
        try:
            with quiet_kineto():
                self._prof.start_trace()
        finally:
            self.own_start = False
        self.state = "recording"

    def recording(self) -> bool:
        """Whether torch.profiler records now."""
        return self.state == "recording"

    def records_now(self) -> bool:
        """Whether anything records this instant: torch's profiler inside the window, or the
        listening GPU collector inside its own."""
        if self.state == "recording":
            return True
        listener = self.listener
        return listener is not None and getattr(listener, "records_now", _always)()

    def close(self) -> None:
        """The run is over: finish a recording still running."""
        if self.state == "recording":
            self._finish()
            self.state = "done"

    def _stop_recording(self, why: str) -> None:
        """Stop torch.profiler before the run ends (the window is over); the steps after
        are timed, not recorded."""
        if self.state != "recording":
            return
        self._facts["stopped"] = why
        began = time.perf_counter()
        self._finish()
        # torch.profiler processes what it recorded as it stops: time the script spends
        # between two steps, in no step's figure, said in the report.
        self._facts["stop_s"] = round(time.perf_counter() - began, 3)
        self.state = "done"

    def _finish(self) -> None:
        """Write the facts known so far into the trace, stop the profiler and, where the
        run is recorded in parts, export this part."""
        try:
            self._prof.add_metadata_json(METADATA_KEY, trace_metadata_json(self._metadata()))
        finally:
            with quiet_kineto():
                self._prof.stop()
        if self._parts_dir is not None:
            self._export_part()

    def _export_part(self) -> None:
        path = self._parts_dir / f"part-{len(self._parts):04d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(path))
        self._parts.append(path)
        with open(path, "rb") as handle:  # Kineto writes '"ph": "X"' once per complete event
            self._events_written += handle.read().count(b'"ph": "X"')
        self._facts["parts"] = [str(p) for p in self._parts]
        self._facts["events"] = self._events_written

    def _rotate_part(self, next_step: int) -> None:
        """Whole-run recording in parts: end this part at a step boundary and, while the
        event budget lasts, start the next one."""
        self._finish()
        if self._event_budget is not None and self._events_written >= self._event_budget:
            self.state = "done"
            self._facts["stopped"] = (
                f"the event budget of {self._event_budget:,} events was spent by step {next_step - 1} "
                f"({self._events_written:,} events recorded); later steps were timed, not recorded "
                f"(--event-budget raises it)")
            self._say(f"recording stopped before step {next_step}: {self._events_written:,} events recorded, "
                      f"the budget is {self._event_budget:,} (--event-budget)")
            return
        self._prof = self._new_profiler()
        self.own_start = True
        try:
            with quiet_kineto(), inductor_left_alone(self._torch):
                self._prof.start()
        finally:
            self.own_start = False
        self._part_steps = 0

    def before_step(self, number: int) -> bool:
        """Before step ``number`` opens: start recording where the window begins, stop it
        where the window has ended, or begin the next part of a whole-run recording.
        Returns whether the step is recorded: by torch.profiler, or (where the CUPTI
        collector records instead) by the window the CUPTI collector was given."""
        if self.use_profiler and not self._manual:
            window = self.window
            if window is not None:
                if self.state == "prepared" and number in window:
                    self.record()
                    self._say(f"recording {window.describe()}")
                elif self.state == "recording" and number not in window:
                    self._stop_recording(f"the window ({window.describe()}) ended")
                    self._say(f"{window.describe()} recorded; the rest of the run is timed, not recorded")
            elif self._parts_dir is not None and self.state == "recording":
                if self._part_steps >= PART_STEPS:
                    self._rotate_part(number)
                self._part_steps += 1
        recorded = self.state == "recording" if self.use_profiler else (self.window is None or number in self.window)
        if recorded:
            self._recorded_steps.append(number)
        return recorded

    def past_window(self, number: int) -> bool:
        """Whether step ``number`` comes after a window that was recorded (False without a
        window: the whole run is recorded)."""
        return (self.window is not None and bool(self._recorded_steps) and number > self._recorded_steps[-1]
                and number not in self.window)

    def fill(self, result: HostCollection) -> None:
        result.recording.update(self._facts)
        result.recording["recorded_steps"] = list(self._recorded_steps)

    # -- output --------------------------------------------------------------------------

    def export(self, path: Path) -> Path:
        """Write the Chrome trace (gzipped where ``path`` ends in .gz)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(path))
        return path

    def trace_parts(self, path: Path) -> list[Path]:
        """The Chrome trace files of the run: the parts already written where the run was
        recorded in parts, else the one trace exported to ``path``."""
        if self._parts_dir is not None:
            if len(self._parts) == 1:  # one part is the trace: put it where it was asked for
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.suffix == ".gz":
                    with open(self._parts[0], "rb") as source, gzip.open(path, "wb") as target:
                        shutil.copyfileobj(source, target)
                    self._parts[0].unlink()
                else:
                    shutil.move(str(self._parts[0]), path)
                self._parts = [path]
            return list(self._parts)
        return [self.export(path)]

    # -- ranges --------------------------------------------------------------------------

    def enter(self, name: str) -> Any:
        """An entered record_function range named ``name`` (exit it with ``__exit__``)."""
        # A range only torch.profiler would see costs microseconds for nothing where it is
        # not recording (the steps outside the window). Where the GPU collector records
        # instead, no profiler runs: the collector hears of the range (``opened``) and keeps
        # it on its own timeline, so a record_function would be an op of its own for nothing.
        if not self.use_profiler or self.state != "recording":
            return NO_RANGE
        handle = self._torch.autograd.profiler.record_function(name)
        handle.__enter__()
        return handle

    def opened(self, name: str) -> Any:
        """Tell the listening GPU collector a range opened; its token for the close."""
        return self.listener.range_opened(name) if self.listener is not None else None

    def closed(self, token: Any) -> None:
        if self.listener is not None:
            self.listener.range_closed(token)

    def reported_range(self, name: str) -> ReportedRange:
        """A context manager: the range ``name``, heard by the GPU collector too."""
        return ReportedRange(self, name)

    # -- hooks ---------------------------------------------------------------------------

    def install(self, patches: base.Patches) -> None:
        # torch runs one profiler at a time: a script that starts its own would stop this
        # one under it (and exporting ours afterwards crashes the process), so ours ends
        # first and hands over.
        autograd_profiler = importlib.import_module("torch.autograd.profiler")
        for name in ("_prepare_profiler", "_enable_profiler"):
            if hasattr(autograd_profiler, name):
                patches.patch(autograd_profiler, name, _wrap_profiler_start)


def _always() -> bool:
    return True


def _wrap_profiler_start(original: Any) -> Any:
    @functools.wraps(original)
    def start(*args: Any, **kwargs: Any) -> Any:
        collector = base.ACTIVE
        if collector is not None and not collector.recorder.own_start and not base.in_traced_code():
            collector.hand_over(sys._getframe(1))
        return original(*args, **kwargs)

    return start


@contextmanager
def inductor_left_alone(torch: Any) -> Iterator[None]:
    """Start torch.profiler without importing torch._inductor.

    torch.profiler's prepare_trace asks ``hasattr(torch, "_inductor")`` to read inductor's
    CUDA-graph setting, and torch's lazy module attribute makes that question import
    inductor (and sympy): over a second and some 100 MB, most of what advisor cost a small
    script (benchmarks/RESULTS.md). A script that compiled something has imported inductor
    already and is asked as before; one that has not has no compiled CUDA graphs to note."""
    lazy = torch.__dict__.get("__getattr__")
    if "torch._inductor" in sys.modules or not callable(lazy):
        yield
        return

    def getattr_without_inductor(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = getattr_without_inductor
    try:
        yield
    finally:
        torch.__getattr__ = lazy


@contextmanager
def quiet_kineto() -> Iterator[None]:
    """Run a profiler start or stop with Kineto's status lines on fd 2 filtered out;
    anything else written to stderr meanwhile is passed on."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                if not line.startswith(_KINETO_NOISE)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
