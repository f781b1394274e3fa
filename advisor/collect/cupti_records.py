"""CUPTI activity records -> rows of the Session events schema, without importing CUPTI.

The built-in GPU collector (advisor.collect.cupti) hands every buffer CUPTI completes to
:meth:`RecordStore.add_all`. That runs inside cupti-python's buffer-completed callback, so
it does the least it can: for each record it copies the plain fields of its kind (ints and
strs) into a tuple and appends it to that kind's list. The record object itself is never
kept: cupti-python's record classes are views into a buffer CUPTI reuses once the callback
returns. :func:`build_events` turns the tuples into an events frame afterwards, off the
hot path, and :func:`devices` and :func:`overhead` read the device and overhead records.

Record attribute names are cupti-python's (``cupti.cupti.ActivityKernel9..13``,
``ActivityMemcpy6/7``, ``ActivityMemcpyPtoP4``, ``ActivityMemset4/5``, ``ActivityAPI``,
``ActivitySynchronization2``, ``ActivityMarker2``, ``ActivityExternalCorrelation``,
``ActivityDevice5/6``, ``ActivityContext3/4``, ``ActivityOverhead3``), read from the type
stubs and compiled getters of cupti-python 12.8.0, 13.0.0 and 13.4.0; they are the same in
all three. Note ``flags_`` (with the underscore) on copies, sets and markers. Where a later
record version renames a field, :data:`SPECS` lists the names to try in order.

Enum values are CUPTI's C values (cupti_activity.h, CUDA 13.0; append-only across
releases). cupti-python's enums carry the same numbers and records hand ``kind`` and the
other enums over as plain ints; :func:`check_enums` compares the two at start-up.

How each kind lands in the events frame (``category`` says where a row came from):

    CONCURRENT_KERNEL, KERNEL  kind "kernel": demangled name, grid/block as "[x,y,z]",
                               registers per thread, shared memory (static + dynamic)
    MEMCPY, MEMCPY2 (PtoP)     kind "memcpy", named as Kineto names copies,
                               "Memcpy HtoD (Pageable -> Device)", so tables treat both
                               sources alike; category "cupti:MEMCPY sync" or "... async"
    MEMSET                     kind "memset", "Memset (Device)"
    SYNCHRONIZATION            kind "sync", Kineto's names ("Stream Sync", "Event Sync",
                               "Context Sync", "Stream Wait Event")
    RUNTIME, DRIVER            kind "runtime" / "driver", named by callback id
    MARKER                     NVTX push/pop and start/end pairs -> kind "annotation"
    EXTERNAL_CORRELATION       not rows: sets ``external_id`` on the API call and the GPU
                               work that share its correlation id
    DEVICE, CONTEXT            not rows: DeviceInfo, and context -> device for sync rows
    OVERHEAD                   not rows: CollectorInfo.overhead_ns and a note
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from advisor.session import DeviceInfo, conform_events, empty_events

# -- CUPTI enums (C values) --------------------------------------------------------------

KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_DRIVER = 4
KIND_RUNTIME = 5
KIND_DEVICE = 8
KIND_CONTEXT = 9
KIND_CONCURRENT_KERNEL = 10
KIND_MARKER = 12
KIND_OVERHEAD = 17
KIND_MEMCPY2 = 22
KIND_SYNCHRONIZATION = 38
KIND_EXTERNAL_CORRELATION = 39

KIND_NAMES = {
    KIND_MEMCPY: "MEMCPY", KIND_MEMSET: "MEMSET", KIND_KERNEL: "KERNEL", KIND_DRIVER: "DRIVER",
    KIND_RUNTIME: "RUNTIME", KIND_DEVICE: "DEVICE", KIND_CONTEXT: "CONTEXT",
    KIND_CONCURRENT_KERNEL: "CONCURRENT_KERNEL", KIND_MARKER: "MARKER", KIND_OVERHEAD: "OVERHEAD",
    KIND_MEMCPY2: "MEMCPY2", KIND_SYNCHRONIZATION: "SYNCHRONIZATION",
    KIND_EXTERNAL_CORRELATION: "EXTERNAL_CORRELATION",
}

# CUpti_ActivityMemcpyKind, spelled as Kineto spells it in copy names.
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD",
              7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
# CUpti_ActivityMemoryKind. Kineto writes "Device Static"; one word here keeps the copy
# name parseable by the Kineto importer's "(\w+) -> (\w+)".
MEMORY_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                6: "DeviceStatic", 7: "ManagedStatic"}
# CUpti_ActivitySynchronizationType, with Kineto's event names.
SYNC_TYPES = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
# CUpti_ActivityOverheadKind.
OVERHEAD_KINDS = {0: "unknown", 1: "driver compiler", 1 << 16: "buffer flush", 2 << 16: "instrumentation",
                  3 << 16: "resource", 4 << 16: "module loading", 5 << 16: "lazy function loading",
                  6 << 16: "command buffer full", 7 << 16: "activity buffer request", 8 << 16: "UVM init"}

FLAG_ASYNC = 1  # CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC == CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC
FLAG_MARKER_INSTANTANEOUS = 1
FLAG_MARKER_START = 2
FLAG_MARKER_END = 4
OBJECT_PROCESS, OBJECT_THREAD = 1, 2
EXTERNAL_KIND_CUSTOM2 = 5  # advisor's own: Kineto pushes CUSTOM0 (ops) and CUSTOM1 (user)
DOMAIN_DRIVER_API, DOMAIN_RUNTIME_API = 1, 2
INVALID_ID = 0xFFFFFFFF  # CUPTI_INVALID_STREAM_ID / _CONTEXT_ID

# Common runtime and driver callback ids (cupti_runtime_cbid.h / cupti_driver_cbid.h,
# CUDA 13.0), for naming API records where cupti.get_callback_name is not at hand (tests,
# recorded streams). With cupti-python present every id is named by CUPTI itself.
RUNTIME_NAMES = {
    10: "cudaGetLastError", 11: "cudaPeekAtLastError", 15: "cudaFuncGetAttributes", 16: "cudaSetDevice",
    17: "cudaGetDevice", 20: "cudaMalloc", 22: "cudaFree", 25: "cudaMallocHost", 26: "cudaFreeHost",
    27: "cudaHostAlloc", 31: "cudaMemcpy", 41: "cudaMemcpyAsync", 44: "cudaMemcpy2DAsync", 49: "cudaMemset",
    51: "cudaMemsetAsync", 131: "cudaStreamSynchronize", 132: "cudaStreamQuery",
    134: "cudaEventCreateWithFlags", 135: "cudaEventRecord", 136: "cudaEventDestroy",
    137: "cudaEventSynchronize", 138: "cudaEventQuery", 147: "cudaStreamWaitEvent",
    151: "cudaPointerGetAttributes", 161: "cudaMemcpyPeerAsync", 165: "cudaDeviceSynchronize",
    200: "cudaDeviceGetAttribute", 207: "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    211: "cudaLaunchKernel", 214: "cudaLaunchKernel_ptsz", 225: "cudaMemcpyAsync_ptsz",
    269: "cudaLaunchCooperativeKernel", 273: "cudaFuncSetAttribute", 311: "cudaGraphLaunch",
    317: "cudaStreamIsCapturing", 324: "cudaStreamGetCaptureInfo", 373: "cudaMallocAsync",
    375: "cudaFreeAsync", 430: "cudaLaunchKernelExC",
}
DRIVER_NAMES = {
    17: "cuCtxSynchronize", 19: "cuModuleLoadData", 23: "cuModuleGetFunction", 119: "cuEventRecord",
    120: "cuEventQuery", 121: "cuEventSynchronize", 125: "cuStreamQuery", 126: "cuStreamSynchronize",
    216: "cuMemsetD8Async", 220: "cuMemsetD32Async", 243: "cuMemAlloc_v2", 245: "cuMemFree_v2",
    276: "cuMemcpyHtoD_v2", 277: "cuMemcpyHtoDAsync_v2", 278: "cuMemcpyDtoH_v2",
    279: "cuMemcpyDtoHAsync_v2", 281: "cuMemcpyDtoDAsync_v2", 295: "cuStreamWaitEvent",
    304: "cuCtxGetCurrent", 305: "cuMemcpy", 306: "cuMemcpyAsync", 307: "cuLaunchKernel",
    477: "cuLaunchCooperativeKernel", 514: "cuGraphLaunch", 598: "cuMemAllocAsync", 600: "cuMemFreeAsync",
    652: "cuLaunchKernelEx", 677: "cuGetProcAddress_v2", 681: "cuLibraryGetKernel", 683: "cuKernelGetFunction",
}
# CUPTI's callback names carry the API version ("cudaLaunchKernel_v7000"); Kineto's do not.
_API_VERSION_SUFFIX = re.compile(r"_v\d+$")


def check_enums(api: Any) -> list[str]:
    """Where cupti-python's enums disagree with the values this module was written
    against (one line each; empty when they agree or the enum is missing)."""
    wanted = {
        ("ActivityKind", name): value for value, name in KIND_NAMES.items()
    }
    wanted[("ExternalCorrelationKind", "CUSTOM2")] = EXTERNAL_KIND_CUSTOM2
    wanted[("ActivityMemcpyKind", "HTOD")] = 1
    wanted[("ActivityMemoryKind", "PINNED")] = 2
    wanted[("ActivitySynchronizationType", "STREAM_SYNCHRONIZE")] = 3
    problems = []
    for (enum_name, member), value in wanted.items():
        enum = getattr(api, enum_name, None)
        actual = getattr(enum, member, None) if enum is not None else None
        if actual is not None and int(actual) != value:
            problems.append(f"cupti.{enum_name}.{member} is {int(actual)}, advisor expects {value}")
    return problems


# The functions of cupti-python's ``cupti.cupti`` the collector calls.
API_FUNCTIONS = ("activity_register_callbacks", "activity_enable", "activity_disable", "activity_flush_all",
                 "activity_get_num_dropped_records", "activity_push_external_correlation_id",
                 "activity_pop_external_correlation_id", "get_timestamp", "set_thread_id_type")
# Record classes per kind: cupti-python has one class per record version
# (ActivityKernel9, ActivityKernel10...); the newest is what its CUPTI hands over.
RECORD_CLASSES = {
    "KERNEL": "ActivityKernel", "CONCURRENT_KERNEL": "ActivityKernel", "MEMCPY": "ActivityMemcpy",
    "MEMCPY2": "ActivityMemcpyPtoP", "MEMSET": "ActivityMemset", "SYNCHRONIZATION": "ActivitySynchronization",
    "RUNTIME": "ActivityAPI", "DRIVER": "ActivityAPI", "MARKER": "ActivityMarker",
    "EXTERNAL_CORRELATION": "ActivityExternalCorrelation", "DEVICE": "ActivityDevice", "CONTEXT": "ActivityContext",
    "OVERHEAD": "ActivityOverhead",
}
# Fields a kind shares with another in SPECS but has not itself: plain copies
# (ActivityMemcpy) carry no device pair, only peer-to-peer ones do.
ABSENT_BY_DESIGN = {"MEMCPY": ("src_device_id", "dst_device_id")}


def record_class(api: Any, kind_name: str) -> type | None:
    """The newest record class cupti-python has for ``kind_name`` (None: none)."""
    prefix = RECORD_CLASSES.get(kind_name)
    if prefix is None:
        return None
    best, best_version = None, -1
    for name in dir(api):
        rest = name[len(prefix):]
        if name.startswith(prefix) and (rest == "" or rest.isdigit()):
            version = int(rest) if rest else 0
            if version > best_version:
                best, best_version = getattr(api, name), version
    return best


def api_problems(api: Any) -> list[str]:
    """Where an installed cupti-python differs from what the collector reads, one line
    each: a function it calls that is missing, an enum member whose value differs, a field
    it copies that the newest record class of its kind lacks. Empty: the collector can use
    this release as written. Needs no GPU: it reads the module, not CUPTI."""
    problems = [f"cupti.{name} is missing" for name in API_FUNCTIONS if not callable(getattr(api, name, None))]
    problems += check_enums(api)
    for enum_name, member in (("ActivityKind", name) for name in KIND_NAMES.values()):
        if getattr(getattr(api, enum_name, None), member, None) is None:
            problems.append(f"cupti.{enum_name}.{member} is missing")
    if getattr(getattr(api, "ActivityThreadIdType", None), "SYSTEM", None) is None:
        problems.append("cupti.ActivityThreadIdType.SYSTEM is missing")
    for kind, spec in SPECS.items():
        kind_name = KIND_NAMES[kind]
        cls = record_class(api, kind_name)
        if cls is None:
            problems.append(f"no record class {RECORD_CLASSES[kind_name]}* for {kind_name}")
            continue
        for field, candidates, _default in spec.fields:
            if field in ABSENT_BY_DESIGN.get(kind_name, ()):
                continue
            if not any(hasattr(cls, candidate.split(".")[0]) for candidate in candidates):
                problems.append(f"{cls.__name__} ({kind_name}) has no {' or '.join(candidates)}")
    return problems


# -- what to copy out of each record ------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """The plain fields copied out of one record kind: (field, names to try, default)."""

    group: str
    fields: tuple[tuple[str, tuple[str, ...], Any], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f[0] for f in self.fields)


def _f(name: str, *alternatives: str, default: Any = -1) -> tuple[str, tuple[str, ...], Any]:
    return (name, (name, *alternatives), default)


_KERNEL = Spec("kernel", (
    _f("name", default=""), _f("start", default=0), _f("end", default=0), _f("device_id"), _f("context_id"),
    _f("stream_id"), _f("correlation_id"), _f("grid_x"), _f("grid_y"), _f("grid_z"), _f("block_x"),
    _f("block_y"), _f("block_z"), _f("registers_per_thread"), _f("static_shared_memory", default=0),
    _f("dynamic_shared_memory", default=0), _f("graph_id", default=0),
))
_MEMCPY = Spec("memcpy", (
    _f("start", default=0), _f("end", default=0), _f("device_id"), _f("context_id"), _f("stream_id"),
    _f("correlation_id"), _f("copy_kind", default=0), _f("src_kind", default=0), _f("dst_kind", default=0),
    _f("bytes"), ("flags", ("flags_", "flags"), 0), _f("src_device_id"), _f("dst_device_id"),
))
_MEMSET = Spec("memset", (
    _f("start", default=0), _f("end", default=0), _f("device_id"), _f("context_id"), _f("stream_id"),
    _f("correlation_id"), _f("bytes"), _f("memory_kind", default=0), ("flags", ("flags_", "flags"), 0),
))
_SYNC = Spec("sync", (
    _f("start", default=0), _f("end", default=0), _f("type", default=0), _f("context_id"), _f("stream_id"),
    _f("correlation_id"), _f("cuda_event_id"),
))
_API = Spec("api", (
    _f("kind"), _f("cbid"), _f("start", default=0), _f("end", default=0), _f("process_id"), _f("thread_id"),
    _f("correlation_id"), _f("return_value", default=0),
))
_MARKER = Spec("marker", (
    _f("id"), ("flags", ("flags_", "flags"), 0), _f("timestamp", default=0), _f("name", default=""),
    _f("domain", default=""), _f("object_kind", default=0),
    ("process_id", ("object_id.pt.process_id",), -1), ("thread_id", ("object_id.pt.thread_id",), -1),
))
_EXTERNAL = Spec("external", (_f("external_kind", default=0), _f("external_id"), _f("correlation_id")))
_DEVICE = Spec("device", (
    _f("id"), _f("name", default=""), _f("num_multiprocessors"), _f("global_memory_bandwidth", default=0),
    _f("global_memory_size", default=0), _f("core_clock_rate", default=0), _f("l2cache_size", default=0),
    _f("compute_capability_major"), _f("compute_capability_minor"), _f("max_threads_per_block"),
    _f("max_shared_memory_per_block"), _f("max_registers_per_block"), _f("num_memcpy_engines"),
    _f("num_threads_per_warp"),
))
_CONTEXT = Spec("context", (_f("context_id"), _f("device_id")))
_OVERHEAD = Spec("overhead", (
    _f("overhead_kind", default=0), _f("start", default=0), _f("end", default=0), _f("correlation_id"),
))

SPECS: dict[int, Spec] = {
    KIND_KERNEL: _KERNEL, KIND_CONCURRENT_KERNEL: _KERNEL, KIND_MEMCPY: _MEMCPY, KIND_MEMCPY2: _MEMCPY,
    KIND_MEMSET: _MEMSET, KIND_SYNCHRONIZATION: _SYNC, KIND_RUNTIME: _API, KIND_DRIVER: _API,
    KIND_MARKER: _MARKER, KIND_EXTERNAL_CORRELATION: _EXTERNAL, KIND_DEVICE: _DEVICE,
    KIND_CONTEXT: _CONTEXT, KIND_OVERHEAD: _OVERHEAD,
}
# Few and small: kept even past the record cap, since without them nothing can be named.
_ALWAYS_KEPT = frozenset({KIND_DEVICE, KIND_CONTEXT, KIND_OVERHEAD})


def _has(record: Any, dotted: str) -> bool:
    try:
        attrgetter(dotted)(record)
        return True
    except AttributeError:
        return False


def _getter(spec: Spec, record: Any) -> Callable[[Any], tuple]:
    """A function copying ``spec``'s fields out of records shaped like ``record``: one
    C-level attrgetter call per record, with absent fields filled by their default."""
    present: list[str] = []
    slots: list[int | None] = []
    defaults: list[Any] = []
    for _name, candidates, default in spec.fields:
        found = next((c for c in candidates if _has(record, c)), None)
        if found is None:
            slots.append(None)
        else:
            slots.append(len(present))
            present.append(found)
        defaults.append(default)
    if not present:
        values = tuple(defaults)
        return lambda _record: values
    get = attrgetter(*present)
    if len(present) == 1:
        single = get
        get = lambda r: (single(r),)
    if all(s is not None for s in slots):
        return get
    layout = tuple(zip(slots, defaults))

    def fill(record: Any) -> tuple:
        values = get(record)
        return tuple(values[s] if s is not None else d for s, d in layout)

    return fill


class RecordStore:
    """Plain copies of the activity records CUPTI delivered, per group of kinds.

    ``max_records`` bounds memory: records past it are counted in ``over_cap``, not kept
    (device, context and overhead records are always kept)."""

    def __init__(self, max_records: int = 4_000_000):
        self.max_records = max_records
        self.rows: dict[str, list[tuple]] = {spec.group: [] for spec in SPECS.values()}
        self.by_kind: Counter[int] = Counter()
        self.ignored: Counter[int] = Counter()
        self.over_cap = 0
        self.unreadable = 0
        self.kept = 0
        self._getters: dict[tuple[type, int], Callable[[Any], tuple]] = {}
        self._lock = threading.Lock()

    def add_all(self, records: Iterable[Any]) -> None:
        """Copy what is needed out of one completed buffer's records (the hot path)."""
        with self._lock:
            rows, getters, by_kind = self.rows, self._getters, self.by_kind
            for record in records:
                try:
                    kind = int(record.kind)
                except (AttributeError, TypeError, ValueError):
                    self.unreadable += 1
                    continue
                spec = SPECS.get(kind)
                if spec is None:
                    self.ignored[kind] += 1
                    continue
                if self.kept >= self.max_records and kind not in _ALWAYS_KEPT:
                    self.over_cap += 1
                    continue
                key = (type(record), kind)
                get = getters.get(key)
                if get is None:
                    get = getters[key] = _getter(spec, record)
                try:
                    rows[spec.group].append(get(record))
                except (AttributeError, TypeError, ValueError):
                    self.unreadable += 1
                    continue
                by_kind[kind] += 1
                self.kept += 1

    def frame(self, group: str) -> pd.DataFrame:
        """One group's copies as a frame (columns named as in its Spec)."""
        spec = next(s for s in SPECS.values() if s.group == group)
        rows = self.rows[group]
        if not rows:
            return pd.DataFrame({name: [] for name in spec.names})
        return pd.DataFrame.from_records(rows, columns=list(spec.names))


# -- names ----------------------------------------------------------------------------------


def api_name(domain: int, cbid: int, lookup: Callable[[int, int], Any] | None = None) -> str:
    """A runtime or driver call's name from its callback id, as Kineto writes it."""
    name = None
    if lookup is not None:
        try:
            name = lookup(domain, cbid)
        except Exception:  # an id this CUPTI does not know: fall back to the table
            name = None
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
    if not name:
        table = RUNTIME_NAMES if domain == DOMAIN_RUNTIME_API else DRIVER_NAMES
        name = table.get(cbid)
    if not name:
        return f"{'cuda' if domain == DOMAIN_RUNTIME_API else 'cu'} API cbid {cbid}"
    return _API_VERSION_SUFFIX.sub("", str(name))


_libstdcxx: Any = None


def demangle(name: str) -> str:
    """A C++ kernel name as Kineto shows it (``void at::native::...``). CUPTI reports
    mangled names; torch demangles with the same ``__cxa_demangle`` used here."""
    global _libstdcxx
    if not name.startswith("_Z"):
        return name
    if _libstdcxx is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.__cxa_demangle.restype = ctypes.c_void_p
            lib.__cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.POINTER(ctypes.c_int)]
            libc.free.argtypes = [ctypes.c_void_p]
            _libstdcxx = (lib, libc)
        except (OSError, AttributeError):
            _libstdcxx = False
    if not _libstdcxx:
        return name
    lib, libc = _libstdcxx
    status = ctypes.c_int(0)
    pointer = lib.__cxa_demangle(name.encode(), None, None, ctypes.byref(status))
    if not pointer or status.value != 0:
        return name
    try:
        return ctypes.string_at(pointer).decode(errors="replace")
    finally:
        libc.free(pointer)


def copy_name(copy_kind: int, src: int, dst: int) -> str:
    return f"Memcpy {COPY_KINDS.get(copy_kind, 'Unknown')} ({MEMORY_KINDS.get(src, 'Unknown')} -> {MEMORY_KINDS.get(dst, 'Unknown')})"


def _per_value(values: pd.Series, func: Callable[[Any], str]) -> np.ndarray:
    """``func`` applied once per distinct value (names repeat a great deal)."""
    codes, uniques = pd.factorize(values, sort=False)
    mapped = np.asarray([func(u) for u in uniques] + [""], dtype=object)
    return mapped[np.where(codes >= 0, codes, len(uniques))]


def _triples(x: pd.Series, y: pd.Series, z: pd.Series) -> np.ndarray:
    text = "[" + x.astype("int64").astype(str) + "," + y.astype("int64").astype(str) + "," + z.astype("int64").astype(str) + "]"
    return text.to_numpy(dtype=object)


def _id(values: pd.Series) -> np.ndarray:
    """CUPTI ids with its 'invalid' sentinel as the schema's -1."""
    out = values.to_numpy(dtype="int64", copy=True)
    out[(out == INVALID_ID) | (out < 0)] = -1
    return out


# -- events frame ---------------------------------------------------------------------------


@dataclass
class Built:
    """What :func:`build_events` made, and what it had to leave out."""

    events: pd.DataFrame
    unpaired_markers: int = 0
    outside_window: int = 0


def _in_flight(frame: pd.DataFrame, launched: np.ndarray, window_open: int) -> np.ndarray:
    """GPU rows launched before the window that it waits behind: unlaunched, ending after
    the window opened, and starting before the first launched row of their stream."""
    start = frame["start"].to_numpy(dtype="int64")
    end = frame["end"].to_numpy(dtype="int64")
    stream = frame["device_id"].astype("int64").to_numpy() * 1_000_003 + frame["stream_id"].astype("int64").to_numpy() \
        if "device_id" in frame.columns else frame["stream_id"].astype("int64").to_numpy()
    first = pd.Series(start[launched]).groupby(stream[launched]).min() if launched.any() else pd.Series(dtype="int64")
    first_here = pd.Series(stream).map(first).fillna(np.iinfo(np.int64).max).to_numpy()
    return ~launched & (end > window_open) & (start < first_here)


def build_events(
    store: RecordStore,
    *,
    to_session_ns: Callable[[np.ndarray], np.ndarray],
    api_lookup: Callable[[int, int], Any] | None = None,
    launched_only: bool = False,
    window_open: int | None = None,
) -> Built:
    """The events frame (Session schema, not yet attributed) from a store's copies.

    ``to_session_ns`` maps CUPTI timestamps to the session's clock (see
    advisor.collect.cupti for the alignment). With ``launched_only``, GPU work whose
    launching call was not recorded is left out: API calls are recorded for exactly the
    steps of the window, so such work was queued by a step outside it (a warm-up step's
    kernels still running when the window opened, or a later step's while the GPU
    kinds drained). Kept all the same: work in flight when the window opened (``window_open``,
    on CUPTI's clock), that is, unlaunched work still running then, or queued ahead of the
    first work the window launched on its stream: the window's first waits wait for it, and
    it is GPU work, not host time or idle.
    """
    frames: list[pd.DataFrame] = []
    external = store.frame("external")
    # One external id per correlation id; advisor's own kind wins where several API
    # layers pushed one for the same call.
    external_of: dict[int, int] = {}
    if len(external):
        ordered = external.assign(mine=external["external_kind"] == EXTERNAL_KIND_CUSTOM2).sort_values("mine")
        external_of = dict(zip(ordered["correlation_id"].astype("int64"), ordered["external_id"].astype("int64")))

    def ext(correlation: pd.Series) -> np.ndarray:
        if not external_of:
            return np.full(len(correlation), -1, dtype="int64")
        return correlation.map(external_of).fillna(-1).to_numpy(dtype="int64")

    def span(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        start = frame["start"].to_numpy(dtype="int64")
        end = np.maximum(frame["end"].to_numpy(dtype="int64"), start)
        return to_session_ns(start), to_session_ns(end)

    api = store.frame("api")
    recorded_calls = set(api["correlation_id"].astype("int64")) if len(api) else set()
    outside = 0

    def in_window(frame: pd.DataFrame) -> pd.DataFrame:
        nonlocal outside
        if not launched_only or not len(frame):
            return frame
        keep = frame["correlation_id"].astype("int64").isin(recorded_calls).to_numpy().copy()
        if window_open is not None and "stream_id" in frame.columns:
            keep |= _in_flight(frame, keep, window_open)
        outside += int((~keep).sum())
        return frame[keep]

    kernels = in_window(store.frame("kernel"))
    if len(kernels):
        start, end = span(kernels)
        device = _id(kernels["device_id"])
        stream = _id(kernels["stream_id"])
        frames.append(pd.DataFrame({
            "name": _per_value(kernels["name"].astype(str), demangle),
            "kind": "kernel", "category": "cupti:CONCURRENT_KERNEL",
            "start_ns": start, "end_ns": end, "pid": device, "tid": stream, "device": device, "stream": stream,
            "correlation": kernels["correlation_id"].to_numpy(dtype="int64"),
            "external_id": ext(kernels["correlation_id"]),
            "grid": _triples(kernels["grid_x"], kernels["grid_y"], kernels["grid_z"]),
            "block": _triples(kernels["block_x"], kernels["block_y"], kernels["block_z"]),
            "registers": kernels["registers_per_thread"].to_numpy(dtype="int64"),
            "shared_memory": (kernels["static_shared_memory"].astype("int64")
                              + kernels["dynamic_shared_memory"].astype("int64")).to_numpy(),
        }))

    copies = in_window(store.frame("memcpy"))
    if len(copies):
        start, end = span(copies)
        device = _id(copies["device_id"])
        stream = _id(copies["stream_id"])
        kinds = copies["copy_kind"].astype("int64")
        src = copies["src_kind"].astype("int64")
        dst = copies["dst_kind"].astype("int64")
        is_async = (copies["flags"].astype("int64") & FLAG_ASYNC) != 0
        frames.append(pd.DataFrame({
            "name": [copy_name(k, s, d) for k, s, d in zip(kinds, src, dst)],
            "kind": "memcpy",
            "category": np.where(is_async, "cupti:MEMCPY async", "cupti:MEMCPY sync"),
            "start_ns": start, "end_ns": end, "pid": device, "tid": stream, "device": device, "stream": stream,
            "correlation": copies["correlation_id"].to_numpy(dtype="int64"),
            "external_id": ext(copies["correlation_id"]),
            "bytes": copies["bytes"].to_numpy(dtype="int64"),
            "copy_kind": kinds.map(COPY_KINDS).fillna("Unknown").to_numpy(dtype=object),
            "src_memory": src.map(MEMORY_KINDS).fillna("Unknown").to_numpy(dtype=object),
            "dst_memory": dst.map(MEMORY_KINDS).fillna("Unknown").to_numpy(dtype=object),
        }))

    sets = in_window(store.frame("memset"))
    if len(sets):
        start, end = span(sets)
        device = _id(sets["device_id"])
        stream = _id(sets["stream_id"])
        is_async = (sets["flags"].astype("int64") & FLAG_ASYNC) != 0
        frames.append(pd.DataFrame({
            "name": [f"Memset ({MEMORY_KINDS.get(int(k), 'Unknown')})" for k in sets["memory_kind"]],
            "kind": "memset",
            "category": np.where(is_async, "cupti:MEMSET async", "cupti:MEMSET sync"),
            "start_ns": start, "end_ns": end, "pid": device, "tid": stream, "device": device, "stream": stream,
            "correlation": sets["correlation_id"].to_numpy(dtype="int64"),
            "external_id": ext(sets["correlation_id"]),
            "bytes": sets["bytes"].to_numpy(dtype="int64"),
        }))

    syncs = in_window(store.frame("sync"))
    if len(syncs):
        contexts = store.frame("context")
        device_of = dict(zip(contexts["context_id"].astype("int64"), contexts["device_id"].astype("int64")))
        start, end = span(syncs)
        device = syncs["context_id"].astype("int64").map(device_of).fillna(-1).to_numpy(dtype="int64")
        stream = _id(syncs["stream_id"])
        frames.append(pd.DataFrame({
            "name": syncs["type"].astype("int64").map(SYNC_TYPES).fillna("Unknown Sync").to_numpy(dtype=object),
            "kind": "sync", "category": "cupti:SYNCHRONIZATION",
            "start_ns": start, "end_ns": end, "pid": device, "tid": stream, "device": device, "stream": stream,
            "correlation": syncs["correlation_id"].to_numpy(dtype="int64"),
            "external_id": ext(syncs["correlation_id"]),
        }))

    if len(api):
        start, end = span(api)
        is_runtime = api["kind"].astype("int64").to_numpy() == KIND_RUNTIME
        domain = np.where(is_runtime, DOMAIN_RUNTIME_API, DOMAIN_DRIVER_API)
        keys = pd.Series(domain * (1 << 32) + api["cbid"].astype("int64").to_numpy())
        names = _per_value(keys, lambda key: api_name(int(key) >> 32, int(key) & 0xFFFFFFFF, api_lookup))
        frames.append(pd.DataFrame({
            "name": names,
            "kind": np.where(is_runtime, "runtime", "driver"),
            "category": np.where(is_runtime, "cupti:RUNTIME", "cupti:DRIVER"),
            "start_ns": start, "end_ns": end,
            "pid": api["process_id"].to_numpy(dtype="int64"), "tid": api["thread_id"].to_numpy(dtype="int64"),
            "correlation": api["correlation_id"].to_numpy(dtype="int64"),
            "external_id": ext(api["correlation_id"]),
        }))

    markers, unpaired = _marker_ranges(store.frame("marker"), to_session_ns)
    if len(markers):
        frames.append(markers)

    events = conform_events(pd.concat(frames, ignore_index=True)) if frames else empty_events()
    return Built(events=events, unpaired_markers=unpaired, outside_window=outside)


def _marker_ranges(markers: pd.DataFrame, to_session_ns: Callable[[np.ndarray], np.ndarray]) -> tuple[pd.DataFrame, int]:
    """NVTX ranges from marker records: a start record (name, thread) and an end record
    share an id (push/pop and start/end alike); instantaneous marks are zero-length."""
    if not len(markers):
        return pd.DataFrame(), 0
    flags = markers["flags"].astype("int64")
    starts = markers[(flags & FLAG_MARKER_START) != 0]
    ends = markers[(flags & FLAG_MARKER_END) != 0].drop_duplicates("id", keep="first")
    marks = markers[((flags & FLAG_MARKER_INSTANTANEOUS) != 0) & ((flags & (FLAG_MARKER_START | FLAG_MARKER_END)) == 0)]
    end_of = dict(zip(ends["id"].astype("int64"), ends["timestamp"].astype("int64")))
    matched = starts["id"].astype("int64").isin(end_of.keys())
    unpaired = int((~matched).sum()) + int((~ends["id"].astype("int64").isin(set(starts["id"].astype("int64")))).sum())
    starts = starts[matched.to_numpy()]
    rows = pd.concat([
        starts.assign(end=starts["id"].astype("int64").map(end_of)),
        marks.assign(end=marks["timestamp"]),
    ], ignore_index=True)
    if not len(rows):
        return pd.DataFrame(), unpaired
    start = rows["timestamp"].to_numpy(dtype="int64")
    end = np.maximum(rows["end"].to_numpy(dtype="int64"), start)
    domain = rows["domain"].fillna("").astype(str)
    return pd.DataFrame({
        "name": rows["name"].fillna("").astype(str).to_numpy(dtype=object),
        "kind": "annotation",
        "category": np.where(domain != "", "cupti:MARKER " + domain, "cupti:MARKER"),
        "start_ns": to_session_ns(start), "end_ns": to_session_ns(end),
        "pid": rows["process_id"].to_numpy(dtype="int64"), "tid": rows["thread_id"].to_numpy(dtype="int64"),
    }), unpaired


# -- devices and overhead ---------------------------------------------------------------------


def devices(store: RecordStore) -> list[DeviceInfo]:
    """One DeviceInfo per CUPTI device record (the last record of a device wins)."""
    frame = store.frame("device")
    out: dict[int, DeviceInfo] = {}
    for row in frame.itertuples(index=False):
        raw = {k: (v.item() if hasattr(v, "item") else v) for k, v in row._asdict().items()}
        major, minor = raw["compute_capability_major"], raw["compute_capability_minor"]
        bandwidth_kbs = int(raw["global_memory_bandwidth"] or 0)
        out[int(raw["id"])] = DeviceInfo(
            id=int(raw["id"]),
            kind="gpu",
            name=str(raw["name"]),
            compute_capability=f"{major}.{minor}" if major is not None and major >= 0 else None,
            sm_count=int(raw["num_multiprocessors"]) if raw["num_multiprocessors"] >= 0 else None,
            total_memory_bytes=int(raw["global_memory_size"]) or None,
            # CUPTI gives kBytes/s; the schema's GB/s are 10^9 bytes per second.
            memory_bandwidth_gbps=bandwidth_kbs * 1e3 / 1e9 if bandwidth_kbs else None,
            clock_mhz=int(raw["core_clock_rate"]) / 1e3 if raw["core_clock_rate"] else None,  # kHz
            l2_bytes=int(raw["l2cache_size"]) or None,
            properties={"source": "cupti device record", **raw},
        )
    return [out[k] for k in sorted(out)]


def device_from_torch(index: int, props: Any) -> DeviceInfo:
    """A DeviceInfo from ``torch.cuda.get_device_properties(index)``, for a device whose
    CUPTI record did not arrive (CUPTI writes device records when a context is created,
    which may have happened before collection started). Peak memory bandwidth is
    2 x memory clock x bus width (double data rate), where torch reports both."""
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None
    raw = {k: getattr(props, k) for k in ("name", "major", "minor", "multi_processor_count", "total_memory",
                                          "L2_cache_size", "memory_clock_rate", "memory_bus_width",
                                          "clock_rate") if hasattr(props, k)}
    core_khz = raw.get("clock_rate")
    return DeviceInfo(
        id=index,
        kind="gpu",
        name=str(raw.get("name", f"GPU {index}")),
        compute_capability=f"{raw['major']}.{raw['minor']}" if "major" in raw else None,
        sm_count=raw.get("multi_processor_count"),
        total_memory_bytes=raw.get("total_memory"),
        memory_bandwidth_gbps=bandwidth,
        clock_mhz=core_khz / 1e3 if core_khz else None,
        l2_bytes=raw.get("L2_cache_size") or None,
        properties={"source": "torch.cuda.get_device_properties", **{k: json.loads(json.dumps(v, default=str)) for k, v in raw.items()}},
    )


def overhead(store: RecordStore) -> tuple[int, dict[str, int]]:
    """Total CUPTI and driver overhead in ns, and the same per overhead kind."""
    frame = store.frame("overhead")
    if not len(frame):
        return 0, {}
    length = (frame["end"].astype("int64") - frame["start"].astype("int64")).clip(lower=0)
    names = frame["overhead_kind"].astype("int64").map(OVERHEAD_KINDS).fillna("other")
    per_kind = length.groupby(names).sum()
    return int(length.sum()), {str(k): int(v) for k, v in per_kind.items()}
