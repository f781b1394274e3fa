"""Host-side collection for a PyTorch script: torch.profiler on CPU plus step and phase marks.

While a script runs, :class:`HostCollector` keeps a ``torch.profiler.profile`` running with
CPU activities only (the host side never subscribes to CUPTI: the GPU collector owns it)
and installs hooks that mark, without any change to the script:

- steps, as ``ProfilerStep#N`` ranges (the name torch itself gives them), and
- phases, as ``advisor::Dataloader``, ``advisor::Forward``, ``advisor::Backward`` and
  ``advisor::Optimization`` ranges inside the steps.

Both are ``record_function`` ranges, so they land in the exported Chrome trace as
``user_annotation`` events. Everything is removed again when the run ends.

Where a step starts (``step_source``), in order of preference:

``dataloader``
    Each time a DataLoader iterator's ``__next__`` is entered: a step is one batch, read
    and used, which is the Paddle profiler's batch_cost and makes the reader's share of the
    step directly visible. The step ends where the same iterator's next read starts, or
    where it runs out (the ``__next__`` that raises StopIteration is not a step). Reads
    from another loader while a step is open (an evaluation every N steps, a second loader
    zipped with the first) are Dataloader time inside that step, not steps; outside a
    step any loader's batches are steps, an evaluation loop after training included.
``optimizer``
    A script without a DataLoader that trains: a step ends once its optimizer step has
    run, at the next training event (forward, backward, zero_grad) or the end of the run.
    One optimizer step is one training step however many modules (model, loss) are called
    per iteration, and gradient accumulation counts its micro-batches as one step. The
    boundary is not put inside the optimizer's post-step hook itself because torch runs
    that hook inside its own ``Optimizer.step#...`` range, which the step would then cut.
``forward``
    A script without a DataLoader or an optimizer (inference): a step starts at each call
    of the first module that was called at top level (the model), so a loss or
    post-processing module called beside it does not split steps.

``manual``
    Steps are begun and ended by the caller (:meth:`HostCollector.begin_step`,
    :meth:`HostCollector.end_step`): advisor.Profiler's ``step()`` in the user's code. The
    hooks then mark phases only; a data-loader read is the Dataloader phase of whatever
    step is open.

The source is settled by what the script does first: the first top-level forward makes it
``forward`` until an optimizer step turns it into ``optimizer``; a DataLoader takes over
from either. Steps counted under a source that was later replaced are marked partial.
(``manual`` is chosen by the caller and never replaced.)

Phases never nest: a phase opens only when none is open, so forward and backward run
inside ``LBFGS.step(closure)`` count as Optimization and a recomputed forward inside
backward counts as Backward. The Forward phase is the outermost module call only.

A step is *partial* when its end is not a true step end: the run stopped (exception,
exit) while it was open, the loop that owned it was left by ``break``, or it was counted
under a step source that was later replaced. The trace's ``advisor`` metadata lists them
so readers can leave them out of per-step statistics.

Host-blocking calls the script makes itself (``loss.item()``, ``.cpu()``, ``.tolist()``,
``float(t)``, ``if t:``, ``f"{t:.3f}"``, ``torch.cuda.synchronize()``...) are counted per
source line while something records (the steps of the window), with the time spent in them, and written to the trace's ``advisor`` metadata
as ``host_syncs``: the Chrome trace itself cannot give the line, since its
``python_function`` events name a function by the line it is defined on. Calls made
inside torch (an optimizer reading its step count) are not counted: the line to point at
is the user's. On a CPU-only run these calls do not wait for a device; ``device`` says
where the tensor was.

Only the thread and process that run the script are marked: DataLoader workers (forked
copies of this process) and helper threads are left alone. The hooks are invisible to
torch.compile and torch.jit.trace (so a ``fullgraph=True`` compile still compiles), and
a warning raised through one of advisor's wrappers is shown at the user's line.

Why not ``prof.step()``: in torch 2.x a profiler made without a ``schedule`` does not
record steps at all (``record_steps`` is False), and one made with a schedule opens
``ProfilerStep#0`` in ``start()``, so step 0 would hold the imports and model set-up, and
it cannot end a step without starting another one. The collector therefore records the
``ProfilerStep#N`` ranges itself.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib
import linecache
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from advisor.collect.cores import RunDelay
from advisor.collect.steps import StepClock, StepWindow
from advisor.importers.advisor_metadata import METADATA_KEY, trace_metadata_json

DATALOADER = "advisor::Dataloader"
FORWARD = "advisor::Forward"
BACKWARD = "advisor::Backward"
OPTIMIZATION = "advisor::Optimization"
PHASE_NAMES = (DATALOADER, FORWARD, BACKWARD, OPTIMIZATION)
PHASE_LABELS = {DATALOADER: "Dataloader", FORWARD: "Forward", BACKWARD: "Backward", OPTIMIZATION: "Optimization"}
# An inference loop whose model has been called this many times as a step has shown its
# model: from then on only the calls of the modules that opened a forward are hooked
# (HostCollector._hook_top_only), as long as there are no more than TOP_MODULES of them.
ROOT_ONLY_AFTER = 3
TOP_MODULES = 8
# A whole-run recording (--steps all) is written in parts of this many steps, so the event
# budget can be checked at each part's end and no part holds more than this many steps.
PART_STEPS = 20
STEP_PREFIX = "ProfilerStep#"
# Kineto writes these lines straight to file descriptor 2 on every profiler start and stop,
# whatever KINETO_LOG_LEVEL says; they are noise in the user's terminal.
_KINETO_NOISE = ("USDT:", "STAGE:")

_ACTIVE: "HostCollector | None" = None


def _never() -> bool:
    return False


# Set at install to a test that torch.compile (dynamo) folds to True while it traces:
# it must be the first thing a hook checks, before any global it would guard on.
_IN_TRACED_CODE: Any = _never


def import_torch() -> tuple[Any, str | None]:
    """torch, or None and one line saying why it cannot be imported."""
    try:
        import torch  # noqa: PLC0415  (optional dependency)
        import torch.profiler  # noqa: F401, PLC0415
    except Exception as exc:  # a broken install raises OSError and friends, not only ImportError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        return None, reason
    return torch, None


def library_roots(torch: Any = None) -> list[str]:
    """Folders that hold installed code rather than the user's: the standard library,
    site-packages (user site included), the console scripts, torch's and advisor's own
    folders. A stack frame from a file under none of them is the user's."""
    import site  # noqa: PLC0415
    import sysconfig  # noqa: PLC0415

    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        roots.add(os.path.realpath(user_site))
    advisor_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots.add(advisor_dir)
    if torch is not None:
        roots.add(os.path.dirname(os.path.abspath(torch.__file__)))
    return sorted(root.rstrip(os.sep) + os.sep for root in roots)


def loader_facts(torch: Any, iterator: Any) -> dict[str, Any]:
    """What a DataLoader iterator says of its loader: the dataset, how batches are made
    and by how many workers; with zeroed counters for its reads and fetches."""
    dataset = getattr(iterator, "_dataset", None)
    kind = type(dataset)
    sampler = getattr(iterator, "_index_sampler", None)
    collate = getattr(iterator, "_collate_fn", None)
    data = importlib.import_module("torch.utils.data")
    auto = bool(getattr(iterator, "_auto_collation", False))
    return {
        "dataset": f"{kind.__module__}.{kind.__qualname__}",
        "dataset_name": kind.__name__,
        "in_memory_tensors": isinstance(dataset, data.TensorDataset),
        "batched_fetch": hasattr(dataset, "__getitems__"),
        "iterable": isinstance(dataset, data.IterableDataset),
        "length": _length(dataset),
        "num_workers": int(getattr(iterator, "_num_workers", 0) or 0),
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
        "prefetch_factor": getattr(iterator, "_prefetch_factor", None),
        "batch_size": getattr(sampler, "batch_size", None) if auto else None,
        "auto_collation": auto,
        "collate_fn": getattr(collate, "__qualname__", None) or type(collate).__name__,
        "reads": 0, "read_ns": 0, "fetches": 0, "fetch_ns": 0, "fetch_cpu_ns": 0, "collate_ns": 0, "items": 0,
    }


def _length(dataset: Any) -> int | None:
    try:
        return int(len(dataset))
    except Exception:  # an iterable dataset, or a len() that raises
        return None


def first_batch_size(batch: Any, _depth: int = 0) -> int | None:
    """The first dimension of the first tensor found in ``batch`` (depth first through
    tensors, mappings, lists and tuples), or None."""
    import torch  # noqa: PLC0415

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() >= 1 else None
    if _depth > 8:
        return None
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        size = first_batch_size(item, _depth + 1)
        if size is not None:
            return size
    return None


# Tensor methods that read a tensor's data on the host, so on a GPU they wait for every
# kernel queued before them: name -> what the call does, in the user's words.
HOST_SYNC_METHODS = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "copy to host",
    "to": "copy to host",  # counted only from a device to the CPU
    "__bool__": "bool",
    "__int__": "int",
    "__float__": "float",
    "__format__": "format",
    "__repr__": "print",
}
MAX_HOST_SYNC_SITES = 200
SYNC_RANGE_PREFIX = "advisor::sync "


@dataclass
class HostSyncSite:
    """Host-blocking calls made from one source line."""

    call: str
    file: str
    line: int
    function: str
    code: str = ""
    calls: int = 0
    total_ns: int = 0
    steps: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "call": self.call,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code,
            "calls": self.calls,
            "total_ns": self.total_ns,
            "steps": len(self.steps),
            "devices": sorted(self.devices),
        }


@dataclass
class HostCollection:
    """What the hooks found about the run, beside the trace itself."""

    step_source: str | None = None
    steps: int = 0
    partial_steps: list[int] = field(default_factory=list)
    batch_size: int | None = None
    batch_size_source: str | None = None
    host_syncs: list[dict[str, Any]] = field(default_factory=list)
    """HostSyncSite.as_dict() rows, most time first."""
    notes: list[str] = field(default_factory=list)
    step_times: list[dict[str, Any]] = field(default_factory=list)
    """Every step the clock timed (StepClock.as_records()), recorded by the profiler or not."""
    recording: dict[str, Any] = field(default_factory=dict)
    """What the profiler recorded: the window asked for, the steps recorded, where and why
    recording stopped early, the trace parts written."""
    loaders: list[dict[str, Any]] = field(default_factory=list)
    """One entry per DataLoader the script read: its dataset and settings, and the time
    its reads, fetches and collation took in this process."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """Processes the script started that are not DataLoader workers (torch.multiprocessing
    spawn, multiprocessing.Process): advisor's collector does not run in them."""
    library_roots: list[str] = field(default_factory=list)
    """Folders of installed code (the standard library, site-packages, torch, advisor): a
    stack frame outside them is the user's."""
    cpu_wait: dict[str, Any] = field(default_factory=dict)
    """The script's main thread from the collector's start: ``wall_ns`` and ``run_delay_ns``
    (the time it was ready to run but waited for a core; empty where not measured)."""

    def metadata(self) -> dict[str, Any]:
        """The ``advisor`` object written into the trace's top level."""
        return {
            "collector": "advisor-host",
            "step_source": self.step_source,
            "steps": self.steps,
            "partial_steps": list(self.partial_steps),
            "batch_size": self.batch_size,
            "batch_size_source": self.batch_size_source,
            "phases": list(PHASE_NAMES),
            "host_syncs": list(self.host_syncs),
            "step_times": list(self.step_times),
            "recording": dict(self.recording),
            "loaders": list(self.loaders),
            "children": list(self.children),
            "library_roots": list(self.library_roots),
            "cpu_wait": dict(self.cpu_wait),
        }


class _Range:
    """One open record_function range and the frame whose lifetime it belongs to."""

    __slots__ = ("name", "handle", "frame", "step", "token")

    def __init__(self, name: str, handle: Any, frame: Any, step: int = -1, token: Any = None):
        self.name = name
        self.handle = handle
        self.frame = frame
        self.step = step
        self.token = token  # the GPU collector's id for the range, where one listens


class _ReportedRange:
    """A record_function range that the listening GPU collector also hears of."""

    __slots__ = ("_collector", "_name", "_handle", "_token")

    def __init__(self, collector: "HostCollector", name: str):
        self._collector = collector
        self._name = name

    def __enter__(self) -> "_ReportedRange":
        self._handle = self._collector._enter(self._name)
        self._token = self._collector._opened(self._name)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.__exit__(*exc)
        self._collector._closed(self._token)


_NO_RANGE = contextlib.nullcontext()
_FORKED = False


def _in_forked_child() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


def _on_stack(target: Any) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class HostCollector:
    """torch.profiler (CPU activities) plus the step and phase hooks, for one run.

    ``start()`` before the script, ``stop()`` after it (whatever way it ended), then
    ``export(path)``. Only one collector can be active in a process at a time.
    """

    def __init__(self, torch: Any, *, record_shapes: bool = True, with_stack: bool = True,
                 profiler: bool = True, listener: Any = None, step_source: str = "auto",
                 warmup: bool = False, window: StepWindow | None = None, event_budget: int | None = None,
                 parts_dir: Path | None = None, say: Any = None, ranks: tuple[Path, dict] | None = None):
        """``profiler=False``: run the hooks and ranges without torch.profiler, for when the
        CUPTI collector runs (Kineto would take CUPTI over even with CPU activities only).
        ``listener`` (the CUPTI collector) is told of every step and range as it opens and
        closes, so the GPU side records them on its own timeline.
        ``step_source="manual"``: the caller marks steps (begin_step / end_step); the hooks
        mark phases only. ``warmup``: start() only prepares torch.profiler (Kineto's warm-up,
        nothing recorded) and :meth:`record` starts recording.

        ``window``: record only these steps: torch.profiler is prepared at start, records
        from the window's first step and stops at its end; the steps after are timed only.
        Without one the whole run is recorded, in parts of ``PART_STEPS`` steps written to
        ``parts_dir`` where one is given, until ``event_budget`` events are written.
        ``say(line)`` hears of recording starting and stopping, for the user.
        ``ranks`` (a folder, the collection options): the processes the script starts with
        torch.multiprocessing.spawn run their function under a collector of their own and
        save their sessions there (advisor.collect.spawned)."""
        self._torch = torch
        self._ranks = ranks
        self._record_shapes = record_shapes
        self._with_stack = with_stack
        self._use_profiler = profiler
        self._listener = listener
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        self._prof: Any = None
        self._undo: list[Any] = []
        self._pid = os.getpid()
        self._thread = threading.get_ident()
        self.result = HostCollection()
        self._step: _Range | None = None
        self._phase: _Range | None = None
        self._next_step = 0
        self._step_done = False  # optimizer source: the open step has had its optimizer step
        self._step_owner: Any = None  # dataloader source: weakref to the iterator whose step is open
        self._forward_steps: list[int] = []  # steps counted while the source was "forward"
        self._root_module: Any = None
        self._root_optimizer: Any = None
        self._module_hooks: list[Any] = []
        self._top_modules: list[Any] = []  # weak references: modules that opened a forward
        self._root_only = False  # only those modules' calls are hooked (an inference loop)
        self._stopped = False
        self._manual = step_source == "manual"
        if self._manual:
            self.result.step_source = "manual"
        self._warming = warmup and profiler
        self._own_start = False  # set while this collector starts its own profiler
        self._step_work = False  # manual source: the open step has done more than a read that ran out
        self._sync_sites: dict[tuple[str, int, str], HostSyncSite] = {}
        self._library_dirs = tuple(
            os.path.dirname(os.path.abspath(f)) + os.sep for f in (torch.__file__, __file__)
        )
        self.clock = StepClock()
        self._window = window
        self._event_budget = event_budget
        self._parts_dir = parts_dir
        self._say = say or (lambda line: None)
        # torch.profiler's state: "off" (none runs), "prepared" (warmed up, recording
        # nothing yet), "recording", "done" (stopped before the run ended).
        self._recording_state = "off"
        self._recorded_steps: list[int] = []
        self._parts: list[Path] = []
        self._events_written = 0
        self._part_steps = 0
        self._loaders: dict[int, dict[str, Any]] = {}
        self._children: list[dict[str, Any]] = []
        self._run_delay: RunDelay | None = None
        self._began_ns = 0
        self._began_delay: int | None = None

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("another advisor collector is already running in this process")
        if self._use_profiler:
            self._prof = self._new_profiler()
            with _quiet_kineto(), _inductor_left_alone(self._torch):
                if self._warming or self._window is not None:
                    self._prof.prepare_trace()
                    self._recording_state = "prepared"
                else:
                    self._prof.start()
                    self._recording_state = "recording"
        if self._window is not None:
            self.result.recording["window"] = str(self._window)
        # The main thread's wait for a core from here on: a busy machine's mark on the timings.
        self._run_delay = RunDelay()
        self._began_ns, self._began_delay = time.perf_counter_ns(), self._run_delay.read()
        _ACTIVE = self
        try:
            self._install()
        except BaseException:
            self._uninstall()
            _ACTIVE = None
            if self._prof is not None:
                with _quiet_kineto():
                    self._prof.stop()
            raise

    def _new_profiler(self) -> Any:
        return self._torch.profiler.profile(
            activities=self.activities,
            record_shapes=self._record_shapes,
            with_stack=self._with_stack,
        )

    def record(self) -> None:
        """Start recording, after a ``warmup`` start or where a window's first step opens
        (a no-op otherwise)."""
        if self._recording_state != "prepared" or self._stopped:
            return
        self._warming = False
        self._own_start = True  # the hooks must not take this start for the script's own profiler
        try:
            with _quiet_kineto():
                self._prof.start_trace()
        finally:
            self._own_start = False
        self._recording_state = "recording"

    def recording(self) -> bool:
        """Whether torch.profiler records now."""
        return self._recording_state == "recording"

    def _stop_recording(self, why: str) -> None:
        """Stop torch.profiler before the run ends (the window is over); the steps after
        are timed, not recorded."""
        if self._recording_state != "recording":
            return
        self.result.recording["stopped"] = why
        self._finish_profiler()
        self._recording_state = "done"

    def _finish_profiler(self) -> None:
        """Write the facts known so far into the trace, stop the profiler and, where the
        run is recorded in parts, export this part."""
        self._fill_result()
        try:
            self._prof.add_metadata_json(METADATA_KEY, trace_metadata_json(self.result.metadata()))
        finally:
            with _quiet_kineto():
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
        self.result.recording["parts"] = [str(p) for p in self._parts]
        self.result.recording["events"] = self._events_written

    def _rotate_part(self, next_step: int) -> None:
        """Whole-run recording in parts: end this part at a step boundary and, while the
        event budget lasts, start the next one."""
        self._finish_profiler()
        if self._event_budget is not None and self._events_written >= self._event_budget:
            self._recording_state = "done"
            self.result.recording["stopped"] = (
                f"the event budget of {self._event_budget:,} events was spent by step {next_step - 1} "
                f"({self._events_written:,} events recorded); later steps were timed, not recorded "
                f"(--event-budget raises it)")
            self._say(f"recording stopped before step {next_step}: {self._events_written:,} events recorded, "
                      f"the budget is {self._event_budget:,} (--event-budget)")
            return
        self._prof = self._new_profiler()
        self._own_start = True
        try:
            with _quiet_kineto(), _inductor_left_alone(self._torch):
                self._prof.start()
        finally:
            self._own_start = False
        self._part_steps = 0

    def begin_step(self, number: int) -> None:
        """``manual`` source: end the open step (complete) and begin step ``number``."""
        if not self._stopped:  # after a hand-over the script's own profiler would get the range
            self._open_step(number)

    def end_step(self, *, partial: bool | None = None) -> None:
        """``manual`` source: end the open step. ``partial=None``: partial where nothing
        but a data-loader read that ran out happened in it (the step a loop's last
        ``step()`` opened), so it is left out of per-step figures like any cut-off step."""
        if self._step is not None:
            self._close_step(partial=not self._step_work if partial is None else partial)

    def stop(self) -> HostCollection:
        """Close whatever is open, remove the hooks and stop the profiler. Safe to call
        once whatever state the script left things in."""
        global _ACTIVE
        if self._stopped:
            return self.result
        if self._recording_state == "prepared":
            # torch's own order for a warm-up that never recorded: start, then stop. (A
            # window whose first step never came records nothing but Kineto's start.)
            self.record()
        self._stopped = True
        try:
            self._uninstall()
        finally:
            _ACTIVE = None
            if self._phase is not None:
                self._close_phase()
            if self._step is not None:
                self._close_step(partial=True)
            if self._recording_state == "recording":
                self._finish_profiler()
                self._recording_state = "done"
            else:
                self._fill_result()
            if self._run_delay is not None:
                self._run_delay.close()
        return self.result

    def _fill_result(self) -> None:
        """The facts of the run so far, into ``result``."""
        result = self.result
        result.steps = self._next_step
        sites = sorted(self._sync_sites.values(), key=lambda site: (-site.total_ns, site.file, site.line))
        result.host_syncs = [site.as_dict() for site in sites[:MAX_HOST_SYNC_SITES]]
        result.step_times = self.clock.as_records()
        result.recording["recorded_steps"] = list(self._recorded_steps)
        if self.clock.dropped:
            result.recording["untimed_steps"] = self.clock.dropped
        result.loaders = [dict(entry) for entry in self._loaders.values()]
        result.children = list(self._children)
        delay = self._run_delay.read() if self._run_delay is not None else None
        if delay is not None and self._began_delay is not None:
            result.cpu_wait = {"wall_ns": time.perf_counter_ns() - self._began_ns,
                               "run_delay_ns": delay - self._began_delay}
        if not result.library_roots:
            result.library_roots = library_roots(self._torch)

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

    # -- hooks ---------------------------------------------------------------------------

    def _install(self) -> None:
        global _IN_TRACED_CODE
        torch = self._torch
        _IN_TRACED_CODE = _traced_code_test(torch)
        optim_mod = importlib.import_module("torch.optim.optimizer")
        dataloader_mod = importlib.import_module("torch.utils.data.dataloader")

        self._hook_every_module()
        self._undo.append(self._unhook_modules)
        handles = [
            optim_mod.register_optimizer_step_pre_hook(_optimizer_pre_hook),
            optim_mod.register_optimizer_step_post_hook(_optimizer_post_hook),
        ]
        self._undo.extend(handle.remove for handle in handles)

        self._patch(dataloader_mod._BaseDataLoaderIter, "__next__", _wrap_next)
        fetch_mod = importlib.import_module("torch.utils.data._utils.fetch")
        for fetcher in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            if hasattr(fetch_mod, fetcher):
                self._patch(getattr(fetch_mod, fetcher), "fetch", _wrap_fetch)
        # Processes the script starts (torch.multiprocessing.spawn, multiprocessing.Process)
        # run without the collector: they are counted so the report can say so.
        self._patch(importlib.import_module("multiprocessing.process").BaseProcess, "start", _wrap_process_start)
        self._patch(torch.Tensor, "backward", _wrap_backward)
        self._patch(torch.autograd, "backward", _wrap_backward)
        self._patch(torch.optim.Optimizer, "zero_grad", _wrap_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", _wrap_zero_grad)
        # torch runs one profiler at a time: a script that starts its own would stop this
        # one under it (and exporting ours afterwards crashes the process), so ours ends
        # first and hands over.
        autograd_profiler = importlib.import_module("torch.autograd.profiler")
        for name in ("_prepare_profiler", "_enable_profiler"):
            if hasattr(autograd_profiler, name):
                self._patch(autograd_profiler, name, _wrap_profiler_start)
        for method, call in HOST_SYNC_METHODS.items():
            self._patch(torch.Tensor, method, functools.partial(_wrap_host_sync, call=call, method=method))
        if torch.cuda.is_available():  # no upload without a GPU: keep CPU runs' calls untouched
            for method in ("to", "cuda"):
                self._patch(torch.Tensor, method, functools.partial(_wrap_upload, method=method))
        cuda = torch.cuda
        self._patch(cuda, "synchronize", functools.partial(_wrap_host_sync, call="synchronize", method=""))
        for owner in (cuda.Stream, cuda.Event):
            self._patch(owner, "synchronize", functools.partial(_wrap_host_sync, call="synchronize", method=""))
        self._patch(warnings, "showwarning", _wrap_showwarning, only_if_unchanged=True)
        if self._ranks is not None:
            spawn_mod = importlib.import_module("torch.multiprocessing.spawn")
            if hasattr(spawn_mod, "start_processes"):
                folder, options, wrap = self._ranks
                self._patch(spawn_mod, "start_processes",
                            functools.partial(_wrap_start_processes, folder=folder, options=options, wrap=wrap))
        distributed = importlib.import_module("torch.distributed")
        if getattr(distributed, "is_available", lambda: False)() and hasattr(distributed, "destroy_process_group"):
            self._patch(distributed, "destroy_process_group", _wrap_destroy_process_group)
        # torch.compile(module) warns that global module hooks (ours) fire once more for the
        # OptimizedModule wrapper; only the outermost call counts here, and the warning is
        # about advisor, not the user's code.
        self._ignore_warning(r"Using `torch\.compile\(module\)` when there are global hooks")

    def _patch(self, owner: Any, name: str, wrap: Any, *, only_if_unchanged: bool = False) -> None:
        """Replace ``owner.name`` by ``wrap(original)`` until uninstall; with
        ``only_if_unchanged``, leave it at uninstall if the script replaced it meanwhile."""
        had_own = name in vars(owner)
        original = getattr(owner, name)
        wrapped = wrap(original)
        setattr(owner, name, wrapped)

        def undo() -> None:
            if only_if_unchanged and getattr(owner, name, None) is not wrapped:
                return
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _ignore_warning(self, message: str) -> None:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
        entry = warnings.filters[0]

        def undo() -> None:
            if entry in warnings.filters:
                warnings.filters.remove(entry)
                getattr(warnings, "_filters_mutated", lambda: None)()

        self._undo.append(undo)

    def _uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _hook_every_module(self) -> None:
        """Hook every module's call (torch's global module hooks): where a step begins and
        which module is the model is not known yet."""
        self._unhook_modules()
        module_mod = importlib.import_module("torch.nn.modules.module")
        self._module_hooks = [
            module_mod.register_module_forward_pre_hook(_forward_pre_hook),
            # always_call: the range is closed even when forward raises an Exception.
            module_mod.register_module_forward_hook(_forward_hook, always_call=True),
        ]

    def _hook_top_only(self) -> None:
        """An inference loop, each step a call of the model: hook only the modules whose
        calls opened a forward (the model, and a post-processing module beside it). Global
        module hooks send every module's call down torch's slow path (a small module's call
        takes twice as long), which on a step of a few dozen microseconds is most of what
        the step measures; the submodules need no hook once the top ones are known."""
        modules = [module for module in (ref() for ref in self._top_modules) if module is not None]
        self._unhook_modules()
        for module in modules:
            self._module_hooks += [module.register_forward_pre_hook(_forward_pre_hook),
                                   module.register_forward_hook(_forward_hook, always_call=True)]
        self._root_only = True

    def _unhook_modules(self) -> None:
        for handle in getattr(self, "_module_hooks", []):
            handle.remove()
        self._module_hooks = []
        self._root_only = False

    def _ours(self) -> bool:
        # A forked child (a DataLoader worker) sets _FORKED; reading it is cheaper than
        # os.getpid(), a system call, on every hook.
        return not _FORKED and threading.get_ident() == self._thread

    # -- ranges --------------------------------------------------------------------------

    def _enter(self, name: str) -> Any:
        # A range only torch.profiler would see costs microseconds for nothing where it is
        # not recording (the steps outside the window) and no GPU collector listens.
        if self._recording_state != "recording" and self._listener is None and self._use_profiler:
            return _NO_RANGE
        handle = self._torch.autograd.profiler.record_function(name)
        handle.__enter__()
        return handle

    def _opened(self, name: str) -> Any:
        return self._listener.range_opened(name) if self._listener is not None else None

    def _closed(self, token: Any) -> None:
        if self._listener is not None:
            self._listener.range_closed(token)

    def _open_phase(self, name: str, frame: Any) -> None:
        if name != DATALOADER:
            self._step_work = True
        handle = self._enter(name)
        self._phase = _Range(name, handle, frame, token=self._opened(name))
        self.clock.phase_opened(PHASE_LABELS[name])

    def _close_phase(self) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            self.clock.phase_closed()
            phase.handle.__exit__(None, None, None)
            self._closed(phase.token)

    def _phase_live(self) -> bool:
        """Whether a phase is open. A phase whose frame has gone without its closing hook
        running (KeyboardInterrupt in forward, an exception in optimizer.step that the
        script caught) is closed here, late but balanced."""
        if self._phase is None:
            return False
        if _on_stack(self._phase.frame):
            return True
        self._close_phase()
        return False

    def _open_step(self, number: int | None = None) -> None:
        if self._step is not None:
            self._close_step(partial=False)
        number = self._next_step if number is None else number
        self._next_step = number + 1
        self._turn_window(number)
        recorded = self._is_recorded(number)
        if recorded:
            self._recorded_steps.append(number)
        if self._listener is not None:
            self._listener.step_started(number)
        self.clock.step_opened(number, recorded=recorded)
        name = f"{STEP_PREFIX}{number}"
        handle = self._enter(name)
        self._step = _Range(name, handle, None, number, token=self._opened(name))
        if self.result.step_source == "forward":
            self._forward_steps.append(number)
        self._step_done = False
        self._step_work = False

    def _turn_window(self, number: int) -> None:
        """Before step ``number`` opens: start recording where the window begins, stop it
        where the window has ended, or begin the next part of a whole-run recording."""
        if not self._use_profiler or self._manual:
            return
        window = self._window
        if window is not None:
            if self._recording_state == "prepared" and number in window:
                self.record()
                self._say(f"recording {window.describe()}")
            elif self._recording_state == "recording" and number not in window:
                self._stop_recording(f"the window ({window.describe()}) ended")
                self._say(f"{window.describe()} recorded; the rest of the run is timed, not recorded")
        elif self._parts_dir is not None and self._recording_state == "recording":
            if self._part_steps >= PART_STEPS:
                self._rotate_part(number)
            self._part_steps += 1

    def _is_recorded(self, number: int) -> bool:
        """Whether step ``number`` is recorded: by torch.profiler, or (where the CUPTI
        collector records instead) by the window the CUPTI collector was given."""
        if self._use_profiler:
            return self._recording_state == "recording"
        return self._window is None or number in self._window

    def _close_step(self, *, partial: bool) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        if self._phase is not None:  # ranges stay nested: a phase never outlives its step
            self._close_phase()
        step.handle.__exit__(None, None, None)
        self.clock.step_closed(partial=partial)
        self._closed(step.token)
        if self._listener is not None:
            self._listener.step_ended(step.step, partial=partial)
        if partial:
            self.result.partial_steps.append(step.step)
        self._step_done = False
        self._step_owner = None

    def _replace_source(self, source: str, *, keep: _Range | None = None) -> None:
        """Make ``source`` the step source. The open step (unless it is ``keep``) ends here;
        steps counted under a ``forward`` source (warm-up calls of the model before the
        real loop showed itself) become partial."""
        old = self.result.step_source
        if self._step is not None and self._step is not keep:
            self._close_step(partial=not (old == "optimizer" and self._step_done))
        if old == "forward":
            for number in self._forward_steps:
                if (keep is None or number != keep.step) and number not in self.result.partial_steps:
                    self.result.partial_steps.append(number)
        self.result.step_source = source
        self._forward_steps = []
        self._top_modules = []
        if self._root_only:  # the loop trains after all: any module's call may open its forward
            self._hook_every_module()

    # -- events --------------------------------------------------------------------------

    def dataloader_next(self, original: Any, iterator: Any, frame: Any) -> Any:
        loader = self._loader_entry(iterator)
        if self._phase_live():  # a batch fetched inside another phase is part of it
            return self._read(original, iterator, loader)
        if self._manual:  # the caller's steps: a read is the Dataloader phase of the open one
            batch = self._fetch(original, iterator, frame, loader)
            self._step_work = True
            if self.result.batch_size_source != "dataloader":
                self._note_batch_size(batch, "dataloader")
            return batch
        if self.result.step_source != "dataloader":
            self._replace_source("dataloader")
        if self._step is not None:
            owner = self._step_owner() if self._step_owner is not None else None
            if owner is not None and owner is not iterator:
                # Another loader read inside this step (an evaluation every N steps, a
                # second loader zipped with the first): its time belongs to this step.
                return self._fetch(original, iterator, frame, loader)
            # The loop that owned the step went away without running out (a break):
            # this step ran on into whatever followed the loop.
            self._close_step(partial=owner is None and self._step_owner is not None)
        opened_step = False
        if not _exhausted(iterator):
            self._open_step()
            self._step_owner = weakref.ref(iterator)
            opened_step = True
        self._open_phase(DATALOADER, frame)
        try:
            batch = self._read(original, iterator, loader)
        except StopIteration:
            self._close_phase()
            if opened_step:  # the iterator's len() was not known: a step of nothing
                self._close_step(partial=True)
            raise
        finally:
            if self._phase is not None and self._phase.name == DATALOADER:
                self._close_phase()
        if self.result.batch_size_source != "dataloader":
            self._note_batch_size(batch, "dataloader")
        return batch

    def _fetch(self, original: Any, iterator: Any, frame: Any, loader: dict[str, Any]) -> Any:
        self._open_phase(DATALOADER, frame)
        try:
            return self._read(original, iterator, loader)
        finally:
            if self._phase is not None and self._phase.frame is frame:
                self._close_phase()

    def _read(self, original: Any, iterator: Any, loader: dict[str, Any]) -> Any:
        """One batch from ``iterator``, its time counted for its loader (a read that finds
        the iterator exhausted is not a batch)."""
        start = time.perf_counter_ns()
        batch = original(iterator)
        loader["read_ns"] += time.perf_counter_ns() - start
        loader["reads"] += 1
        return batch

    def _loader_entry(self, iterator: Any) -> dict[str, Any]:
        """The facts of the DataLoader ``iterator`` reads for, made at its first read."""
        dataset = getattr(iterator, "_dataset", None)
        key = id(dataset)
        entry = self._loaders.get(key)
        if entry is None:
            entry = self._loaders[key] = loader_facts(self._torch, iterator)
        return entry

    def timed_fetch(self, original: Any, fetcher: Any, index: Any) -> Any:
        """A fetcher's ``fetch`` in this process (num_workers=0): the whole fetch, and the
        collate function inside it, timed for the fetcher's loader."""
        entry = self._loaders.get(id(getattr(fetcher, "dataset", None)))
        if entry is None:
            return original(fetcher, index)
        collate = fetcher.collate_fn
        spent = [0]

        def timed_collate(data: Any) -> Any:
            began = time.perf_counter_ns()
            try:
                return collate(data)
            finally:
                spent[0] += time.perf_counter_ns() - began

        fetcher.collate_fn = timed_collate
        delay = self._run_delay
        began_delay = delay.read() if delay is not None else None
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return original(fetcher, index)
        finally:
            fetcher.collate_fn = collate
            entry["fetch_ns"] += time.perf_counter_ns() - began
            # The thread's CPU time tells work from waiting (reading files, sleeps):
            # workers that mostly wait can outnumber the cores. Time spent ready but
            # waiting for a core (a busy machine) is CPU work too, not waiting.
            entry["fetch_cpu_ns"] += time.thread_time_ns() - began_cpu
            ended_delay = delay.read() if delay is not None else None
            if began_delay is not None and ended_delay is not None:
                entry["fetch_runnable_ns"] = entry.get("fetch_runnable_ns", 0) + ended_delay - began_delay
            entry["collate_ns"] += spent[0]
            entry["fetches"] += 1
            try:
                entry["items"] += len(index) if getattr(fetcher, "auto_collation", False) else 1
            except TypeError:  # an index without a length (an iterable dataset's batch)
                entry["items"] += 1

    def note_child(self, process: Any) -> None:
        """A process the script starts: DataLoader workers are the loader's; any other runs
        work advisor's collector does not see."""
        from advisor.collect.stacks import sampled_worker_loop  # noqa: PLC0415

        target = getattr(process, "_target", None)
        worker_loop = getattr(importlib.import_module("torch.utils.data._utils.worker"), "_worker_loop", None)
        if target is sampled_worker_loop or target is worker_loop or getattr(target, "__name__", "") == "_worker_loop":
            return
        launcher = "multiprocessing"
        if getattr(target, "__module__", "") == "torch.multiprocessing.spawn":
            args = getattr(process, "_args", ()) or ()
            launcher = "torch.multiprocessing.spawn"
            target = args[0] if args and callable(args[0]) else target
            if type(target).__name__ == "ProfiledRank":  # profiled in the child: a rank of the job
                return
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(process).__name__
        module = getattr(target, "__module__", "") or ""
        for child in self._children:
            if child["target"] == name and child["launcher"] == launcher:
                child["count"] += 1
                return
        self._children.append({"target": name, "module": module, "launcher": launcher,
                               "count": 1, "step": self._step.step if self._step is not None else None})

    def sample_state(self) -> tuple[int, str]:
        """Where the script is now, for the stack sampler: (open step or -1, phase or '')."""
        step, phase = self._step, self._phase
        return (step.step if step is not None else -1, PHASE_LABELS.get(phase.name, "") if phase is not None else "")

    def _note_batch_size(self, batch: Any, source: str) -> None:
        try:
            size = first_batch_size(batch)
        except Exception:  # an exotic batch type must not break the user's run
            size = None
        if size is not None:
            self.result.batch_size = size
            self.result.batch_size_source = source

    def _training_event(self) -> None:
        """Forward, backward or zero_grad is starting: in the optimizer source this is where
        a step whose optimizer step has run ends and the next one starts."""
        if self.result.step_source == "optimizer" and (self._step_done or self._step is None):
            self._open_step()

    def forward_pre(self, module: Any, args: Any, frame: Any) -> None:
        if self._phase_live():
            return
        source = self.result.step_source
        if source is None:
            self._replace_source("forward")
            self._root_module = _weak(module)
            self._open_step()
        elif source == "forward" and self._root_module() is module:
            self._open_step()
            if (not self._root_only and len(self._forward_steps) > ROOT_ONLY_AFTER
                    and len(self._top_modules) <= TOP_MODULES):
                self._hook_top_only()
        else:
            self._training_event()
        if self.result.batch_size is None and source in (None, "forward"):
            self._note_batch_size(args, "forward")
        if self.result.step_source == "forward" and not self._root_only \
                and len(self._top_modules) <= TOP_MODULES \
                and not any(ref() is module for ref in self._top_modules):
            self._top_modules.append(_weak(module))
        self._open_phase(FORWARD, frame)

    def forward_post(self, frame: Any) -> None:
        if self._phase is not None and self._phase.name == FORWARD and self._phase.frame is frame:
            self._close_phase()

    def wrapped_phase(self, name: str, call: Any, frame: Any) -> Any:
        if self._phase_live():
            return call()
        self._training_event()
        self._open_phase(name, frame)
        try:
            return call()
        finally:
            if self._phase is not None and self._phase.frame is frame:
                self._close_phase()

    def optimizer_pre(self, optimizer: Any, frame: Any) -> None:
        if self._phase_live():
            return
        self._training_event()
        self._open_phase(OPTIMIZATION, frame)

    def optimizer_post(self, optimizer: Any, frame: Any) -> None:
        if self._phase is not None and self._phase.name == OPTIMIZATION and self._phase.frame is frame:
            self._close_phase()
        source = self.result.step_source
        if source in (None, "forward"):
            # The first optimizer step: this script trains without a DataLoader. The step
            # that is open (started by this iteration's forward) is the first real one.
            current = self._step
            self._replace_source("optimizer", keep=current)
            self._root_optimizer = _weak(optimizer)
            self._step_done = current is not None
        elif source == "optimizer" and self._root_optimizer() is optimizer:
            self._step_done = self._step is not None

    def hand_over(self, frame: Any) -> None:
        """The script is starting a profiler of its own: end this collection here."""
        while frame is not None and self.is_library_frame(frame):
            frame = frame.f_back
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        if self._listener is not None:
            self._listener.hand_over(where)
        self.result.notes.append(
            f"the script starts its own torch profiler{where}; torch runs one at a time, so "
            "advisor's host profile ends there (diagnose the trace the script writes for the rest)"
        )
        self.stop()

    def is_library_frame(self, frame: Any) -> bool:
        return frame.f_code.co_filename.startswith(self._library_dirs)

    def records_now(self) -> bool:
        """Whether anything records this instant: torch's profiler inside the window, or a
        GPU collector listening for ranges."""
        return self._recording_state == "recording" or self._listener is not None

    def sync_range(self, call: str, frame: Any) -> Any:
        """A record_function range named for a host-blocking call and its source line,
        in Kineto's call-stack spelling: ``advisor::sync item @ train.py(42): main``.
        Where nothing records (outside the window, no GPU collector listening) a range
        would cost more than the call it marks, so there is none."""
        if not self.records_now():
            return _NO_RANGE
        code = frame.f_code
        name = f"{SYNC_RANGE_PREFIX}{call} @ {code.co_filename}({frame.f_lineno}): {code.co_name}"
        return _ReportedRange(self, name)

    def note_host_sync(self, call: str, target: Any, frame: Any, elapsed_ns: int) -> None:
        code = frame.f_code
        key = (code.co_filename, frame.f_lineno, call)
        site = self._sync_sites.get(key)
        if site is None:
            if len(self._sync_sites) >= 10 * MAX_HOST_SYNC_SITES:
                return
            source = linecache.getline(code.co_filename, frame.f_lineno).strip()
            site = HostSyncSite(call, code.co_filename, frame.f_lineno, code.co_name, source)
            self._sync_sites[key] = site
        site.calls += 1
        site.total_ns += elapsed_ns
        if self._step is not None:
            site.steps.add(self._step.step)
        # A site's tensors live on one device in practice: look at the first few calls
        # only (reading .device builds an object each time, in a per-sample loop too).
        if site.calls <= 4:
            device = getattr(target, "device", None)
            if device is not None:
                site.devices.add(str(getattr(device, "type", device)))


def _traced_code_test(torch: Any) -> Any:
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    if is_compiling is None:  # torch before 2.3
        is_compiling = getattr(getattr(torch, "_dynamo", None), "is_compiling", _never)
    is_tracing = torch._C._get_tracing_state

    def in_traced_code() -> bool:
        return is_compiling() or is_tracing() is not None

    return in_traced_code


def _exhausted(iterator: Any) -> bool:
    """Whether a map-style DataLoader iterator has yielded all its batches, so the next
    ``__next__`` raises StopIteration (an IterableDataset has no length: False)."""
    try:
        return iterator._num_yielded >= len(iterator)
    except Exception:
        return False


# The hook functions are module-level so that a hook left behind by a failed uninstall
# does nothing once its collector is gone.


def _acting() -> HostCollector | None:
    """The collector a hook should report to: none while torch.compile or torch.jit.trace
    traces the code the hook is in (the hook must stay invisible to them, or a
    ``fullgraph=True`` compile fails on it), on another thread or in a forked worker."""
    if _IN_TRACED_CODE():
        return None
    collector = _ACTIVE
    if collector is None or not collector._ours():
        return None
    return collector


def _forward_pre_hook(module: Any, args: Any) -> None:
    # The clock is read after _acting(): torch.compile must not trace it (fullgraph fails on
    # a call it cannot trace), and _acting() is all a traced hook may do.
    collector = _acting()
    if collector is not None:
        began = time.perf_counter_ns()
        collector.forward_pre(module, args, sys._getframe(1))
        # What the hooks cost is the collector's, not the job's (StepClock.own).
        collector.clock.own(time.perf_counter_ns() - began)


def _forward_hook(module: Any, args: Any, output: Any) -> None:
    collector = _acting()
    if collector is not None:
        began = time.perf_counter_ns()
        collector.forward_post(sys._getframe(1))
        collector.clock.own(time.perf_counter_ns() - began)


def _optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    collector = _acting()
    if collector is not None:
        collector.optimizer_pre(optimizer, sys._getframe(1))


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    collector = _acting()
    if collector is not None:
        collector.optimizer_post(optimizer, sys._getframe(1))


def _wrap_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        collector = _acting()
        if collector is None:
            return original(self)
        return collector.dataloader_next(original, self, sys._getframe())

    return __next__


def _wrap_fetch(original: Any) -> Any:
    @functools.wraps(original)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        collector = _acting()
        if collector is None:
            return original(self, possibly_batched_index)
        return collector.timed_fetch(original, self, possibly_batched_index)

    return fetch


def _wrap_process_start(original: Any) -> Any:
    @functools.wraps(original)
    def start(self: Any) -> Any:
        collector = _ACTIVE
        if collector is not None and collector._ours():
            try:
                collector.note_child(self)
            except Exception:  # noqa: BLE001  (counting must never stop the user's process)
                pass
        return original(self)

    return start


def _wrap_profiler_start(original: Any) -> Any:
    @functools.wraps(original)
    def start(*args: Any, **kwargs: Any) -> Any:
        collector = _ACTIVE
        if collector is not None and not collector._own_start and not _IN_TRACED_CODE():
            collector.hand_over(sys._getframe(1))
        return original(*args, **kwargs)

    return start


def _wrap_start_processes(original: Callable[..., Any], *, folder: Path, options: dict,
                          wrap: type) -> Callable[..., Any]:
    """torch.multiprocessing.spawn's start_processes, each process's function run under a
    collector of its own that saves the rank's session in ``folder``: ``wrap(fn, folder,
    options)``, the class the command gave (advisor.collect.spawned.ProfiledRank)."""

    @functools.wraps(original)
    def start_processes(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(fn, wrap):
            fn = wrap(fn, str(folder), options)
        return original(fn, *args, **kwargs)

    return start_processes


# How long destroy_process_group lets gloo's threads run before it joins them.
SETTLE_BEFORE_DESTROY_S = 0.2


def _wrap_destroy_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """Give gloo's threads the GIL for a moment before the script destroys its process group.

    A gloo collective started during backward keeps a Python object (the autograd engine's
    stashed context) in the thread-local state it captured, and gloo's worker thread needs
    the GIL to drop it; ``destroy_process_group`` (through the DDP reducer's deallocation)
    joins that thread while holding the GIL. Plain runs rarely lose that race; with the
    collector's sampler threads also taking the GIL, a rank hung at exit in 3 of 12 runs of
    examples/ddp_straggler.py under torchrun, and in none of 16 with this pause (which
    releases the GIL) first."""

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SETTLE_BEFORE_DESTROY_S)
        return original(*args, **kwargs)

    return destroy_process_group


def _wrap_backward(original: Any) -> Any:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        collector = _acting()
        if collector is None:
            return original(*args, **kwargs)
        return collector.wrapped_phase(BACKWARD, lambda: original(*args, **kwargs), sys._getframe())

    return backward


def _wrap_zero_grad(original: Any) -> Any:
    @functools.wraps(original)
    def zero_grad(*args: Any, **kwargs: Any) -> Any:
        collector = _acting()
        if collector is None:
            return original(*args, **kwargs)
        return collector.wrapped_phase(OPTIMIZATION, lambda: original(*args, **kwargs), sys._getframe())

    return zero_grad


def _wrap_showwarning(original: Any) -> Any:
    """A warning raised in a call the hooks wrap (torch's C code warns about the Python
    frame that called it, a library warns with stacklevel=2) would name this file; show it
    at the user's line that made the call instead, as it would be without advisor."""

    @functools.wraps(original)
    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> Any:
        if filename == __file__:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename != __file__:
                frame = frame.f_back
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back
            if frame is not None:
                filename, lineno, line = frame.f_code.co_filename, frame.f_lineno, None
        return original(message, category, filename, lineno, file, line)

    return showwarning


def _copies_to_host(args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(*args[1:], **kwargs)`` copies a device tensor to the CPU.
    (``.to(device)`` of a CPU tensor is the portable host-to-device idiom, not a read-back,
    even on a run where ``device`` is the CPU.)"""
    source = getattr(getattr(args[0], "device", None), "type", "cpu") if args else "cpu"
    if source == "cpu":
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cpu":
            return True
        kind = getattr(value, "type", None)  # torch.device
        if kind == "cpu" and not callable(kind):
            return True
        device = getattr(value, "device", None)  # a tensor: .to(other) takes its device
        if getattr(device, "type", None) == "cpu":
            return True
    return False


def _pageable_upload(args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(...)`` / ``tensor.cuda()`` copies unpinned host memory to a GPU:
    the driver stages such a copy through a pinned buffer and the host waits for it, even
    with non_blocking=True."""
    tensor = args[0] if args else None
    if getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return False
    try:
        if tensor.is_pinned():
            return False
    except Exception:  # is_pinned() needs a CUDA runtime; without one nothing is uploaded
        return False
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cuda":
            return True
        if getattr(value, "type", None) == "cuda":  # torch.device
            return True
        if getattr(getattr(value, "device", None), "type", None) == "cuda":  # a tensor
            return True
    return False


def _wrap_upload(original: Any, *, method: str) -> Any:
    """``Tensor.to`` / ``Tensor.cuda``: host-to-device copies from pageable memory are
    host-blocking calls of the user's line; everything else passes through. (``.to`` towards
    the CPU is the read-back HOST_SYNC_METHODS covers; this wrapper sits outside it.)"""

    @functools.wraps(original)
    def upload(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE is None or not _ACTIVE.records_now():
            return original(*args, **kwargs)
        collector = _acting()
        if collector is None:
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        if collector.is_library_frame(caller):
            return original(*args, **kwargs)
        if not (_pageable_upload(args, kwargs) or (method == "cuda" and _pageable_upload((args[0], "cuda"), {}))):
            return original(*args, **kwargs)
        start = time.perf_counter_ns()
        try:
            with collector.sync_range("pageable copy to device", caller):
                return original(*args, **kwargs)
        finally:
            collector.note_host_sync("pageable copy to device", args[0] if args else None, caller,
                                     time.perf_counter_ns() - start)

    return upload


def _wrap_host_sync(original: Any, *, call: str, method: str) -> Any:
    @functools.wraps(original)
    def host_sync(*args: Any, **kwargs: Any) -> Any:
        # Outside the window nothing records: a per-sample loop's int(t) would pay the
        # wrapper's few microseconds for a count no table reads. The cheapest test first.
        if _ACTIVE is None or not _ACTIVE.records_now():
            return original(*args, **kwargs)
        collector = _acting()
        if collector is None:
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        if collector.is_library_frame(caller) or (method == "to" and not _copies_to_host(args, kwargs)):
            return original(*args, **kwargs)
        start = time.perf_counter_ns()
        try:
            # The range carries the calling line into the trace: the importer gives the
            # ops inside it (aten::item, aten::_local_scalar_dense...) this line as their
            # call stack, since torch's Python frames only know where functions begin.
            with collector.sync_range(call, caller):
                return original(*args, **kwargs)
        finally:
            target = args[0] if method and args else None
            collector.note_host_sync(call, target, caller, time.perf_counter_ns() - start)

    return host_sync


@contextmanager
def _inductor_left_alone(torch: Any) -> Iterator[None]:
    """Start torch.profiler without importing torch._inductor.

    torch.profiler's prepare_trace asks ``hasattr(torch, "_inductor")`` to read inductor's
    CUDA-graph setting, and torch's lazy module attribute makes that question import
    inductor (and sympy): 1.1 to 1.2 s and some 100 MB on this machine, most of what
    advisor cost a small script. A script that compiled something has imported inductor
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
def _quiet_kineto() -> Iterator[None]:
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
