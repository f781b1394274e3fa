"""The built-in GPU collector: CUPTI's activity API through NVIDIA's cupti-python.

``advisor diagnose train.py`` on a machine with an NVIDIA GPU records, for the steps asked
for (``--steps A:B``; by default steps 2 to 6, after a warm-up of two steps that is not
recorded), every kernel, copy, set and synchronisation on the GPU, the runtime and driver
calls that launched them, NVTX ranges, the devices, and CUPTI's own overhead. cupti-python
is an optional extra and is imported only here, lazily: :func:`unavailable_reason` says in
one line why the collector cannot run (not installed, no CUDA device, a CUDA major version
that does not match torch's, torch.profiler holding CUPTI) and the command then falls back
to the host-side collector.

How a GPU activity reaches its step, phase and op (see also advisor.collect.cupti_host):

1. launch: each kernel, copy, set and sync record carries the *correlation id* of the
   runtime or driver call that issued it; advisor.session.attribute links them (``launch``).
2. op: the op recorder (advisor.collect.op_recorder: torch's RecordFunction callbacks in
   C++, else a Python dispatch mode) pushes each op's id as an *external correlation id*;
   CUPTI ties every API call made inside the op to it, and the rows get ``external_id``,
   which advisor.session.attribute maps to the op (``parent_op``) with its input shapes and
   dtypes. Where no id could be pushed, the innermost op on the call's thread whose time
   contains it is its op.
3. step and phase: advisor's hooks report their ranges (``ProfilerStep#N``,
   ``advisor::Forward``...) to the collector, which records them on the host timeline;
   advisor.session.attribute gives every host row the step and phase it falls in by time and
   every GPU row those of its launching call, so work queued in step N counts in step N.
4. source line: the hooks' ``advisor::sync <call> @ file(line): function`` ranges around
   host-blocking calls land on the same timeline; the ops inside them (and through them
   the copies and synchronisations they caused) take that line as their call stack.

Clocks: CUPTI timestamps are nanoseconds from ``clock_gettime(CLOCK_REALTIME)`` on Linux
unless a timestamp callback is registered (cupti_activity.h); the host timeline reads the
same clock with ``time.time_ns``. At start the collector still measures the offset between
``cupti.get_timestamp()`` and ``time.time_ns()`` (the narrowest of a few brackets) and
subtracts it, so a platform or a CUPTI configured with another clock (WSL uses
CLOCK_MONOTONIC_RAW) lines up too. Session times are ns since the collector started
(``base_time_ns``).

Bounded memory: activities are enabled only while the window's steps run, plus one step
in which the GPU kinds stay on for work the last step queued; API calls are recorded for
the window's steps alone, and GPU work whose launch was not recorded (a warm-up step's
kernels still running, a later step's) is left out and counted. Records past
``max_records`` are counted, not kept. CUPTI's own dropped-record count is read at every
flush. Only advisor's own ranges are needed for steps and phases; the script's NVTX
ranges are recorded too where ``NVTX_INJECTION64_PATH`` names libcupti before the process
starts (NVTX's rule, not advisor's).

One CUPTI user at a time: Kineto (torch.profiler, even with CPU activities only) registers
its own buffer callbacks, which would take CUPTI's records away from this collector. The
collector refuses to start while a torch profiler runs, and :meth:`CuptiCollector.hand_over`
ends collection where the script starts one.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np
import pandas as pd

from advisor.collect import cupti_records as rec
from advisor.collect import op_recorder
from advisor.collect.cupti_host import HostTimeline
from advisor.collect.steps import StepWindow
from advisor.session import CollectorCost, CollectorInfo, DeviceInfo, concat_events, text
from advisor.session.attribute import attribute

INSTALL_HINT = "pip install 'advisor[cuda]'"
DEFAULT_BUFFER_BYTES = 8 << 20
DEFAULT_MAX_RECORDS = 4_000_000

GPU_KINDS = (rec.KIND_CONCURRENT_KERNEL, rec.KIND_MEMCPY, rec.KIND_MEMCPY2, rec.KIND_MEMSET)
API_KINDS = (rec.KIND_RUNTIME, rec.KIND_DRIVER, rec.KIND_SYNCHRONIZATION, rec.KIND_EXTERNAL_CORRELATION,
             rec.KIND_MARKER)
ALWAYS_KINDS = (rec.KIND_DEVICE, rec.KIND_CONTEXT, rec.KIND_OVERHEAD)
# Calls torch makes by the thousand that launch nothing; not recording them keeps
# CUPTI's overhead and the record count down (torch's own CUPTI monitor does the same).
QUIET_RUNTIME_CBIDS = (10, 11, 16, 17, 134, 136, 317, 324)
QUIET_DRIVER_CBIDS = (304, 677, 392, 719)  # cuCtxGetCurrent, cuGetProcAddress_v2, cuDevicePrimaryCtxGetState, cuKernelGetName
# The driver calls a table or rule reads (launches that bypass the runtime, as Triton's and
# CUDA graphs' do; copies, sets and waits; event ordering across streams; module loads set
# apart as start-up): every other driver call is left unrecorded where cupti-python names
# them. torch and its libraries make thousands of others a step (cuDevicePrimaryCtxGetState,
# cuKernelGetName) that no finding needs.
DRIVER_CALLS_KEPT = ("cuLaunch", "cuGraphLaunch", "cuMemcpy", "cuMemset", "cuStreamSynchronize", "cuCtxSynchronize",
                     "cuEventSynchronize", "cuEventRecord", "cuStreamWaitEvent", "cuStreamWaitValue", "cuModuleLoad",
                     "cuLibraryLoad", "cuModuleGetFunction", "cuLibraryGetKernel", "cuInit", "cuCtxCreate",
                     "cuDevicePrimaryCtxRetain", "cuMemFree", "cuMemAlloc", "cuMemHost")

# cupti-python releases on PyPI (major -> minors), each requiring nvidia-cuda-cupti of
# its own minor or later; torch's CUDA wheels pin theirs, so the release to install is
# the newest one not newer than torch's CUDA.
KNOWN_CUPTI_PYTHON = {12: (6, 8), 13: (0, 2, 3, 4)}


class CollectorUnavailable(RuntimeError):
    """The CUPTI collector cannot run here; the message is the one-line reason."""


# -- availability ---------------------------------------------------------------------------


def import_cupti() -> tuple[Any, str | None]:
    """cupti-python's bindings module (``cupti.cupti``), or None and why not."""
    try:
        from cupti import cupti as api
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "cupti":
            return None, f"cupti-python is not installed: {INSTALL_HINT}"
        return None, f"cupti-python is installed but broken ({_one_line(exc)})"
    except Exception as exc:  # libcupti not found, wrong architecture...
        return None, f"cupti-python could not load CUPTI ({_one_line(exc)})"
    return api, None


def cupti_python_version() -> str | None:
    try:
        return metadata.version("cupti-python")
    except metadata.PackageNotFoundError:
        return None


def install_hint(torch_cuda: str | None) -> str:
    """The pip command that installs the cupti-python matching torch's CUDA."""
    match = re.match(r"(\d+)\.(\d+)", torch_cuda or "")
    if not match:
        return INSTALL_HINT
    major, minor = int(match[1]), int(match[2])
    fitting = [m for m in KNOWN_CUPTI_PYTHON.get(major, ()) if m <= minor]
    return f"pip install 'cupti-python=={major}.{max(fitting) if fitting else minor}.*'"


def version_mismatch(torch_cuda: str | None, cupti_version: str | None) -> str | None:
    """One line where cupti-python's CUDA major differs from the one torch was built with
    (two CUPTI libraries of different majors cannot serve one process)."""
    if not torch_cuda or not cupti_version:
        return None
    torch_major = torch_cuda.split(".")[0]
    cupti_major = cupti_version.split(".")[0]
    if torch_major == cupti_major:
        return None
    return (f"cupti-python {cupti_version} is for CUDA {cupti_major} but torch is built with CUDA "
            f"{torch_cuda}: {install_hint(torch_cuda)}")


def cupti_function_address(name: str) -> int | None:
    """The address of libcupti's C function ``name`` in this process (the library
    cupti-python loaded), for the native op recorder to call with no Python in between;
    None where no libcupti is loaded or it lacks the function."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcupti.so" in line and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            function = getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
        return ctypes.cast(function, ctypes.c_void_p).value
    return None


def torch_profiler_active(torch: Any) -> bool:
    """Whether a torch profiler (Kineto or legacy) is running in this process."""
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # a torch without the private hook: assume none runs
        return False


def unavailable_reason(torch: Any, *, loader: Callable[[], tuple[Any, str | None]] = import_cupti) -> str | None:
    """Why the CUPTI collector cannot run in this process, in one line; None if it can."""
    if torch is None:
        return "torch is not importable"
    if not getattr(getattr(torch, "version", None), "cuda", None):
        return "this torch is built without CUDA"
    try:
        has_device = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception as exc:
        return f"no usable CUDA device ({_one_line(exc)})"
    if not has_device:
        return "no CUDA device"
    api, why = loader()
    if api is None:
        if why and "not installed" in why:
            return f"cupti-python is not installed: {install_hint(torch.version.cuda)}"
        return why
    mismatch = version_mismatch(torch.version.cuda, cupti_python_version())
    if mismatch:
        return mismatch
    if torch_profiler_active(torch):
        return "torch.profiler is active and holds CUPTI"
    return None


def not_measured_line(reason: str) -> str:
    """The one line a report shows when the GPU side was not collected."""
    return (f"GPU not measured ({reason}): kernels, copies and GPU utilisation come from the built-in "
            f"CUPTI collector on a machine with an NVIDIA GPU and {INSTALL_HINT}.")


# -- the collector ---------------------------------------------------------------------------


@dataclass
class CuptiCapture:
    """What one collection produced: attributed events, devices, and the collector's
    account of itself (for SessionMeta.collector)."""

    events: pd.DataFrame
    devices: list[DeviceInfo]
    collector: CollectorInfo
    base_time_ns: int
    recorded_steps: list[int] = field(default_factory=list)
    clock_offset_ns: int = 0
    clock_error_ns: int = 0


IDLE, RECORDING, DRAINING, DONE = "idle", "recording", "draining", "done"


class CuptiCollector:
    """CUPTI activity collection for one run, driven by step boundaries.

    ``api`` is cupti-python's ``cupti.cupti`` module (or a stand-in with the same
    functions: the tests replay recorded activity streams through it). Call ``start()``
    before the script, report the hooks' events while it runs (:meth:`step_started`,
    :meth:`range_opened` / :meth:`range_closed`), ``stop()`` after it.

    ``ops`` is where ops come from (default: made at ``start()`` by
    advisor.collect.op_recorder, the native recorder where it can be built); ``clock``,
    ``pid`` and ``thread_id`` are the host's, replaceable for replaying a recording.
    ``external_functions``: the addresses of the C functions that push and pop an external
    correlation id (default: libcupti's own, found in the process). ``say(line)`` hears of a
    first build of the native recorder.
    """

    def __init__(
        self,
        api: Any,
        *,
        window: StepWindow | None = StepWindow(),
        torch: Any = None,
        record_ops: bool = True,
        ops: Any = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        max_records: int = DEFAULT_MAX_RECORDS,
        clock: Callable[[], int] = time.time_ns,
        pid: int | None = None,
        thread_id: Callable[[], int] | None = None,
        native_ops: bool = True,
        external_functions: tuple[int, int] | None = None,
        say: Callable[[str], None] | None = None,
    ):
        self.api = api
        self.window = window
        self.torch = torch
        self.buffer_bytes = buffer_bytes
        self.clock = clock
        self.store = rec.RecordStore(max_records)
        self.timeline = HostTimeline(clock=clock, pid=pid, thread_id=thread_id or threading.get_native_id)
        self.state = IDLE
        self.recorded_steps: list[int] = []
        self.enabled: list[int] = []
        self.notes: list[str] = []
        self.dropped = 0
        self.buffers = 0
        self.callback_errors = 0
        self.clock_offset_ns = 0
        self.clock_error_ns = 0
        self.base_time_ns = 0
        self._closed_step: int | None = None
        self._partial_steps: set[int] = set()
        self._capture: CuptiCapture | None = None
        self._external_kind = rec.EXTERNAL_KIND_CUSTOM2
        # The op source: anything with start() and stop(), active only while recording
        # (and, for advisor.collect.op_recorder's, frame() and facts()); made at start().
        self._ops: Any = ops
        self._make_ops = ops is None and record_ops and torch is not None
        self._native_ops = native_ops
        self._external_functions = external_functions
        self._say = say
        self.op_cost: dict[str, float] | None = None
        self.window_open_ns: int | None = None  # host clock, when the window's calls began to be recorded

    # -- CUPTI's callbacks (run on CUPTI's thread or inside a flush) ----------------------

    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0  # 0: as many records as fit

    def _buffer_completed(self, activities: Any) -> None:
        # Copy the plain fields and let the records go; an exception must not reach
        # CUPTI's thread, so it is counted and said in the notes instead.
        self.buffers += 1
        try:
            self.store.add_all(activities)
        except Exception:
            self.callback_errors += 1

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self.torch is not None and torch_profiler_active(self.torch):
            raise CollectorUnavailable("torch.profiler is active and holds CUPTI")
        problems = rec.check_enums(self.api)
        if problems:  # the records would be misread: better not measured than wrong
            raise CollectorUnavailable(f"this cupti-python numbers CUPTI's enums differently ({problems[0]})")
        api = self.api
        api.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        thread_id_type = getattr(getattr(api, "ActivityThreadIdType", None), "SYSTEM", 1)
        try:
            api.set_thread_id_type(int(thread_id_type))
        except Exception as exc:
            self.notes.append(f"CUPTI kept its own thread ids ({_one_line(exc)}): API calls may not line up with threads")
        self._measure_clock()
        self.base_time_ns = self.clock()
        self._enable(ALWAYS_KINDS)
        if self._make_ops:
            self._start_op_recorder()
        if self.window is None:
            self._open_window(None)

    def _start_op_recorder(self) -> None:
        """Make the op recorder (native where it can be built) and measure what it costs an
        op here, before the script runs."""
        push, pop = self._external_functions or (cupti_function_address("cuptiActivityPushExternalCorrelationId"),
                                                 cupti_function_address("cuptiActivityPopExternalCorrelationId"))
        if push is None or pop is None:
            self.notes.append("libcupti's external correlation functions were not found: ops are tied to their "
                              "kernels by time on their thread, not by id")
            push = pop = None
        self._ops, why = op_recorder.make_op_recorder(
            self.torch, push_address=push, pop_address=pop, external_kind=self._external_kind,
            push=self.push_external, pop=self.pop_external, native=self._native_ops, say=self._say)
        if why is not None:
            self.notes.append(f"ops were recorded by a Python dispatch mode ({why}): each op cost some tens of "
                              "microseconds more than unrecorded, and torch.compile'd code ran eager while it "
                              "recorded")
        try:
            self.op_cost = op_recorder.calibrate(self.torch, self._ops)
        except Exception as exc:  # the measurement is a figure, not a reason to lose the run
            self.notes.append(f"what recording costs an op could not be measured ({_one_line(exc)})")

    def _measure_clock(self) -> None:
        best: tuple[int, int] | None = None
        for _ in range(7):
            before = self.clock()
            cupti_now = int(self.api.get_timestamp())
            after = self.clock()
            if best is None or after - before < best[0]:
                best = (after - before, cupti_now - (before + after) // 2)
        assert best is not None
        self.clock_error_ns = best[0] // 2 + 1
        self.clock_offset_ns = best[1]
        if abs(self.clock_offset_ns) > 1_000_000:
            self.notes.append(f"CUPTI's clock is {self.clock_offset_ns / 1e6:.3f} ms off the host clock; "
                              "GPU times were shifted to the host clock")

    def _enable(self, kinds: tuple[int, ...]) -> None:
        for kind in kinds:
            if kind in self.enabled:
                continue
            try:
                self.api.activity_enable(kind)
            except Exception as exc:
                self.notes.append(f"CUPTI would not record {rec.KIND_NAMES.get(kind, kind)} ({_one_line(exc)})")
                continue
            self.enabled.append(kind)
            self._quieten(kind)

    def _quieten(self, kind: int) -> None:
        calls = {rec.KIND_RUNTIME: (QUIET_RUNTIME_CBIDS, "activity_enable_runtime_api"),
                 rec.KIND_DRIVER: (self._quiet_driver_cbids(), "activity_enable_driver_api")}.get(kind)
        if calls is None:
            return
        cbids, function = calls
        for cbid in cbids:
            try:
                getattr(self.api, function)(cbid, 0)
            except Exception:  # an id this CUPTI does not know; recording it is harmless
                pass

    def _quiet_driver_cbids(self) -> tuple[int, ...]:
        """The driver calls not to record: all but DRIVER_CALLS_KEPT where cupti-python names
        the driver's callback ids, else the few known to come by the thousand."""
        names = getattr(self.api, "DriverApiTraceCbid", None)
        try:
            members = [(str(m.name), int(m)) for m in names] if names is not None else []
        except Exception:
            members = []
        if not members:
            return QUIET_DRIVER_CBIDS
        return tuple(cbid for name, cbid in members
                     if cbid > 0 and not name.removeprefix("CUPTI_DRIVER_TRACE_CBID_").startswith(DRIVER_CALLS_KEPT)
                     and name not in ("INVALID", "SIZE", "FORCE_INT"))

    def _disable(self, kinds: tuple[int, ...]) -> None:
        for kind in kinds:
            if kind in self.enabled:
                try:
                    self.api.activity_disable(kind)
                except Exception as exc:
                    self.notes.append(f"CUPTI would not stop recording {rec.KIND_NAMES.get(kind, kind)} ({_one_line(exc)})")
                self.enabled.remove(kind)

    def _open_window(self, step: int | None) -> None:
        self.window_open_ns = self.clock()
        self._enable(GPU_KINDS + API_KINDS)
        if self._ops is not None:
            self._ops.start()
        self.state = RECORDING
        if step is not None:
            self.recorded_steps.append(step)

    def _close_window(self, step: int | None) -> None:
        """Stop recording calls and ops; GPU kinds stay on for one more step so work the
        last recorded step queued is still seen when it runs."""
        if self._ops is not None:
            self._ops.stop()
        self._disable(API_KINDS)
        self._closed_step = step
        self.state = DRAINING

    # -- what advisor's hooks report --------------------------------------------------------

    def step_started(self, number: int) -> None:
        """A step is starting (called after the previous step's range closed and before
        this step's range opens)."""
        window = self.window
        if window is None:
            return
        if self.state == IDLE and number == window.start - 1:
            # The GPU kinds a step early: the work this step queues and the window's first
            # waits wait for is recorded (in flight when the window opens), its launch not.
            self._enable(GPU_KINDS)
        if self.state == IDLE and number in window:
            self._open_window(number)
        elif self.state == RECORDING:
            if number in window:
                self.recorded_steps.append(number)
            else:
                self._close_window(number)
        elif self.state == DRAINING and self._closed_step is not None and number > self._closed_step:
            self._disable(GPU_KINDS)
            self.state = DONE

    def step_ended(self, number: int, *, partial: bool = False) -> None:
        """A step's range closed; a partial one (the run stopped in it, a ``break``) is
        left out of the steps, as the Kineto importer leaves out the host collector's."""
        if partial:
            self._partial_steps.add(number)

    def records_now(self) -> bool:
        """Whether the window's steps are being recorded this instant (the hooks skip the
        work of marking a range or a call where nothing would keep it)."""
        return self.state == RECORDING

    def range_opened(self, name: str) -> int | None:
        """One of advisor's ranges opens: a token for :meth:`range_closed`, or None while
        not recording (outside the window nothing is kept)."""
        return self.timeline.open_range(name) if self.state == RECORDING else None

    def range_closed(self, token: int | None) -> None:
        self.timeline.close_range(token)

    def hand_over(self, where: str = "") -> None:
        """The script starts a torch profiler: end GPU collection here, before Kineto
        registers its own callbacks with CUPTI."""
        self.notes.append(f"the script starts its own torch profiler{where}; it takes CUPTI over, so advisor's "
                          "GPU collection ends there (diagnose the trace the script writes for the rest)")
        self.stop()

    def push_external(self, op_id: int) -> None:
        self.api.activity_push_external_correlation_id(self._external_kind, op_id)

    def pop_external(self) -> None:
        self.api.activity_pop_external_correlation_id(self._external_kind)

    # -- draining ----------------------------------------------------------------------------

    def flush(self, *, forced: bool = True) -> None:
        """Have CUPTI hand over every buffer it holds, and count what it dropped."""
        try:
            self.api.activity_flush_all(1 if forced else 0)  # 1: CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        except Exception as exc:
            self.notes.append(f"CUPTI could not flush its buffers ({_one_line(exc)}): the last records may be missing")
        self._count_dropped()

    def _count_dropped(self) -> None:
        dropped = ctypes.c_size_t(0)
        try:
            # NULL context: the global queue. The count is of records dropped since the
            # last call, so it is summed.
            self.api.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        except Exception:
            return
        self.dropped += int(dropped.value)

    def stop(self, *, partial_steps: tuple[int, ...] | list[int] = ()) -> CuptiCapture:
        """Stop collecting, drain CUPTI, and return what was recorded. Safe to call once
        whatever state the run was left in; later calls return the same capture.
        ``partial_steps``: steps the hooks found cut short (as :meth:`step_ended`)."""
        self._partial_steps.update(partial_steps)
        if self._capture is not None:
            return self._capture
        if self._ops is not None:
            self._ops.stop()
        if self.state in (RECORDING, DRAINING) and self.torch is not None:
            # The script is over, so waiting for the GPU costs it nothing, and work it
            # queued last is recorded when it runs rather than lost when kinds go off.
            try:
                self.torch.cuda.synchronize()
            except Exception as exc:
                self.notes.append(f"the GPU could not be waited for at the end ({_one_line(exc)}): its last work may be missing")
        self._disable(tuple(self.enabled))
        self.state = DONE
        self.flush(forced=True)
        self._capture = self._build()
        return self._capture

    # -- the result ----------------------------------------------------------------------------

    def _cost(self) -> CollectorCost:
        facts = self._ops.facts() if hasattr(self._ops, "facts") else {}
        calibrated = self.op_cost or {}
        return CollectorCost(op_recorder=facts.get("op_recorder", "stand-in" if self._ops is not None else ""),
                             ops_recorded=int(facts.get("ops_recorded", 0)), ops_dropped=int(facts.get("ops_dropped", 0)),
                             per_op_ns=calibrated.get("cost_ns_per_op"), plain_ns_per_op=calibrated.get("plain_ns_per_op"),
                             spread_ns_per_op=calibrated.get("spread_ns_per_op"))

    def _to_session_ns(self, cupti_ns: np.ndarray) -> np.ndarray:
        return cupti_ns - self.clock_offset_ns - self.base_time_ns

    def _build(self) -> CuptiCapture:
        lookup = getattr(self.api, "get_callback_name", None)
        opened = self.window_open_ns
        built = rec.build_events(self.store, to_session_ns=self._to_session_ns, api_lookup=lookup,
                                 launched_only=self.window is not None,
                                 window_open=opened + self.clock_offset_ns if opened is not None else None)
        still_open = self.timeline.close_all()
        to_session = lambda t: t - self.base_time_ns  # noqa: E731
        host = self.timeline.frame(to_session)
        ops_frame = getattr(self._ops, "frame", None)
        if ops_frame is not None:
            host = concat_events([host, ops_frame(to_session)])
        if self._partial_steps and len(host):
            cut = {f"ProfilerStep#{n}" for n in self._partial_steps}
            host = host[~host["name"].astype(str).isin(cut).to_numpy()]
        events = attribute(concat_events([built.events, host]))

        devices = rec.devices(self.store)
        known = {d.id for d in devices}
        seen = sorted({int(d) for d in events.loc[events["device"] >= 0, "device"].unique()})
        for index in seen:
            if index not in known and self.torch is not None:
                try:
                    devices.append(rec.device_from_torch(index, self.torch.cuda.get_device_properties(index)))
                except Exception:
                    devices.append(DeviceInfo(id=index, kind="gpu", name=f"GPU {index}"))
        devices.sort(key=lambda d: d.id)

        overhead_ns, overhead_by_kind = rec.overhead(self.store)
        notes = list(self.notes)
        if self.window is not None:
            if self.recorded_steps:
                notes.append(f"steps {self.window} were asked for; steps {_ranges(self.recorded_steps)} were recorded "
                             "(earlier steps are warm-up and later ones were not recorded)")
            else:
                notes.append(f"no step in {self.window} ran, so the GPU was not recorded; "
                             "--steps all records the whole run")
            cut_short = sorted(self._partial_steps & set(self.recorded_steps))
            if cut_short:
                notes.append(f"step {_ranges(cut_short)} was cut short and is not counted as a step")
        if self.dropped:
            notes.append(f"CUPTI dropped {self.dropped} activity records (its buffers were full)")
        if self.store.over_cap:
            notes.append(f"{self.store.over_cap} activity records past advisor's cap of {self.store.max_records} "
                         "were not kept; record fewer steps with --steps")
        if self.store.unreadable or self.callback_errors:
            notes.append(f"{self.store.unreadable + self.callback_errors} activity records could not be read")
        if built.outside_window:
            notes.append(f"{built.outside_window} GPU activities launched outside the recorded steps were left out")
        if built.unpaired_markers:
            notes.append(f"{built.unpaired_markers} NVTX range ends had no matching start (or the reverse)")
        if still_open:
            notes.append(f"{still_open} ranges were still open when the run ended and were closed there")
        if overhead_ns:
            parts = ", ".join(f"{name} {ns / 1e6:.2f} ms" for name, ns in sorted(overhead_by_kind.items(), key=lambda kv: -kv[1]))
            notes.append(f"CUPTI and driver overhead recorded: {overhead_ns / 1e6:.2f} ms ({parts})")
        kinds = text(events["kind"])
        gpu_rows = int(np.isin(kinds, ["kernel", "memcpy", "memset"]).sum())
        version = cupti_python_version()
        collector = CollectorInfo(
            name="cupti",
            version=f"cupti-python {version}" if version else "",
            activities=[rec.KIND_NAMES[k] for k in GPU_KINDS + API_KINDS + ALWAYS_KINDS],
            gpu_measured=gpu_rows > 0,
            dropped_records=int(self.dropped + self.store.over_cap),
            overhead_ns=overhead_ns,
            notes=notes,
            cost=self._cost(),
        )
        return CuptiCapture(
            events=events,
            devices=devices,
            collector=collector,
            base_time_ns=self.base_time_ns,
            recorded_steps=list(self.recorded_steps),
            clock_offset_ns=self.clock_offset_ns,
            clock_error_ns=self.clock_error_ns,
        )


def start_collector(torch: Any, *, window: StepWindow | None = StepWindow(),
                    record_ops: bool = True) -> tuple[CuptiCollector | None, str | None]:
    """A started collector, or None and the one-line reason it cannot run."""
    reason = unavailable_reason(torch)
    if reason is not None:
        return None, reason
    api, reason = import_cupti()
    if api is None:
        return None, reason
    collector = CuptiCollector(api, window=window, torch=torch, record_ops=record_ops)
    try:
        collector.start()
    except CollectorUnavailable as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"CUPTI could not start ({_one_line(exc)})"
    return collector, None


def _ranges(numbers: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in runs)


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


__all__ = [
    "CollectorUnavailable", "CuptiCapture", "CuptiCollector", "StepWindow", "import_cupti", "install_hint",
    "not_measured_line", "start_collector", "torch_profiler_active", "unavailable_reason", "version_mismatch",
]
