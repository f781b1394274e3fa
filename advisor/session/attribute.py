"""Tie events together: who launched each GPU event, which op, step and phase it belongs to.

Every collector and importer hands its events here once, so all sources get the same
relations (see advisor.session for the columns):

- ``launch``: the runtime/driver call with the GPU event's correlation id.
- ``parent_op``: the op whose External id the event carries (Kineto links runtime calls
  and kernels to the innermost op that way); failing that, the innermost op on the same
  thread whose time range contains the event.
- ``top_op``: the outermost op around it. On one thread ops nest properly, so an op is
  outermost exactly when no earlier op on the thread ends after it starts; that test is a
  running maximum, vectorised, with no per-event Python.
- ``step`` and ``phase``: host events by time (steps and phase ranges are disjoint per
  process); GPU events inherit both from the call that launched them, because work
  queued in step N belongs to step N even when it runs later.

Traces from other profilers carry steps (ProfilerStep#N) but no phases, so phases are
inferred per step from what the trace does say: ``enumerate(DataLoader)...`` ranges are
Dataloader, ``Optimizer.step#`` / ``Optimizer.zero_grad#`` ranges are Optimization, the span
of autograd ops (``...Backward...``, ``autograd::engine::evaluate_function``) is Backward,
and the time from the end of data loading to the start of backward is Forward (where the
trace records the model's own calls, ``nn.Module: ...`` Python frames, those calls). The
inferred ranges are added as rows of kind ``phase`` with category ``advisor-inferred``.
"""

from __future__ import annotations

import heapq
import re
from typing import Any

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, PHASES, concat_events, conform_events, one_of, text
from advisor.session.calls import HOST_BLOCKING_PREFIXES
from advisor.session.session import start_order, take_rows

STEP_NAME = re.compile(r"^ProfilerStep#([0-9]{1,18})$")  # more digits: no int64, not a step
ADVISOR_PHASE = re.compile(r"^advisor::(Dataloader|Forward|Backward|Optimization)$")
# advisor's host collector wraps each host-blocking call (.item(), .cpu()...) in a range
# named for the call and the line that made it, in Kineto's call-stack spelling.
SYNC_RANGE = re.compile(r"^advisor::sync (?P<call>.+?) @ (?P<frame>.+\(\d+\): .*)$")
# record_function ranges that the 2021 schema files under "Operator" but that are
# annotations, not operators.
ANNOTATION_PREFIXES = ("enumerate(DataLoader)", "Optimizer.step#", "Optimizer.zero_grad#")
_BACKWARD_OP = re.compile(r"Backward|^autograd::engine::evaluate_function")
_MODULE_CALL = re.compile(r"^nn\.Module: ")
SOURCE_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::to", "aten::copy_", "aten::cpu", "aten::tolist")


def name_matches(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Boolean mask of rows whose (categorical) name matches ``pattern``; the regex runs
    once per distinct name, not once per row."""
    return _names_where(names, lambda n: bool(pattern.search(n)))


def _names_where(names: pd.Series, predicate) -> np.ndarray:
    """Boolean mask of rows whose name satisfies ``predicate``, judged once per distinct name."""
    results, at = _per_category(names, predicate, dtype=bool)
    return results[at]


def _per_category(column: pd.Series, func, dtype: Any = object) -> tuple[np.ndarray, np.ndarray]:
    """``func`` of each distinct value of a categorical column (the last slot for a missing
    value, read as ""), and each row's position in those results: index the results with
    the positions, or with a subset of them, rather than building a value per row."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype("category")
    results = np.asarray([func(str(c)) for c in column.cat.categories] + [func("")], dtype=dtype)
    codes = column.cat.codes.to_numpy()
    return results, np.where(codes >= 0, codes, len(results) - 1)


class _Labels:
    """A categorical column as integer codes and their labels, relabelled row by row
    without a string per row (``text`` and a Categorical made from a million strings take
    a tenth of a second each), then made a categorical again."""

    def __init__(self, column: pd.Series):
        self.labels: list[str] = []
        self._code: dict[str, int] = {}
        positions = np.array([self.code(str(c)) for c in column.cat.categories] + [self.code("")], dtype=np.int32)
        codes = column.cat.codes.to_numpy()
        self.codes = positions[np.where(codes >= 0, codes, len(positions) - 1)]

    def code(self, label: str) -> int:
        if label not in self._code:
            self._code[label] = len(self.labels)
            self.labels.append(label)
        return self._code[label]

    def mask(self, *labels: str) -> np.ndarray:
        wanted = [self._code[label] for label in labels if label in self._code]
        return np.isin(self.codes, wanted)

    def relabel(self, rows: np.ndarray, labels: np.ndarray) -> None:
        """Give ``rows`` the labels in ``labels`` (an object array, one per row)."""
        distinct, inverse = np.unique(labels.astype(str), return_inverse=True) if len(labels) else ([], [])
        self.codes[rows] = np.array([self.code(label) for label in distinct], dtype=np.int32)[inverse]

    def categorical(self, *, always: tuple[str, ...] = ()) -> pd.Categorical:
        """The labels as a categorical whose categories are the labels used and those in
        ``always``, sorted (what pd.Categorical makes of the same strings)."""
        used = np.flatnonzero(np.bincount(self.codes, minlength=len(self.labels)))
        categories = sorted({self.labels[i] for i in used} | set(always))
        position = {label: i for i, label in enumerate(categories)}
        remap = np.array([position.get(label, -1) for label in self.labels], dtype=np.int32)
        return pd.Categorical.from_codes(remap[self.codes], categories=categories)


def classify_names(events: pd.DataFrame) -> pd.DataFrame:
    """Re-kind rows by name: steps, advisor's phase ranges, and old-schema annotations."""
    kind = _Labels(events["kind"])
    host_range = kind.mask("op", "annotation")

    def step_number(name: str) -> int:
        match = STEP_NAME.match(name)
        return int(match.group(1)) if match else -1

    def phase_name(name: str):
        match = ADVISOR_PHASE.match(name)
        return match.group(1) if match else None

    step_of, name_at = _per_category(events["name"], step_number, dtype="int64")
    is_step = host_range & (step_of[name_at] >= 0)
    kind.codes[is_step] = kind.code("step")
    step = events["step"].to_numpy(copy=True)
    step[is_step] = step_of[name_at[is_step]]

    phase_of, _ = _per_category(events["name"], phase_name)
    is_phase = host_range & np.not_equal(phase_of, None)[name_at]
    kind.codes[is_phase] = kind.code("phase")
    phase = _Labels(events["phase"])
    if is_phase.any():
        phase.relabel(np.flatnonzero(is_phase), phase_of[name_at[is_phase]])

    starts_annotation, _ = _per_category(events["name"], lambda n: n.startswith(ANNOTATION_PREFIXES), dtype=bool)
    is_annotation = starts_annotation[name_at] & kind.mask("op")
    kind.codes[is_annotation] = kind.code("annotation")
    out = events.copy(deep=False)  # copy-on-write: the new columns are this frame's alone
    out["kind"] = kind.categorical()
    out["step"] = step
    out["phase"] = phase.categorical()
    return out


def _innermost_containing(op_starts: np.ndarray, op_ends: np.ndarray, op_ids: np.ndarray,
                          parents: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Innermost op containing each point, for ops of one thread sorted by start.

    The latest op starting at or before the point either contains it or has ended; in
    the second case its ancestors are tried, walking up ``parents`` (positions): all the
    points at once, a level of nesting a round.
    """
    found = np.searchsorted(op_starts, points, side="right") - 1
    todo = np.flatnonzero(found >= 0)
    while len(todo):
        at = found[todo]
        ended = op_ends[at] < points[todo]
        todo = todo[ended]
        found[todo] = parents[at[ended]]
        todo = todo[found[todo] >= 0]
    return np.where(found >= 0, op_ids[np.maximum(found, 0)], -1) if len(found) else np.full(0, -1, dtype="int64")


def parents_of_sorted(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position of each interval's innermost enclosing interval (-1 for none), for
    intervals sorted by start, outer first.

    That is what a stack walk gives (pop the top while it has ended, a zero-length
    interval at this very start not counting as ended): the latest earlier interval that
    is still open at this start. Found for all at once by pointer jumping: each interval's
    candidate starts as the one before it; a candidate that has ended is replaced by its
    own candidate, since whatever it skipped ended before it started, so before this one.
    A few rounds (about log2 of the longest run of closed intervals), each over the
    intervals still looking.
    """
    n = len(starts)
    zero = starts == ends
    candidate = np.arange(-1, n - 1, dtype="int64")
    todo = np.arange(1, n, dtype="int64")
    while len(todo):
        c = candidate[todo]
        open_ = (ends[c] > starts[todo]) | ((ends[c] == starts[todo]) & zero[c])
        todo = todo[~open_]
        candidate[todo] = candidate[candidate[todo]]
        todo = todo[candidate[todo] >= 0]
    return candidate


def _link_ops(ev: pd.DataFrame) -> None:
    """Fill parent_op and top_op for ops and host calls (in place)."""
    n = len(ev)
    parent_op = np.full(n, -1, dtype="int64")
    top_op = np.full(n, -1, dtype="int64")
    starts_all = ev["start_ns"].to_numpy()
    ends_all = ev["end_ns"].to_numpy()
    is_op = one_of(ev["kind"], ["op"])
    host_needing = one_of(ev["kind"], ["runtime", "driver", "python", "annotation", "op"])

    thread_key = ev["pid"].to_numpy() * 1_000_003 + ev["tid"].to_numpy()
    for key in np.unique(thread_key[is_op]):
        on_thread = thread_key == key
        op_rows = np.flatnonzero(is_op & on_thread)  # already sorted by (start, -end)
        starts = starts_all[op_rows]
        ends = ends_all[op_rows]
        parents = parents_of_sorted(starts, ends)
        outer = parents < 0
        parent_op[op_rows] = np.where(parents >= 0, op_rows[np.maximum(parents, 0)], -1)
        # top_op: the latest outermost op at or before each op.
        outer_pos = np.where(outer, np.arange(len(op_rows)), -1)
        outer_pos = np.maximum.accumulate(outer_pos)
        top_op[op_rows] = op_rows[outer_pos]
        # Other host rows on this thread: by External id first (below), else containment.
        others = np.flatnonzero(host_needing & on_thread & ~is_op)
        if len(others):
            parent_op[others] = _innermost_containing(starts, ends, op_rows, parents, starts_all[others])

    # External ids are the trace's own statement of which op launched a runtime call.
    external = ev["external_id"].to_numpy()
    op_by_external = pd.Series(np.flatnonzero(is_op), index=external[is_op])
    op_by_external = op_by_external[~op_by_external.index.duplicated(keep="last")]
    op_by_external = op_by_external[op_by_external.index >= 0]
    calls = one_of(ev["kind"], ["runtime", "driver"]) & (external >= 0)
    mapped = pd.Series(external[calls]).map(op_by_external).to_numpy()
    found = ~pd.isna(mapped)
    rows = np.flatnonzero(calls)[found]
    parent_op[rows] = mapped[found].astype("int64")

    has_parent = (parent_op >= 0) & ~is_op
    top_op[has_parent] = top_op[parent_op[has_parent]]
    ev["parent_op"] = parent_op
    ev["top_op"] = top_op


def _link_gpu(ev: pd.DataFrame) -> None:
    """Fill launch, parent_op and top_op for GPU events (in place)."""
    correlation = ev["correlation"].to_numpy()
    is_call = one_of(ev["kind"], ["runtime", "driver"]) & (correlation >= 0)
    call_by_corr = pd.Series(np.flatnonzero(is_call), index=correlation[is_call])
    call_by_corr = call_by_corr[~call_by_corr.index.duplicated(keep="first")]
    is_gpu = one_of(ev["kind"], [*GPU_KINDS, "sync"]) & (correlation >= 0)
    mapped = pd.Series(correlation[is_gpu]).map(call_by_corr).to_numpy()
    launch = ev["launch"].to_numpy(copy=True)
    found = ~pd.isna(mapped)
    gpu_rows = np.flatnonzero(is_gpu)
    launch[gpu_rows[found]] = mapped[found].astype("int64")
    ev["launch"] = launch

    parent_op = ev["parent_op"].to_numpy(copy=True)
    top_op = ev["top_op"].to_numpy(copy=True)
    rows = gpu_rows[found]
    parent_op[rows] = parent_op[launch[rows]]
    top_op[rows] = top_op[launch[rows]]
    # GPU events whose launch call is missing from the trace may still name their op.
    external = ev["external_id"].to_numpy()
    is_op = one_of(ev["kind"], ["op"])
    op_by_external = pd.Series(np.flatnonzero(is_op), index=external[is_op])
    op_by_external = op_by_external[~op_by_external.index.duplicated(keep="last")]
    orphan = one_of(ev["kind"], GPU_KINDS) & (parent_op < 0) & (external >= 0)
    if orphan.any():
        mapped_op = pd.Series(external[orphan]).map(op_by_external).to_numpy()
        ok = ~pd.isna(mapped_op)
        orphan_rows = np.flatnonzero(orphan)[ok]
        parent_op[orphan_rows] = mapped_op[ok].astype("int64")
        top_op[orphan_rows] = top_op[parent_op[orphan_rows]]
    ev["parent_op"] = parent_op
    ev["top_op"] = top_op


def main_thread(ev: pd.DataFrame) -> tuple[int, int] | None:
    """The thread that runs the loop: the one with the steps; else the one holding the
    loop's own marks (optimizer steps, data loader reads, module calls: the thread that
    calls the model); else the one with most ops that is not autograd's. On a GPU,
    backward runs on a thread of its own, whose ops often outnumber the loop's: taken for
    the loop, it hides every optimizer step and read the loop makes."""
    steps = np.flatnonzero(one_of(ev["kind"], ["step"]))
    if len(steps):
        return int(ev["pid"].iat[steps[0]]), int(ev["tid"].iat[steps[0]])
    ops = one_of(ev["kind"], ["op"])
    if not ops.any():
        return None
    host = one_of(ev["kind"], ["op", "annotation", "python"])
    marks = host & name_matches(ev["name"], _LOOP_MARKS)
    if marks.any():
        pid, tid = ev.loc[marks].groupby(["pid", "tid"]).size().idxmax()
        return int(pid), int(tid)
    counts = ev.loc[ops].groupby(["pid", "tid"]).size()
    backward = _backward_share(ev, ops)
    ours = counts[(backward.reindex(counts.index).fillna(0.0) < AUTOGRAD_THREAD_SHARE)
                  & (counts >= 0.05 * counts.max())]
    pid, tid = (ours if len(ours) else counts).idxmax()
    return int(pid), int(tid)


# The loop's own marks, on the thread that runs it.
_LOOP_MARKS = re.compile(r"^(Optimizer\.step#|enumerate\(DataLoader\)|nn\.Module: )")
# A thread whose outermost ops are this share or more backward nodes is autograd's (its
# own thread on a GPU: about half its outermost ops are nodes); the loop's thread runs
# the forward, whose ops are no nodes (a CPU run, backward on the same thread: a third).
AUTOGRAD_THREAD_SHARE = 0.4


def _backward_share(ev: pd.DataFrame, ops: np.ndarray) -> pd.Series:
    """Per (pid, tid): the share of the thread's outermost ops that are backward's."""
    rows = np.flatnonzero(ops)
    frame = pd.DataFrame({"pid": ev["pid"].to_numpy()[rows], "tid": ev["tid"].to_numpy()[rows],
                          "start": ev["start_ns"].to_numpy()[rows], "end": ev["end_ns"].to_numpy()[rows],
                          "backward": name_matches(ev["name"], _BACKWARD_OP)[rows]})
    frame = frame.sort_values(["pid", "tid", "start"], kind="stable")
    reach = frame.groupby(["pid", "tid"], sort=False)["end"].cummax()
    before = reach.groupby([frame["pid"], frame["tid"]], sort=False).shift(1)
    outer = frame[~(frame["start"] < before.fillna(np.iinfo(np.int64).min))]
    return outer.groupby(["pid", "tid"])["backward"].mean()


def _subtract(ranges: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of ``ranges`` not covered by ``taken`` (both small lists of [start, end))."""
    out = []
    for start, end in ranges:
        pieces = [(start, end)]
        for t_start, t_end in taken:
            next_pieces = []
            for p_start, p_end in pieces:
                if t_end <= p_start or t_start >= p_end:
                    next_pieces.append((p_start, p_end))
                    continue
                if p_start < t_start:
                    next_pieces.append((p_start, t_start))
                if t_end < p_end:
                    next_pieces.append((t_end, p_end))
            pieces = next_pieces
        out.extend(p for p in pieces if p[1] > p[0])
    return out


def infer_phases(ev: pd.DataFrame, main: tuple[int, int]) -> pd.DataFrame:
    """Phase ranges per step for traces that carry none (see module docstring)."""
    same_process = ev["pid"].to_numpy() == main[0]
    starts = ev["start_ns"].to_numpy()
    ends = ev["end_ns"].to_numpy()
    annotation = one_of(ev["kind"], ["annotation"]) & same_process
    loader = np.flatnonzero(annotation & _names_where(ev["name"], lambda n: n.startswith("enumerate(DataLoader)")))
    optimizer = np.flatnonzero(annotation & _names_where(
        ev["name"], lambda n: n.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))))
    backward = np.flatnonzero(one_of(ev["kind"], ["op"]) & same_process & name_matches(ev["name"], _BACKWARD_OP))
    # The model's own calls where the trace records Python (with_stack): the forward is
    # those calls, not the whole stretch from loading to backward (a pipeline's
    # preprocessing runs outside them).
    on_main = same_process & (ev["tid"].to_numpy() == main[1])
    modules = np.flatnonzero(on_main & one_of(ev["kind"], ["python"]) & name_matches(ev["name"], _MODULE_CALL))
    modules = modules[_outermost(starts[modules], ends[modules])] if len(modules) else modules
    step_rows = np.flatnonzero(one_of(ev["kind"], ["step"]))
    step_rows = step_rows[np.argsort(starts[step_rows], kind="stable")]

    # rows are sorted by start (the frame is), so a step's rows are one slice of each
    # group; each group's starts are taken once, not once per step (steps x rows).
    loader, optimizer, backward, modules = ((rows, starts[rows]) for rows in (loader, optimizer, backward, modules))

    def inside(group: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> np.ndarray:
        rows, rows_start = group
        a, b = np.searchsorted(rows_start, [lo, hi], side="left")
        return rows[a:b]

    out = []
    for row in step_rows:
        lo, hi, number = int(starts[row]), int(ends[row]), int(ev["step"].iat[row])
        dl = [(max(int(starts[r]), lo), min(int(ends[r]), hi)) for r in inside(loader, lo, hi)]
        opt = [(max(int(starts[r]), lo), min(int(ends[r]), hi)) for r in inside(optimizer, lo, hi)]
        bwd_rows = inside(backward, lo, hi)
        bwd = [(int(starts[bwd_rows].min()), min(int(ends[bwd_rows].max()), hi))] if len(bwd_rows) else []
        loader_ends = [e for _, e in dl if not bwd or e <= bwd[0][0]]
        forward_start = max(loader_ends or [lo])
        if bwd:
            forward_end = bwd[0][0]
        else:
            later_opt = [a for a, _ in opt if a >= forward_start]
            forward_end = min(later_opt) if later_opt else hi
        calls = [(max(int(starts[r]), forward_start), min(int(ends[r]), forward_end))
                 for r in inside(modules, forward_start, forward_end)]
        calls = [(a, b) for a, b in calls if b > a]
        fwd = calls or ([(forward_start, forward_end)] if forward_end > forward_start else [])
        taken: list[tuple[int, int]] = []
        for phase, ranges in (("Dataloader", dl), ("Optimization", opt), ("Backward", bwd), ("Forward", fwd)):
            for a, b in _subtract(ranges, taken):
                out.append((phase, a, b, number))
            taken.extend(ranges)
    return pd.DataFrame({
        "name": [r[0] for r in out], "kind": "phase", "category": "advisor-inferred",
        "start_ns": [r[1] for r in out], "end_ns": [r[2] for r in out], "pid": main[0], "tid": main[1],
        "step": [r[3] for r in out], "phase": [r[0] for r in out],
    })


def _outermost(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the intervals (in start order) not inside an earlier one."""
    reach = np.maximum.accumulate(ends)
    inside = np.zeros(len(starts), dtype=bool)
    inside[1:] = starts[1:] < reach[:-1]
    return ~inside


def _phase_segments(phases: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint segments from phase ranges that may nest (advisor's own collector can
    record a backward inside an optimizer closure): the innermost range wins, so each
    elementary segment takes the latest-starting range that covers it."""
    if not len(phases):
        empty = np.zeros(0, dtype="int64")
        return empty, empty, np.zeros(0, dtype=object)
    p_start = phases["start_ns"].to_numpy()
    p_end = phases["end_ns"].to_numpy()
    p_name = text(phases["phase"])
    bounds = np.unique(np.concatenate([p_start, p_end])).tolist()
    seg_start, seg_end, seg_name = [], [], []
    # One sweep over the bounds: the ranges started so far sit on a heap, latest first
    # (ties: the later in the trace); one that ended before a segment's end is dropped
    # for good, since later segments end later still.
    order = np.argsort(p_start, kind="stable").tolist()
    starts, ends = p_start.tolist(), p_end.tolist()
    started: list[int] = []  # -(rank in order)
    pushed = 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        while pushed < len(order) and starts[order[pushed]] <= a:
            heapq.heappush(started, -pushed)
            pushed += 1
        while started and ends[order[-started[0]]] < b:
            heapq.heappop(started)
        if started:
            seg_start.append(a)
            seg_end.append(b)
            seg_name.append(p_name[order[-started[0]]])
    return np.asarray(seg_start, dtype="int64"), np.asarray(seg_end, dtype="int64"), np.asarray(seg_name, dtype=object)


def assign_steps_and_phases(ev: pd.DataFrame, main: tuple[int, int] | None, *,
                            host_spans: pd.DataFrame | None = None) -> None:
    """Each host event of the loop's process its step and phase by time (the innermost
    phase range that covers it), each GPU event those of its launch call; in place.
    ``host_spans`` (step, start_ns, end_ns): where a step's host calls ran, where that is
    not the step's own time (steps on the device's clock, the host having run ahead)."""
    starts = ev["start_ns"].to_numpy()
    step_col = ev["step"].to_numpy(copy=True)
    phase = _Labels(ev["phase"])
    is_step = one_of(ev["kind"], ["step"])
    is_phase = one_of(ev["kind"], ["phase"])
    is_host = ~one_of(ev["kind"], [*GPU_KINDS, "sync", "gpu_annotation"])
    steps = ev[is_step].sort_values("start_ns") if host_spans is None else host_spans.sort_values("start_ns")
    if main is not None and len(steps):
        same_process = ev["pid"].to_numpy() == main[0]
        targets = np.flatnonzero(is_host & same_process & ~is_step)
        s_start = steps["start_ns"].to_numpy()
        s_end = steps["end_ns"].to_numpy()
        idx = np.searchsorted(s_start, starts[targets], side="right") - 1
        ok = (idx >= 0) & (starts[targets] < s_end[np.maximum(idx, 0)])
        step_col[targets[ok]] = steps["step"].to_numpy()[idx[ok]]

        phase_targets = targets[ok & ~is_phase[targets]]
        seg_start, seg_end, seg_name = _phase_segments(ev.loc[is_phase, ["start_ns", "end_ns", "phase"]])
        others = phase.code("Others")
        assigned = np.full(len(phase_targets), others, dtype=np.int32)
        if len(seg_start):
            seg_code = np.array([phase.code(str(name)) for name in seg_name], dtype=np.int32)
            t = starts[phase_targets]
            pidx = np.searchsorted(seg_start, t, side="right") - 1
            hit = (pidx >= 0) & (t < seg_end[np.maximum(pidx, 0)])
            assigned[hit] = seg_code[pidx[hit]]
        phase.codes[phase_targets] = assigned
        # Autograd runs backward ops on its own thread: inside a step they are Backward.
        other_thread = ev["tid"].to_numpy()[phase_targets] != main[1]
        autograd = name_matches(ev["name"], _BACKWARD_OP)[phase_targets]
        phase.codes[phase_targets[other_thread & (autograd | (assigned == others))]] = phase.code("Backward")

    # GPU events and sync records take the step and phase of their launch call.
    launch = ev["launch"].to_numpy()
    gpu = np.flatnonzero(~is_host & (launch >= 0))
    step_col[gpu] = step_col[launch[gpu]]
    phase.codes[gpu] = phase.codes[launch[gpu]]
    ev["step"] = step_col
    ev["phase"] = phase.categorical(always=PHASES)


def _python_stacks(ev: pd.DataFrame, *, blocking_calls_only: bool = False) -> None:
    """Give host-blocking calls and tensor-to-host ops a call stack built from the
    trace's python_function frames, where the trace has no 'Call stack' text."""
    is_python = one_of(ev["kind"], ["python"])
    if not is_python.any():
        return
    stacks = _Labels(ev["call_stack"])
    blocking = _names_where(ev["name"], lambda n: n.startswith(HOST_BLOCKING_PREFIXES))
    to_host = _names_where(ev["name"], lambda n: n in SOURCE_OPS)
    if blocking_calls_only:
        to_host = np.zeros(len(ev), dtype=bool)
    wanted = ((one_of(ev["kind"], ["runtime", "driver"]) & blocking) | (one_of(ev["kind"], ["op"]) & to_host)) \
        & stacks.mask("")
    if not wanted.any():
        return
    thread_key = ev["pid"].to_numpy() * 1_000_003 + ev["tid"].to_numpy()
    starts_all = ev["start_ns"].to_numpy()
    ends_all = ev["end_ns"].to_numpy()
    name_arr = text(ev["name"])
    for key in np.unique(thread_key[wanted]):
        frames = np.flatnonzero(is_python & (thread_key == key))
        if not len(frames):
            continue
        f_start = starts_all[frames]
        f_end = ends_all[frames]
        parents = parents_of_sorted(f_start, f_end)
        targets = np.flatnonzero(wanted & (thread_key == key))
        inner = _innermost_containing(f_start, f_end, np.arange(len(frames)), parents, starts_all[targets])
        for target, pos in zip(targets, inner):
            chain = []
            while pos >= 0:
                chain.append(name_arr[frames[pos]])
                pos = parents[pos]
            # Kineto's 'Call stack' text lists the innermost frame first; keep that order.
            stacks.codes[target] = stacks.code(";".join(chain))
    ev["call_stack"] = stacks.categorical()


def _python_the_tables_read(ev: pd.DataFrame, main: tuple[int, int] | None) -> pd.DataFrame:
    """The events without the Python frames (python_function events, torch.profiler's
    with_stack=True) that nothing reads once the call stacks are written (_python_stacks):
    those on threads other than the one that runs the steps, and, where there are steps,
    those wholly outside the first step's start to the last step's end. The tables read
    Python frames on that thread only, for the time they overlap that window
    (gpu_idle_host, the job's host time outside the phases); a frame overlapping it keeps
    every frame that encloses it. Ids are renumbered to positions again."""
    is_python = one_of(ev["kind"], ["python"])
    if main is None or not is_python.any():
        return ev
    pid, tid = main
    drop = is_python & ((ev["pid"].to_numpy() != pid) | (ev["tid"].to_numpy() != tid))
    steps = one_of(ev["kind"], ["step"])
    if steps.any():
        starts, ends = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
        drop |= is_python & ((ends <= starts[steps].min()) | (starts >= ends[steps].max()))
    if not drop.any():
        return ev
    return take_rows(ev, np.flatnonzero(~drop))  # relations name ops and CUDA calls, never a frame


def _sorted(ev: pd.DataFrame, order: np.ndarray) -> pd.DataFrame:
    """Rows in ``order`` (start_order: by start time, outer ranges first on ties); ids
    renumbered to positions."""
    out = ev.take(order).reset_index(drop=True)
    out["id"] = np.arange(len(out), dtype="int64")
    return out


def _sync_range_stacks(ev: pd.DataFrame) -> None:
    """Give the ops inside advisor's ``advisor::sync`` ranges the range's source line as
    their call stack (where they have none), and the range itself too."""
    frame_of, name_at = _per_category(ev["name"], lambda n: (m := SYNC_RANGE.match(n)) and m["frame"] or "")
    ranges = np.flatnonzero(one_of(ev["kind"], ["annotation"]) & (frame_of != "")[name_at])
    if not len(ranges):
        return
    stacks = _Labels(ev["call_stack"])
    no_stack = stacks.code("")
    is_op = one_of(ev["kind"], ["op"])
    thread_key = ev["pid"].to_numpy() * 1_000_003 + ev["tid"].to_numpy()
    starts = ev["start_ns"].to_numpy()
    ends = ev["end_ns"].to_numpy()
    for key in np.unique(thread_key[ranges]):
        ops = np.flatnonzero(is_op & (thread_key == key))
        op_starts = starts[ops]
        for r in ranges[thread_key[ranges] == key]:
            frame = stacks.code(frame_of[name_at[r]])
            a, b = np.searchsorted(op_starts, [starts[r], ends[r]], side="left")
            inside = ops[a:b]
            inside = inside[stacks.codes[inside] == no_stack]
            stacks.codes[inside] = frame
            if stacks.codes[r] == no_stack:
                stacks.codes[r] = frame
    ev["call_stack"] = stacks.categorical()


def attribute(events: pd.DataFrame, *, sync_ranges_only: bool = False) -> pd.DataFrame:
    """Sort events, classify them by name and fill every relation column.

    ``sync_ranges_only``: the trace comes from advisor's host collector, which marks every
    host-blocking call the user's code makes with an ``advisor::sync`` range; tensor-to-host
    ops outside those ranges (an optimizer reading its step counter) then get no source
    line from the Python frames, so they are not charged to the user's code."""
    ev = classify_names(conform_events(events))
    # Not held through the rest: on a trace of millions of events the unsorted frame is
    # hundreds of MB. (A caller that passes its only reference frees it here.)
    del events
    # The columns that find the main thread and infer phases, in start order; the whole
    # frame is put in order once, with the inferred phases among its rows.
    order = start_order(ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy())
    light = ev[["kind", "name", "pid", "tid", "start_ns", "end_ns", "step"]].take(order).reset_index(drop=True)
    main = main_thread(light)
    inferred = None
    if main is not None and not one_of(light["kind"], ["phase"]).any() and one_of(light["kind"], ["step"]).any():
        inferred = infer_phases(light, main)
    del light
    if inferred is not None and len(inferred):
        ev = concat_events([ev, conform_events(inferred)], by_start=True, conformed=True)
    else:
        ev = _sorted(ev, order)
    _link_ops(ev)
    _link_gpu(ev)
    assign_steps_and_phases(ev, main)
    _sync_range_stacks(ev)
    _python_stacks(ev, blocking_calls_only=sync_ranges_only)
    return conform_events(_python_the_tables_read(ev, main))
