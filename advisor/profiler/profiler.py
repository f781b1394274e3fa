"""advisor.Profiler: profile a training loop from inside the code, as with paddle.profiler or
torch.profiler, into the same Session, tables, rules and reports as ``advisor diagnose``.

    with advisor.Profiler(scheduler=(2, 5), on_trace_ready=advisor.save_session("runs")) as prof:
        for batch in loader:
            train(batch)
            prof.step(num_samples=len(batch))
    prof.summary()             # the summary tables of the last recorded span
    findings = prof.diagnose() # the rules' ranked findings

Steps. ``start()`` begins step 0 and every ``step()`` ends the open step and begins the
next, so ``step()`` belongs at the end of each iteration (paddle's convention). The step a
loop's last ``step()`` begins is timed and recorded only where it does work (a batch read,
a forward, backward or optimizer step): the loop that ends there has nothing left to do.

States and spans. A scheduler maps each step number to a :class:`ProfilerState`:

    CLOSED             nothing is collected
    READY              the collector is warmed up (torch.profiler prepared), nothing kept
    RECORD             the step is recorded
    RECORD_AND_RETURN  the last step of a span: after it, the span is handed over

A *span* is a run of recorded steps. When it ends (after RECORD_AND_RETURN, on a step that
is not recorded, or at ``stop()``) it becomes a Session (``prof.session``) and
``on_trace_ready(prof)`` is called once with it. The scheduler is one of

- None: record every step from ``start()`` to ``stop()``: one span;
- ``(start, end)``: record steps start..end-1 (half-open, paddle's tuple form; the step
  before ``start`` is READY);
- :func:`make_scheduler` (closed, ready, record, repeat, skip_first; torch.profiler's
  schedule with wait, warmup, active);
- any callable from a step number to a ProfilerState (or to a torch.profiler
  ProfilerAction: NONE, WARMUP, RECORD, RECORD_AND_SAVE read as the four states).

Collection. A span is recorded by advisor's host collector (advisor.collect.torch_hooks):
torch.profiler with CPU activities, input shapes and Python stacks, plus the hooks that mark
the phases (Dataloader, Forward, Backward, Optimization) and host-blocking calls; the steps
are the ``ProfilerStep#N`` ranges this Profiler marks, numbered by its step counter. The
trace is read back with advisor.importers.load_kineto. On a machine where the built-in
CUPTI collector can run (an NVIDIA GPU, a CUDA torch, cupti-python) it records the span
instead, GPU included, with torch.profiler kept off.

Timing. Whatever the scheduler, every step is timed (advisor.profiler.timer):
``step_info()`` gives reader_cost, batch_cost and ips. ``timer_only=True`` does only that:
no profiler at all, a few microseconds a step at most; ``stop()`` prints the Perf summary and
``prof.session`` holds the timed steps, so ``summary()`` and ``diagnose()`` still work
(a data loader that starves the loop shows up even then).
"""

from __future__ import annotations

import enum
import gzip
import os
import shutil
import socket
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from advisor.profiler.timer import StepTimer

__all__ = [
    "Profiler",
    "ProfilerState",
    "ProfilerTarget",
    "SortedKeys",
    "export_timeline",
    "make_scheduler",
    "save_session",
]


class ProfilerState(enum.Enum):
    """What the Profiler does in a step (see the module docstring)."""

    CLOSED = 0
    READY = 1
    RECORD = 2
    RECORD_AND_RETURN = 3


class ProfilerTarget(enum.Enum):
    """What to profile: the host (CPU) and, where the CUPTI collector can run, the GPU."""

    CPU = "cpu"
    GPU = "gpu"


class SortedKeys(enum.Enum):
    """paddle.profiler's sort keys for ``summary(sorted_by=...)``, as table columns."""

    CPUTotal = "cpu_total_ns"
    CPUAvg = "cpu_avg_ns"
    CPUMax = "cpu_max_ns"
    CPUMin = "cpu_min_ns"
    GPUTotal = "gpu_total_ns"
    GPUAvg = "gpu_avg_ns"
    GPUMax = "gpu_max_ns"
    GPUMin = "gpu_min_ns"


_RECORDING = (ProfilerState.RECORD, ProfilerState.RECORD_AND_RETURN)
# torch.profiler.ProfilerAction names, read as the states they mean.
_TORCH_ACTIONS = {
    "NONE": ProfilerState.CLOSED,
    "WARMUP": ProfilerState.READY,
    "RECORD": ProfilerState.RECORD,
    "RECORD_AND_SAVE": ProfilerState.RECORD_AND_RETURN,
}
_TIME_UNITS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
# What summary() prints by default: paddle's summary tables (the Perf one last, in its layout).
SUMMARY_TABLES = ("device", "overview", "model", "distributed", "operator", "operator_kernels", "kernel",
                  "memory", "userdefined")
# The tables sorted_by orders; the others keep their own row order (a Model table sorted by
# time would lose its step-then-phases reading order).
_SORTED_TABLES = ("operator", "operator_kernels", "kernel", "memory", "userdefined", "host_sync")


# -- schedulers ----------------------------------------------------------------------------


def _count(name: str, value: Any, *, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
    return value


class _Schedule:
    """The scheduler :func:`make_scheduler` returns."""

    def __init__(self, closed: int, ready: int, record: int, repeat: int, skip_first: int):
        self.closed, self.ready, self.record = closed, ready, record
        self.repeat, self.skip_first = repeat, skip_first

    def __repr__(self) -> str:
        return (f"make_scheduler(closed={self.closed}, ready={self.ready}, record={self.record}, "
                f"repeat={self.repeat}, skip_first={self.skip_first})")

    def __call__(self, step: int) -> ProfilerState:
        if step < self.skip_first:
            return ProfilerState.CLOSED
        step -= self.skip_first
        period = self.closed + self.ready + self.record
        if self.repeat > 0 and step // period >= self.repeat:
            return ProfilerState.CLOSED
        at = step % period
        if at < self.closed:
            return ProfilerState.CLOSED
        if at < self.closed + self.ready:
            return ProfilerState.READY
        return ProfilerState.RECORD if at < period - 1 else ProfilerState.RECORD_AND_RETURN


def make_scheduler(*, closed: int, ready: int, record: int, repeat: int = 0,
                   skip_first: int = 0) -> Callable[[int], ProfilerState]:
    """A scheduler: after ``skip_first`` steps, cycles of ``closed`` CLOSED steps, ``ready``
    READY steps and ``record`` recorded steps (the last one RECORD_AND_RETURN, so each
    cycle is one span), ``repeat`` times (0: until the loop ends).

    ``make_scheduler(closed=1, ready=1, record=3, repeat=2)`` records steps 2-4 and 7-9.
    torch.profiler.schedule(wait=, warmup=, active=, repeat=, skip_first=) is the same with
    closed=wait, ready=warmup, record=active.
    """
    return _Schedule(_count("closed", closed), _count("ready", ready), _count("record", record, least=1),
                     _count("repeat", repeat), _count("skip_first", skip_first))


def _step_range(start: Any, end: Any) -> _Schedule:
    """paddle's ``(start, end)``: steps start..end-1 recorded, the step before READY."""
    _count("scheduler start", start)
    _count("scheduler end", end)
    if end <= start:
        raise ValueError(f"scheduler ({start}, {end}): the range is empty (end must be greater than start)")
    if start >= 1:
        return _Schedule(start - 1, 1, end - start, 1, 0)
    return _Schedule(0, 0, end, 1, 0)


def _always_record(step: int) -> ProfilerState:
    return ProfilerState.RECORD


def _as_state(value: Any, scheduler: Any, step: int) -> ProfilerState:
    if isinstance(value, ProfilerState):
        return value
    name = getattr(value, "name", None)
    if isinstance(value, enum.Enum) and name in _TORCH_ACTIONS:
        return _TORCH_ACTIONS[name]
    raise TypeError(f"scheduler {scheduler!r} returned {value!r} for step {step}; "
                    "a scheduler must return an advisor.ProfilerState")


def _as_scheduler(scheduler: Any) -> Callable[[int], ProfilerState]:
    if scheduler is None:
        return _always_record
    if isinstance(scheduler, (tuple, list)):
        if len(scheduler) != 2:
            raise ValueError(f"scheduler {scheduler!r}: a step range is (start, end)")
        return _step_range(*scheduler)
    if callable(scheduler):
        return scheduler
    raise TypeError(f"scheduler must be None, a (start, end) step range or a callable, not {type(scheduler).__name__}")


def _as_targets(targets: Iterable[Any] | None) -> tuple[frozenset[ProfilerTarget], bool]:
    """The targets, and whether the GPU was asked for by name (a warning if it cannot be)."""
    if targets is None:
        return frozenset(ProfilerTarget), False
    if isinstance(targets, (str, ProfilerTarget)):
        targets = [targets]
    chosen = set()
    for target in targets:
        try:
            chosen.add(target if isinstance(target, ProfilerTarget) else ProfilerTarget(str(target).lower()))
        except ValueError:
            raise ValueError(f"unknown profiler target {target!r}: use ProfilerTarget.CPU or ProfilerTarget.GPU") from None
    if not chosen:
        raise ValueError("targets is empty: give ProfilerTarget.CPU, ProfilerTarget.GPU or both")
    return frozenset(chosen), ProfilerTarget.GPU in chosen


# -- callbacks -----------------------------------------------------------------------------


def _worker(worker_name: str | None) -> str:
    return worker_name or f"{socket.gethostname()}_pid{os.getpid()}"


def _folder(dir_name: str | os.PathLike[str]) -> Path:
    folder = Path(dir_name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the folder {folder}: {exc.strerror or exc}") from None
    return folder


def export_timeline(dir_name: str | os.PathLike[str], worker_name: str | None = None) -> Callable[[Profiler], None]:
    """An ``on_trace_ready`` callback that writes each span's timeline (a Chrome trace,
    for chrome://tracing or Perfetto, findings marked: Profiler.export) to
    ``dir_name/<worker>_span<N>.pt.trace.json``; ``<worker>`` is ``worker_name`` or
    ``<host>_pid<pid>``. paddle's export_chrome_tracing."""
    folder = _folder(dir_name)

    def handle(prof: Profiler) -> None:
        prof.export(folder / f"{_worker(worker_name)}_span{prof.span}.pt.trace.json")

    return handle


def save_session(dir_name: str | os.PathLike[str], worker_name: str | None = None) -> Callable[[Profiler], None]:
    """An ``on_trace_ready`` callback that saves each span's Session to
    ``dir_name/<worker>_<N>``, a folder that ``advisor diagnose`` and ``advisor summary``
    read again."""
    folder = _folder(dir_name)

    def handle(prof: Profiler) -> None:
        if prof.session is not None:
            prof.session.save(folder / f"{_worker(worker_name)}_{prof.span}")

    return handle


# -- one span's collection ---------------------------------------------------------------------


class _Span:
    """The collectors of one span: advisor's host collector with the steps driven by the
    Profiler, and the CUPTI collector where it can run."""

    def __init__(self, torch: Any, *, gpu_reason: str | None, record_shapes: bool, with_stack: bool):
        """``gpu_reason``: why the GPU is not profiled; None where the CUPTI collector can run."""
        self.torch = torch
        self.gpu = gpu_reason is None
        self.gpu_reason = gpu_reason
        self.options = {"record_shapes": record_shapes, "with_stack": with_stack}
        self.collector: Any = None
        self.gpu_collector: Any = None
        self.recording = False
        self.steps: list[int] = []

    def prepare(self) -> None:
        """READY: warm torch.profiler up, recording nothing. (The CUPTI collector starts
        with the span's first recorded step instead.)"""
        if self.gpu or self.collector is not None:
            return
        from advisor.collect.torch_hooks import HostCollector  # noqa: PLC0415

        self.collector = HostCollector(self.torch, step_source="manual", warmup=True, **self.options)
        self.collector.start()

    def record(self) -> None:
        if self.collector is not None:
            self.collector.record()
            self.recording = True
            return
        from advisor.collect import cupti  # noqa: PLC0415
        from advisor.collect.torch_hooks import HostCollector  # noqa: PLC0415

        if self.gpu:
            # The span is the window: everything from here to the span's end is recorded.
            self.gpu_collector, why = cupti.start_collector(self.torch, window=None)
            if self.gpu_collector is None:
                self.gpu_reason = why
        collector = HostCollector(self.torch, profiler=self.gpu_collector is None, listener=self.gpu_collector,
                                  step_source="manual", **self.options)
        try:
            collector.start()
        except BaseException:
            if self.gpu_collector is not None:
                self.gpu_collector.stop()
            raise
        self.collector = collector
        self.recording = True

    def begin_step(self, number: int) -> None:
        if self.recording:
            self.collector.begin_step(number)
            self.steps.append(number)

    def end_step(self, *, partial: bool | None) -> None:
        if self.recording:
            self.collector.end_step(partial=partial)

    def discard(self) -> None:
        """READY steps that no recorded step followed: stop, keep nothing."""
        if self.collector is not None:
            self.collector.stop()
        if self.gpu_collector is not None:
            self.gpu_collector.stop()

    def finish(self, *, index: int, batch_size: int | None) -> tuple[Any, Path | None, Path | None]:
        """The span as a Session, with the Chrome trace it was read from and the temporary
        folder that holds it (the caller's to remove) where torch.profiler recorded it."""
        from advisor.collect.assemble import gpu_not_measured, host_device  # noqa: PLC0415
        from advisor.session import CollectorInfo, Session, SessionMeta  # noqa: PLC0415

        collection = self.collector.stop()
        notes = list(collection.notes)
        facts = collection.metadata()
        trace_path = folder = None
        if self.gpu_collector is not None:
            capture = self.gpu_collector.stop(partial_steps=collection.partial_steps)
            events = capture.events
            collector = capture.collector.model_copy(update={"notes": [*capture.collector.notes, *notes]})
            devices = [host_device(), *capture.devices]
            base_time_ns = capture.base_time_ns
            trace_metadata: dict[str, Any] = {}
        else:
            from advisor.importers import load_kineto  # noqa: PLC0415

            folder = Path(tempfile.mkdtemp(prefix="advisor-span-"))
            try:
                trace_path = self.collector.export(folder / "trace.json")
                read = load_kineto(trace_path)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            events = read.events
            trace_metadata = dict(read.meta.trace_metadata)
            trace_metadata.pop("traceName", None)  # a temporary file
            facts = trace_metadata.get("advisor") or facts
            collector = CollectorInfo(
                name="host",
                version=f"torch {getattr(self.torch, '__version__', '')}",
                activities=["cpu"],
                gpu_measured=False,
                notes=[*notes, gpu_not_measured(self.gpu_reason)],
            )
            devices = [host_device(collector.notes)]
            base_time_ns = read.meta.base_time_ns
        size = batch_size if batch_size is not None else collection.batch_size
        if size is not None:
            trace_metadata["batch_size"] = size
        trace_metadata.update({"advisor": facts, "step_source": "manual", "span": index})
        program = sys.argv[0] if sys.argv and sys.argv[0] else "python"
        meta = SessionMeta(
            source=f"{program} (advisor.Profiler, span {index})",
            source_format="profiler",
            command=list(sys.argv) or None,
            collector=collector,
            devices=devices,
            base_time_ns=base_time_ns,
            trace_metadata=trace_metadata,
        )
        return Session(meta, events), trace_path, folder


# -- the profiler --------------------------------------------------------------------------


class Profiler:
    """Profile a loop from inside the code (see the module docstring).

    Usable as a context manager (``with Profiler(...) as prof``) or with ``start()``,
    ``step()`` and ``stop()``. After a span ends, ``prof.session`` is its Session,
    ``prof.span`` its number (0, 1, ...) and ``prof.recorded_steps`` its step numbers.
    """

    def __init__(self, *, targets: Iterable[Any] | None = None, scheduler: Any = None,
                 on_trace_ready: Callable[[Profiler], Any] | None = None, timer_only: bool = False,
                 record_shapes: bool = True, with_stack: bool = True):
        """``targets``: ProfilerTarget.CPU and/or .GPU (default: both where the GPU can be
        profiled). ``scheduler``: None, ``(start, end)`` or a callable (module docstring).
        ``on_trace_ready``: called with this Profiler once per recorded span (nothing is
        written unless it writes: see export_timeline and save_session). ``timer_only``:
        time the steps only. ``record_shapes`` / ``with_stack``: what torch.profiler records
        of each op (input shapes for the tensor-core and roofline rules, stacks for source
        lines)."""
        self.targets, self._gpu_asked = _as_targets(targets)
        self.scheduler = _as_scheduler(scheduler)
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"on_trace_ready must be callable, not {type(on_trace_ready).__name__}")
        self.on_trace_ready = on_trace_ready
        self.timer_only = bool(timer_only)
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.step_num = 0
        self.current_state = ProfilerState.CLOSED
        self.session: Any = None
        """The Session of the last span that ended (timer_only: of the timed steps)."""
        self.span = -1
        """Number of the last span that ended, from 0; -1 before the first."""
        self.trace_path: Path | None = None
        """The last span's Chrome trace while this Profiler holds it (None on the GPU path)."""
        self.notes: list[str] = []
        self._timer: StepTimer | None = None
        self._span: _Span | None = None
        self._running = False
        self._trace_cleanup: Any = None  # removes the last span's trace folder
        self._tables: tuple[Any, dict] | None = None
        self._diagnosed: tuple[Any, Any] | None = None
        self._torch: Any = None
        self._collect: bool | None = None  # whether spans can be collected (decided once)
        self._gpu_reason: str | None = "the GPU target was not asked for"

    def __repr__(self) -> str:
        mode = "timer_only" if self.timer_only else f"scheduler={self.scheduler!r}"
        return f"Profiler({mode}, step={self.step_num}, state={self.current_state.name})"

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # A loop that raised still hands over what it recorded; its unfinished step is partial.
        self._stop(failed=exc_type is not None)

    def start(self) -> None:
        """Begin step 0 (and whatever the scheduler says step 0 is)."""
        if self._running:
            raise RuntimeError("this Profiler is already started")
        timer = StepTimer()
        timer.start(0)  # first, so its DataLoader hook sits under the collectors'
        self._timer = timer
        self._running = True
        self.step_num = 0
        if self.timer_only:
            self.current_state = ProfilerState.CLOSED
        else:
            try:
                self.current_state = self._state_of(0)
                self._transition(ProfilerState.CLOSED, self.current_state)
                self._begin_step()
            except BaseException:
                self._running = False
                timer.stop(keep_open_step=False)
                raise
        timer.begin_step(0)  # the clock starts after the collector did

    def step(self, num_samples: int | None = None) -> None:
        """End the open step and begin the next. ``num_samples``: the samples the ended
        step processed (its batch size), for ips in samples/s."""
        if not self._running:
            raise RuntimeError("Profiler.step() called while the Profiler is not started")
        if num_samples is not None:
            _count("num_samples", num_samples)
        timer = self._timer
        timer.end_step(num_samples)
        self.step_num += 1
        if not self.timer_only:
            self._end_step(partial=False)
            previous = self.current_state
            self.current_state = self._state_of(self.step_num)
            self._transition(previous, self.current_state)
            self._begin_step()
        timer.begin_step(self.step_num)

    def stop(self) -> None:
        """End the open step and the Profiler: a span still recording is handed over;
        with timer_only the Perf summary is printed. A second call does nothing."""
        self._stop(failed=False)

    def _stop(self, *, failed: bool) -> None:
        if not self._running:
            return
        self._running = False
        timer = self._timer
        keep = timer.read_in_open_step and not failed
        try:
            if not self.timer_only:
                span = self._span
                if span is not None:
                    # The step open now: partial where it failed or did no work (see
                    # HostCollector.end_step).
                    span.end_step(partial=True if failed else None)
                if self.current_state in _RECORDING:
                    self._finish_span()
                elif span is not None:
                    self._span = None
                    span.discard()
        finally:
            timer.stop(keep_open_step=keep)
            self.current_state = ProfilerState.CLOSED
        if self.timer_only:
            self.session = timer.session()
            self._tables = None
            self._diagnosed = None
            self._print_perf(self._tables_for(["perf", "model"]), time_unit="s",
                             title="Perf Summary (timer_only)")

    # -- states --------------------------------------------------------------------------

    def _state_of(self, step: int) -> ProfilerState:
        return _as_state(self.scheduler(step), self.scheduler, step)

    def _transition(self, previous: ProfilerState, current: ProfilerState) -> None:
        if previous is ProfilerState.RECORD_AND_RETURN or (previous in _RECORDING and current not in _RECORDING):
            self._finish_span()
            previous = ProfilerState.CLOSED
        if current in _RECORDING and previous not in _RECORDING:
            self._open_span(record=True)
        elif current is ProfilerState.READY and previous is ProfilerState.CLOSED:
            self._open_span(record=False)
        elif current is ProfilerState.CLOSED and previous is ProfilerState.READY:
            span, self._span = self._span, None
            if span is not None:
                span.discard()

    def _can_collect(self) -> bool:
        """Whether spans can be recorded here, decided at the first span: a torch to
        profile with, and no other advisor collector running (under ``advisor diagnose``
        the script is profiled already, and torch runs one profiler at a time)."""
        if self._collect is not None:
            return self._collect
        from advisor.collect import cupti, torch_hooks  # noqa: PLC0415
        from advisor.collect.hooks import base as hooks_base  # noqa: PLC0415

        torch, why = torch_hooks.import_torch()
        if torch is None:
            self._refuse(f"torch is not importable ({why}): nothing is recorded, steps are only timed")
            return False
        if hooks_base.ACTIVE is not None:
            self._refuse("advisor already profiles this process (advisor diagnose?): this Profiler "
                         "records nothing itself and only times the steps")
            return False
        self._torch = torch
        if ProfilerTarget.GPU in self.targets:
            self._gpu_reason = cupti.unavailable_reason(torch)
            if self._gpu_reason is not None and self._gpu_asked:
                self._warn(f"the GPU is not profiled ({self._gpu_reason}); the host side is")
        self._collect = True
        return True

    def _refuse(self, why: str) -> None:
        self._collect = False
        self._warn(why)

    def _warn(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(f"advisor.Profiler: {message}", RuntimeWarning, stacklevel=_user_stacklevel())

    def _open_span(self, *, record: bool) -> None:
        if not self._can_collect():
            return
        if self._span is None:
            self._span = _Span(self._torch, gpu_reason=self._gpu_reason, record_shapes=self.record_shapes,
                               with_stack=self.with_stack)
        try:
            if record:
                self._span.record()
            else:
                self._span.prepare()
        except Exception as exc:  # profiling must not take the user's training down
            span, self._span = self._span, None
            self._warn(f"the collector could not start at step {self.step_num} ({_one_line(exc)}): "
                       "this span is not recorded")
            try:
                span.discard()
            except Exception:
                pass

    def _begin_step(self) -> None:
        if self._span is not None and self.current_state in _RECORDING:
            self._span.begin_step(self.step_num)

    def _end_step(self, *, partial: bool | None) -> None:
        if self._span is not None:
            self._span.end_step(partial=partial)

    def _finish_span(self) -> None:
        span, self._span = self._span, None
        if span is None or not span.recording:
            if span is not None:
                span.discard()
            return
        index = self.span + 1
        try:
            session, trace_path, folder = span.finish(index=index, batch_size=self._batch_size_of(span.steps))
        except Exception as exc:  # profiling must not take the user's training down
            self._warn(f"the span of steps {span.steps[:1]}...{span.steps[-1:]} could not be read back "
                       f"({_one_line(exc)}): it is lost")
            return
        self.span = index
        self.session = session
        self._tables = None
        self._diagnosed = None
        if self._trace_cleanup is not None:
            self._trace_cleanup()
        self._trace_cleanup = weakref.finalize(self, shutil.rmtree, folder, True) if folder is not None else None
        self.trace_path = trace_path
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _batch_size_of(self, steps: list[int]) -> int | None:
        """The ``num_samples`` these steps were given, where they all gave the same."""
        wanted = set(steps)
        timer = self._timer
        given = {s for n, s in zip(timer.numbers, timer.samples, strict=True) if n in wanted}
        return int(min(given)) if len(given) == 1 and min(given) > 0 else None

    # -- results -------------------------------------------------------------------------

    @property
    def recorded_steps(self) -> list[int]:
        """The step numbers of the last span's Session (timer_only: the timed steps)."""
        if self.session is None:
            return []
        return [int(n) for n in self.session.steps()["step"]]

    def step_info(self, unit: str | None = None) -> str:
        """``reader_cost: 0.00101 s batch_cost: 0.03121 s ips: 256.310 samples/s``: the
        means over the steps ended since the previous call (the first time: since
        ``start()``). ``unit`` names what ``num_samples`` counts ("images", "tokens"...);
        without ``num_samples`` ips is in steps/s. reader_cost is the time in DataLoader
        ``__next__``, left out where no DataLoader was read."""
        if self._timer is None:
            return "no step has ended yet"
        return self._timer.step_info(unit)

    def export(self, path: str | os.PathLike[str], *, findings: bool = True) -> Path:
        """Write the last span's timeline, a Chrome trace (gzipped where ``path`` ends in
        .gz) for chrome://tracing or Perfetto, with the findings of ``diagnose()`` marked on
        it (``findings=False``: without). It is advisor's timeline of the Session
        (advisor.reports.perfetto), which reads back into advisor like the trace it came from;
        where that module is missing, torch.profiler's own trace is copied instead."""
        session = self._require_session()
        target = Path(path)
        try:
            from advisor.reports.perfetto import write_timeline  # noqa: PLC0415
        except ImportError:
            write_timeline = None
        if write_timeline is not None:
            return write_timeline(session, self.diagnose() if findings else [], target)
        if self.trace_path is None or not Path(self.trace_path).is_file():
            raise RuntimeError("this span has no Chrome trace (it was timed only, or recorded by the CUPTI "
                               "collector): keep it with save_session() instead")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix == ".gz":
            with open(self.trace_path, "rb") as source, gzip.open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
        else:
            shutil.copyfile(self.trace_path, target)
        return target

    def _require_session(self) -> Any:
        if self.session is None:
            raise RuntimeError("no span has been recorded yet: call summary() / diagnose() after a span "
                               "ends (in on_trace_ready, or after stop())")
        return self.session

    def _tables_for(self, names: list[str] | None = None) -> dict:
        from advisor.tables import compute_tables  # noqa: PLC0415

        session = self._require_session()
        if self._tables is None or self._tables[0] is not session:
            self._tables = (session, {})
        cache = self._tables[1]
        missing = [n for n in (names or _all_tables()) if n not in cache]
        if missing:
            cache.update(compute_tables(session, missing))
        return {n: cache[n] for n in (names or _all_tables())}

    def _diagnosis(self) -> Any:
        """The last span's diagnosis (advisor.diagnosis: what `advisor diagnose` makes of
        it), worked out once per span."""
        from advisor.diagnosis import diagnose  # noqa: PLC0415

        session = self._require_session()
        if self._diagnosed is None or self._diagnosed[0] is not session:
            diagnosis = diagnose(session, tables=lambda steady, names: self._tables_for())
            for error in diagnosis.result.errors:
                self._warn(error)
            self._diagnosed = (session, diagnosis)
        return self._diagnosed[1]

    def diagnose(self) -> list[Any]:
        """Run the built-in rules over the last span's step model and tables: the findings,
        ranked by estimated saving, symptoms nested under their causes (Finding.explains)."""
        return self._diagnosis().findings

    def report(self, fmt: str = "terminal", path: str | os.PathLike[str] | None = None) -> None:
        """Render the full report of the last span (as ``advisor diagnose`` does): to the
        terminal, or as ``fmt`` ("terminal", "json", "markdown") to ``path``."""
        from advisor.reports import render  # noqa: PLC0415

        render(self._diagnosis().report, fmt, path)

    def summary(self, sorted_by: SortedKeys | str = SortedKeys.CPUTotal, op_detail: bool = True,
                thread_sep: bool = False, time_unit: str = "ms", *, limit: int = 20,
                tables: Iterable[str] | None = None) -> None:
        """Print the summary tables of the last span (paddle's Profiler.summary), then the
        Perf summary.

        ``sorted_by``: a SortedKeys member, its name ("GPUTotal") or a column ("calls",
        "cpu_total_ns"), largest first, in the operator, kernel, memory and userdefined
        tables. ``op_detail``: also the operator -> kernel table. ``thread_sep``: not
        supported; the operator table merges the threads (said in one line). ``time_unit``:
        "s", "ms", "us" or "ns" for the time columns. ``limit``: rows per table (0: all).
        ``tables``: which tables (default SUMMARY_TABLES; any of advisor.tables.table_names()).
        """
        from rich.console import Console  # noqa: PLC0415

        from advisor.reports.summary import render_tables  # noqa: PLC0415

        if time_unit not in _TIME_UNITS:
            raise ValueError(f"time_unit {time_unit!r}: use one of {', '.join(_TIME_UNITS)}")
        column = _sort_column(sorted_by)
        names = [n for n in (SUMMARY_TABLES if tables is None else tables) if op_detail or n != "operator_kernels"]
        unknown = [n for n in names if n not in _all_tables()]
        if unknown:
            raise ValueError(f"unknown table {unknown[0]!r}; the tables are: {', '.join(_all_tables())}")
        tables = self._tables_for(list(dict.fromkeys([*names, "perf", "model"])))
        sortable = [frame for name, frame in tables.items() if name in _SORTED_TABLES]
        if sortable and not any(column in frame.columns for frame in sortable):
            columns = sorted({c for frame in sortable for c in frame.columns})
            raise ValueError(f"sorted_by {column!r}: no table it sorts has that column; columns: {', '.join(columns)}")
        shown = {}
        for name in names:
            frame = tables[name]
            if name == "perf":
                continue
            if name in _SORTED_TABLES and column in frame.columns:
                frame = frame.sort_values(column, ascending=False, kind="stable", na_position="last")
            shown[name] = _in_unit(frame, time_unit)
        console = Console()
        if thread_sep:
            console.print("thread_sep: not supported; the operator table merges all threads.")
        render_tables(shown, limit=limit, console=console)
        self._print_perf(tables, time_unit=time_unit, title="Perf Summary")

    def _print_perf(self, tables: dict, *, time_unit: str, title: str) -> None:
        print("\n".join(_perf_lines(tables.get("perf"), tables.get("model"), time_unit, title)))


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _user_stacklevel() -> int:
    """The stacklevel that makes a warning name the user's line, not advisor's."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _all_tables() -> list[str]:
    from advisor.tables import table_names  # noqa: PLC0415

    return table_names()


def _sort_column(sorted_by: SortedKeys | str) -> str:
    if isinstance(sorted_by, SortedKeys):
        return sorted_by.value
    if isinstance(sorted_by, str):
        return SortedKeys[sorted_by].value if sorted_by in SortedKeys.__members__ else sorted_by
    raise TypeError(f"sorted_by must be a SortedKeys member or a column name, not {type(sorted_by).__name__}")


def _in_unit(frame: Any, time_unit: str) -> Any:
    """The frame with its ``*_ns`` columns in ``time_unit``, named ``<name>_(<unit>)``, for
    display: the numbers are then shown as they are, not re-scaled cell by cell, and the
    name keeps its words (``total``, ``avg``) for the renderer's choice of columns."""
    factor = _TIME_UNITS[time_unit]
    renamed = {c: f"{c[:-3]}_({time_unit})" for c in frame.columns if str(c).endswith("_ns")}
    if not renamed:
        return frame
    out = frame.copy()
    for column in renamed:
        out[column] = out[column].astype("float64") / factor
    out = out.rename(columns=renamed)
    out.attrs = dict(frame.attrs)
    return out


def _perf_lines(perf: Any, model: Any, time_unit: str, title: str) -> list[str]:
    """The Perf table in paddle's layout: reader_cost and batch_cost in ``time_unit``,
    ips in its own unit, and the reader's share of step time (the Model table's
    Dataloader ratio)."""
    rule = "-" * 72
    lines = [rule, title, rule]
    if perf is None or not len(perf):
        lines += ["no steps: nothing to summarise", rule]
        return lines
    factor = _TIME_UNITS[time_unit]
    ratio = None
    reader_measured = "reader_cost" in perf.index and perf.loc["reader_cost", "avg"] == perf.loc["reader_cost", "avg"]
    if model is not None and "Dataloader" in model.index and reader_measured:
        ratio = model.loc["Dataloader", "cpu_ratio"]
    ips_unit = perf.loc["ips", "unit"] if "ips" in perf.index else "steps/s"
    reader = f"Reader ratio: {ratio * 100:.3f}%" if ratio is not None and ratio == ratio else "Reader ratio: -"
    lines.append(f"{reader}   Time unit: {time_unit}   IPS unit: {ips_unit}")
    columns = [c for c in ("avg", "max", "min", "p50") if c in perf.columns]
    lines.append(f"{'':<14}" + "".join(f"{c:>14}" for c in columns))
    for key in ("reader_cost", "batch_cost", "ips"):
        if key not in perf.index:
            continue
        row = perf.loc[key]
        cells = []
        for column in columns:
            value = row[column]
            if value != value:  # NaN: not measured
                cells.append(f"{'-':>14}")
            elif key == "ips":
                cells.append(f"{value:>14.3f}")
            else:
                cells.append(f"{value / factor:>14.5f}")
        lines.append(f"{key:<14}" + "".join(cells))
    lines.append(rule)
    return lines
