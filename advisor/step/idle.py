"""Where the step's time goes: the GPU's idle time as a partition, each nanosecond given
exactly one cause.

On a GPU run, the steady window's time is the GPU's busy time (any kernel, copy or set on
any device) plus its idle time, and every idle nanosecond gets the first cause that covers
it, in this order:

    work queued         the device held work already launched that it did not start: it
                        waited on another stream, an event, a peer or work the profile
                        does not hold (whatever the host did meanwhile)
    blocking sync       the host was blocked on the device (a synchronize, a synchronous
                        or pageable copy, .item()/.cpu())
    data loading        the host was in a Dataloader phase
    communication       the host was in a collective (c10d, NCCL, gloo ranges)
    launch calls        the host was inside the runtime calls that launch work
    host in model       the host was inside the model (its forward, backward, optimizer
                        phases, or a module's call): operators, Python between them
    host outside model  the host was in an operator, a range or Python outside the model
                        (preprocessing, logging, the loop's own code)
    unrecorded          the host was in nothing the profile records

so the causes sum to the idle time. The profile's time outside the window is "set apart"
(start-up, compilation, capture, work in flight, start-up steps) or "outside window".

On a CPU run (no GPU measured) the same partition is of the window's time: "model" (the
host in the model) comes first, then the other host causes.

``host_frames`` breaks the time of the host causes down by the Python function or range
the main thread was in, innermost first, each nanosecond once: nested frames are clipped
to their parents, so a frame's time is its own and the rows sum to the cause's time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, one_of, text
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches, parents_of_sorted
from advisor.step.facts import MODEL_PHASES, Facts, user_frame
from advisor.step.waits import blocking_calls
from advisor.step.window import SteadyWindow

__all__ = [
    "GPU_CAUSES",
    "HOST_CAUSES",
    "LAUNCH_LATENCY_NS",
    "NOTHING",
    "OUTSIDE",
    "Partition",
    "host_frames",
    "launch_calls",
    "model_ranges",
    "partition",
    "queued_work",
]

GPU_CAUSES = ("work queued", "blocking sync", "data loading", "communication", "launch calls", "host in model",
              "host outside model", "unrecorded")
HOST_CAUSES = ("host in model", "host outside model", "model")
OUTSIDE = ("set apart", "outside window")
NOTHING = "(no recorded range)"

# A kernel starts a few microseconds after its launch call returns even on an idle GPU:
# waiting longer than this with the launch done is waiting on the device, not the host.
LAUNCH_LATENCY_NS = 10_000

# Ranges that are the model running though no phase says so (an inference trace): a
# module's call, a compiled region, a CUDA graph's replay.
_MODEL_RANGE = re.compile(r"^nn\.Module: |^Torch-Compiled Region|^CompiledFunction|^## Call CompiledFxGraph"
                          r"|^CUDAGraphNode|torch/nn/modules/module\.py\(\d+\): _call_impl$")


@dataclass(frozen=True)
class Partition:
    """The window's time by cause (see the module docstring)."""

    on_gpu: bool
    window: tuple[int, int]
    steps: int  # the steady steps the window holds (1 where it has none)
    busy: iv.Intervals  # GPU busy (GPU run) or the host in the model (CPU run), in the window
    causes: dict[str, iv.Intervals]  # each cause's time in the window, disjoint
    outside: dict[str, iv.Intervals] = field(default_factory=dict)  # the profile's time outside the window
    # Steps set apart inside the window (a warm-up between steady steps, a capture), busy
    # or not: neither a cause nor the steady busy time. With busy and the causes it makes
    # the window.
    apart: iv.Intervals = iv.EMPTY

    @property
    def window_ns(self) -> int:
        return max(self.window[1] - self.window[0], 0)

    @property
    def idle_ns(self) -> int:
        """The GPU's idle time in the window (a CPU run: the time outside the model)."""
        return sum(c.length for name, c in self.causes.items() if name != "model")

    def ns(self, cause: str) -> int:
        spans = self.causes.get(cause, self.outside.get(cause))
        return spans.length if spans is not None else 0

    def per_step(self, cause: str) -> float:
        return self.ns(cause) / max(self.steps, 1)


def queued_work(f: Facts) -> iv.Intervals:
    """When GPU work had been launched (its call returned, plus the launch latency) but had
    not started: the device held work it did not run, whatever the host did meanwhile."""
    gpu = f.gpu
    launch = gpu["launch"].to_numpy()
    known = launch >= 0
    if not known.any():
        return iv.EMPTY
    returned = f.events["end_ns"].to_numpy()[launch[known]] + LAUNCH_LATENCY_NS
    return iv.union((returned, gpu["start_ns"].to_numpy()[known]))


def launch_calls(f: Facts) -> np.ndarray:
    """Row ids of the host calls that launched GPU work, blocking ones left out (they are
    waits)."""
    def compute() -> np.ndarray:
        launch = f.gpu["launch"].to_numpy()
        rows = iv.distinct(launch[launch >= 0])
        return rows[~np.isin(rows, blocking_calls(f)["row"].to_numpy())]

    return f.memo("launch_calls", compute)


def model_ranges(f: Facts) -> iv.Intervals:
    """When the loop's host was in the model: its forward, backward and optimizer phases,
    and (where no phase says so) a module's call, a compiled region or a graph's replay."""
    def compute() -> iv.Intervals:
        phases = f.phases
        in_phase = phases[np.isin(phases["phase_name"].to_numpy(), MODEL_PHASES)]
        ranges = _main_ranges(f)
        modules = ranges[name_matches(ranges["name"], _MODEL_RANGE)] if len(ranges) else ranges
        return iv.union(iv.as_intervals(
            np.concatenate([in_phase["start_ns"].to_numpy(), modules["start_ns"].to_numpy()]),
            np.concatenate([in_phase["end_ns"].to_numpy(), modules["end_ns"].to_numpy()])))

    return f.memo("model_ranges", compute)


def _main_ranges(f: Facts) -> pd.DataFrame:
    """Python frames, user ranges and operators on the thread that runs the loop, by start
    (outer first): what the host was doing, as recorded."""
    def compute() -> pd.DataFrame:
        ev = f.events
        main = f.main_thread
        if main is None:
            return ev.iloc[0:0][["name", "kind", "start_ns", "end_ns"]]
        pid, tid = main
        mine = (ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid) \
            & one_of(ev["kind"], ("python", "annotation", "op", "phase"))
        rows = np.flatnonzero(mine)
        start = ev["start_ns"].to_numpy()[rows]
        end = ev["end_ns"].to_numpy()[rows]
        order = np.lexsort((-end, start))
        rows = rows[order]
        return pd.DataFrame({"name": ev["name"].to_numpy()[rows], "kind": ev["kind"].to_numpy()[rows],
                             "start_ns": start[order], "end_ns": end[order], "row": rows})

    return f.memo("main_ranges", compute)


def _host_recorded(f: Facts) -> iv.Intervals:
    """When the loop's process had its host in something recorded: an operator or runtime
    call on any of its threads (autograd runs backward on its own), a Python frame or user
    range on the loop's thread."""
    ev = f.events
    main = f.main_thread
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    if main is None:
        mask = one_of(ev["kind"], ("op", "runtime", "driver"))
    else:
        pid, tid = main
        same = ev["pid"].to_numpy() == pid
        mask = same & one_of(ev["kind"], ("op", "runtime", "driver"))
        mask |= same & (ev["tid"].to_numpy() == tid) & one_of(ev["kind"], ("python", "annotation"))
    return f.union_in_window((start[mask], end[mask]))


def partition(f: Facts, window: SteadyWindow) -> Partition:
    """The window's time by cause (see the module docstring); ``window`` says what lies
    outside it."""
    lo, hi = f.window
    whole = iv.Intervals(np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)) if hi > lo else iv.EMPTY
    # A step set apart inside the window (a second call spent compiling, a warm-up between
    # steady steps) is not the steady steps' time: booked as set apart, not to a cause.
    apart_inside = iv.intersect(whole, iv.union((np.array([s.start_ns for s in window.set_apart], dtype=np.int64),
                                                 np.array([s.end_ns for s in window.set_apart], dtype=np.int64))))
    whole = iv.subtract(whole, apart_inside)
    steps = max(len(f.steps), 1)
    phases = f.phases
    loading = iv.as_intervals(phases[phases["phase_name"].to_numpy() == "Dataloader"])
    waits = iv.as_intervals(blocking_calls(f))
    comm = iv.as_intervals(f.comm_host)
    model = model_ranges(f)
    recorded = _host_recorded(f)
    on_gpu = bool(f.gpu_measured and one_of(f.events["kind"], GPU_KINDS).any())
    causes: dict[str, iv.Intervals] = {}
    if on_gpu:
        busy = iv.intersect(whole, f.busy(*GPU_KINDS))
        remaining = iv.subtract(whole, busy)
        ev = f.events
        launches = launch_calls(f)
        launching = iv.as_intervals(ev["start_ns"].to_numpy()[launches], ev["end_ns"].to_numpy()[launches])
        order = (("work queued", queued_work(f)), ("blocking sync", waits), ("data loading", loading),
                 ("communication", comm), ("launch calls", launching), ("host in model", model),
                 ("host outside model", recorded))
    else:
        busy = iv.intersect(whole, model)
        remaining = whole
        order = (("model", model), ("blocking sync", waits), ("data loading", loading), ("communication", comm),
                 ("host outside model", recorded))
    for name, spans in order:
        spans = iv.union(spans)
        causes[name] = iv.intersect(remaining, spans)
        remaining = iv.subtract(remaining, spans)
    causes["unrecorded"] = remaining
    outside = _outside(f, window, on_gpu)
    if apart_inside.length:
        inside = iv.subtract(apart_inside, f.busy(*GPU_KINDS)) if on_gpu else apart_inside
        before = outside.get("set apart", iv.EMPTY)
        outside["set apart"] = iv.union((np.concatenate([before.starts, inside.starts]),
                                         np.concatenate([before.ends, inside.ends])))
    return Partition(on_gpu, (lo, hi), steps, busy, causes, outside, apart_inside)


def _outside(f: Facts, window: SteadyWindow, on_gpu: bool) -> dict[str, iv.Intervals]:
    """The profile's idle (or, on a CPU run, all its) time outside the window: in the spans
    set apart, or elsewhere."""
    ev = f.events
    measured = ~one_of(ev["kind"], ("sample", "stack"))
    if not measured.any():
        return {}
    start, end = ev["start_ns"].to_numpy()[measured], ev["end_ns"].to_numpy()[measured]
    span_lo, span_hi = int(start.min()), int(end.max())
    lo, hi = f.window
    outside = iv.subtract(([span_lo], [span_hi]), ([lo], [hi]))
    if on_gpu:
        gpu = one_of(ev["kind"], GPU_KINDS)
        outside = iv.subtract(outside, iv.union((ev["start_ns"].to_numpy()[gpu], ev["end_ns"].to_numpy()[gpu])))
    apart = iv.union((np.array([s.start_ns for s in window.set_apart], dtype=np.int64),
                      np.array([s.end_ns for s in window.set_apart], dtype=np.int64)))
    return {"set apart": iv.intersect(outside, apart), "outside window": iv.subtract(outside, apart)}


_USER_COLUMNS = ("user_line", "user_function", "outer_line", "outer_function")


class _HostRanges(NamedTuple):
    """The loop thread's ranges as host_frames reads them, worked out once per session:
    each range's name, kind, start, end (clipped to its parent's), parent and user lines."""

    names: np.ndarray
    kinds: np.ndarray
    start: np.ndarray
    end: np.ndarray
    parents: np.ndarray
    user: dict[str, np.ndarray]


def _host_ranges(f: Facts) -> _HostRanges | None:
    def compute() -> _HostRanges | None:
        ranges = _main_ranges(f)
        ranges = ranges[ranges["kind"].astype(str).to_numpy() != "phase"].reset_index(drop=True)
        if not len(ranges):
            return None
        start = ranges["start_ns"].to_numpy()
        end = ranges["end_ns"].to_numpy().copy()
        parents = parents_of_sorted(start, end)
        has = parents >= 0
        # A range that outlives its parent (a user range begun inside one Python frame and
        # ended in another) is cut at its parent's end, so ranges nest and no time counts twice.
        for _ in range(512):
            clipped = np.where(has, np.minimum(end, end[np.maximum(parents, 0)]), end)
            if np.array_equal(clipped, end):
                break
            end = clipped
        names = text(pd.Series(ranges["name"]).astype("category"))
        kinds = ranges["kind"].astype(str).to_numpy()
        user, outer = _user_lines(names, kinds, parents)
        lines = {"user_line": [u[0] for u in user], "user_function": [u[1] for u in user],
                 "outer_line": [o[0] for o in outer], "outer_function": [o[1] for o in outer]}
        return _HostRanges(names, kinds, start, np.maximum(end, start), parents,
                           {column: np.asarray(values, dtype=object) for column, values in lines.items()})

    return f.memo("host_ranges", compute)


def host_frames(f: Facts, within: iv.Intervals) -> pd.DataFrame:
    """The time of ``within`` by the innermost Python frame, user range or operator the
    loop's thread was in, each nanosecond once: one row per range with ``ns`` its own time
    (its children's taken off, children clipped to their parent), ``name``, ``kind``, the
    innermost enclosing frame of the user's own code (``user_line``, "file:line") and the
    outermost one (``outer_line``, ``outer_function``). Time in no range is the row
    NOTHING."""
    ranges = _host_ranges(f)
    total = within.length
    if ranges is None or not total:
        rows = 1 if total else 0
        return pd.DataFrame({"name": [NOTHING] * rows, "kind": ["none"] * rows, "ns": [total] * rows,
                             **{column: [""] * rows for column in _USER_COLUMNS}})
    parents = ranges.parents
    has = parents >= 0
    inclusive = (iv.covered_before(within, ranges.end) - iv.covered_before(within, ranges.start)).astype(np.int64)
    children = np.zeros(len(parents), dtype=np.int64)
    np.add.at(children, parents[has], inclusive[has])
    own = np.maximum(inclusive - children, 0)
    kept = own > 0
    top = parents < 0
    uncovered = total - int(inclusive[top].sum())
    # Object columns, as made: pandas would otherwise copy each into an Arrow string array, a
    # string at a time, for a frame that is grouped and dropped.
    texts = {"name": ranges.names[kept], "kind": ranges.kinds[kept],
             **{column: values[kept] for column, values in ranges.user.items()}}
    ns = own[kept]
    if uncovered > 0:
        texts = {column: np.append(values, NOTHING if column == "name" else "none" if column == "kind" else "")
                 for column, values in texts.items()}
        ns = np.append(ns, uncovered)
    return pd.DataFrame({**{column: pd.Series(values, dtype=object) for column, values in texts.items()}, "ns": ns},
                        columns=["name", "kind", "ns", *_USER_COLUMNS])


_FRAME = re.compile(r"^\s*(?P<file>.+?)\((?P<line>\d+)\): (?P<function>.*)$")


def _user_lines(names: np.ndarray, kinds: np.ndarray, parents: np.ndarray
                ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Per range: the innermost enclosing Python frame of the user's code (itself
    included) and the outermost one, each as ("file:line", function)."""
    own = np.array([user_frame(n) if k == "python" else "" for n, k in zip(names, kinds)], dtype=object)
    function = np.array([(m["function"] if (m := _FRAME.match(n)) else "") if o else ""
                         for n, o in zip(names, own)], dtype=object)
    inner: list[tuple[str, str]] = [(o, f) if o else ("", "") for o, f in zip(own, function)]
    outer: list[tuple[str, str]] = [("", "")] * len(own)
    for i in range(len(own)):  # parents come before children in start order
        p = parents[i]
        if not inner[i][0] and p >= 0:
            inner[i] = inner[p]
        if p >= 0 and outer[p][0]:
            outer[i] = outer[p]
        elif own[i]:
            outer[i] = (own[i], function[i])
    return inner, outer
