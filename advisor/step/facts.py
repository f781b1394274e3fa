"""What several summary tables and the step model need from one session, worked out once.

``Facts`` wraps a Session: the window, the steps, the events of each kind inside the
profiled steps, and a memo so that an intermediate result one table computes (the blocking
host calls, say) is reused by another. It only reads the session; the relation columns
(launch, parent_op, top_op, step, phase) are the attribution stage's, taken as given.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, PHASES, Session, one_of, select_rows
from advisor.session import intervals as iv
from advisor.session.attribute import main_thread, name_matches
from advisor.session.calls import LAUNCH_CALLS

MODEL_PHASES = tuple(p for p in PHASES if p != "Others")

# The columns the tables read of the window's op calls (``Facts.ops``: the operator,
# kernel, roofline and host_sync tables) and of the main thread's top-level ops
# (``Facts.main_ops``): frames of every column, shared by the tables, would be held through
# the peak of a large trace's diagnosis; a table that reads another column adds it here.
OP_COLUMNS = ("id", "name", "start_ns", "end_ns", "parent_op", "top_op", "flops",
              "input_dims", "input_types", "input_strides", "concrete_inputs")
MAIN_OP_COLUMNS = ("name", "start_ns", "end_ns", "phase", "input_dims", "input_types")

# A host range or kernel counts as communication by these names (NCCL kernels, c10d ops,
# torch's nccl:* and gloo:* record_function ranges).
COMM_KERNEL = re.compile(r"nccl", re.IGNORECASE)
COMM_HOST = re.compile(r"^(nccl:|gloo:|c10d::|c10d:|record_param_comms$)|ProcessGroupNCCL|ProcessGroupGloo")
# gloo runs a collective's work on its own threads, one gloo:* range per collective: on a
# CPU job these ranges are the communication, as NCCL kernels are on a GPU.
COMM_WORK_HOST = re.compile(r"^gloo:")

# Frames that are library code, not the user's: skipped when naming a source line.
_LIBRARY_FRAME = re.compile(
    r"site-packages|dist-packages|(^|/)torch/|/lib/python\d|^<|^\[|(^|/)threading\.py|(^|/)runpy\.py"
    r"|(^|/)advisor/collect/"  # advisor's own hooks sit between the user's line and torch
)
_FRAME = re.compile(r"^\s*(?P<file>.+?)\((?P<line>\d+)\): (?P<function>.*)$")


def coded(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column as (int64 codes, labels) with ``labels[code]`` the text; "" is code -1.
    Grouping on the codes avoids building millions of Python strings."""
    cat = column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    labels = np.asarray([str(c) for c in cat.cat.categories], dtype=object)
    codes = cat.cat.codes.to_numpy().astype(np.int64)
    blank = np.flatnonzero(labels == "")
    if len(blank):
        codes[codes == blank[0]] = -1
    return codes, labels


def decode(codes, labels: np.ndarray, missing: str = "") -> np.ndarray:
    """Text for codes (NaN or -1 give ``missing``), as an object array."""
    codes = pd.Series(codes).fillna(-1).to_numpy().astype(np.int64)
    out = np.asarray(labels, dtype=object)[np.maximum(codes, 0)] if len(labels) else np.full(len(codes), missing, dtype=object)
    out[codes < 0] = missing
    return out


# Packages whose frames are never the user's, for traces that write paths relative to
# sys.path ("transformers/models/bert/modeling_bert.py"), where no site-packages says so.
_LIBRARY_PACKAGES = frozenset(sys.stdlib_module_names) | {
    "torch", "torchvision", "torchaudio", "torchtext", "transformers", "accelerate", "diffusers", "timm",
    "huggingface_hub", "tokenizers", "datasets", "lightning", "pytorch_lightning", "apex", "deepspeed",
    "triton", "einops", "numpy", "pandas", "PIL", "tqdm", "safetensors", "peft", "xformers", "flash_attn",
    "megatron", "fairscale", "jax", "tensorflow", "sklearn", "scipy", "cv2", "albumentations", "typing_extensions",
    "av", "decord", "librosa", "soundfile", "imageio", "skimage", "h5py", "pyarrow", "sentencepiece",
}


@lru_cache(maxsize=4096)  # a trace's stacks repeat the same few hundred files
def is_library_file(file: str) -> bool:
    """Is ``file`` (a frame's path, absolute or relative to sys.path) library code?"""
    if _LIBRARY_FRAME.search(file):
        return True
    head = file.lstrip("./").split("/", 1)[0]
    return head.removesuffix(".py") in _LIBRARY_PACKAGES


def user_frame(call_stack: str) -> str:
    """The innermost frame of ``call_stack`` that is not library code, as "file:line".

    Stacks are ';'-separated "file(line): function" frames, innermost first as Kineto
    writes them; "" when no frame is the user's.
    """
    for frame in str(call_stack).split(";"):
        match = _FRAME.match(frame)
        if match and not is_library_file(match["file"]):
            return f"{match['file']}:{match['line']}"
    return ""


def ancestors(parents: np.ndarray, start: np.ndarray, max_depth: int = 256):
    """Yield (position in ``start``, ancestor row id) for every ancestor of every row, by
    walking the ``parents`` array (row id -> parent row id, -1 at a root) level by level."""
    where = np.arange(len(start))
    current = np.asarray(start, dtype=np.int64)
    for _ in range(max_depth):
        live = current >= 0
        if not live.any():
            return
        where, current = where[live], current[live]
        yield where, current
        current = parents[current]


class Facts:
    """A Session seen by the tables (see the module docstring)."""

    def __init__(self, session: Session):
        self.session = session
        self.meta = session.meta
        self.events = session.events
        lo, hi = session.window()
        self.window = (lo, hi)
        self.window_ns = max(hi - lo, 0)
        self.steps = session.steps()
        self.has_steps = len(self.steps) > 0
        self._memo: dict[Any, Any] = {}
        self.model: Any = None  # the StepModel these facts belong to (advisor.step.model), where one

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # -- time bases ------------------------------------------------------------------------

    @cached_property
    def step_total_ns(self) -> int:
        """Time inside steps (the ProfileStep total); the window length without steps."""
        if not self.has_steps:
            return self.window_ns
        return iv.total_length(iv.as_intervals(self.steps))

    @cached_property
    def step_index(self) -> pd.Series:
        """Step number -> position in ``steps``."""
        numbers = pd.Series(np.arange(len(self.steps)), index=self.steps["step"].to_numpy())
        return numbers[~numbers.index.duplicated(keep="first")]

    def step_positions(self, frame: pd.DataFrame) -> np.ndarray:
        """Each row's step as a position in ``steps`` (-1: in no step)."""
        pos = frame["step"].map(self.step_index)
        return pos.fillna(-1).to_numpy(dtype=np.int64)

    # -- rows ------------------------------------------------------------------------------

    def mask(self, *kinds: str) -> np.ndarray:
        """Events of these kinds in the profiled steps: rows attributed to a step, or
        starting inside the window (GPU work queued in a step counts even when it runs
        after the step's end). Without steps, those starting inside the window (a steady
        window leaves start-up and work in flight out)."""

        def compute() -> np.ndarray:
            ev = self.events
            mask = one_of(ev["kind"], kinds)
            lo, hi = self.window
            start = ev["start_ns"].to_numpy()
            inside = (start >= lo) & (start < hi)
            mask &= ((ev["step"].to_numpy() >= 0) | inside) if self.has_steps else inside
            return mask

        return self.memo(("mask", kinds), compute)

    def of_kind(self, *kinds: str, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
        """The rows of ``mask(*kinds)`` as a frame (shared by the tables: read-only, its
        columns that hold nothing for these kinds a single value; see select_rows), of
        ``columns`` only where given."""
        def rows() -> pd.DataFrame:
            events = self.events if columns is None else self.events[list(columns)]
            return select_rows(events, self.mask(*kinds))

        return self.memo(("of_kind", kinds, columns), rows)

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The window's op calls (OP_COLUMNS)."""
        return self.of_kind("op", columns=OP_COLUMNS)

    def spans(self, *kinds: str) -> iv.Intervals:
        """The time of ``mask(*kinds)`` rows, without building a frame."""
        mask = self.mask(*kinds)
        return iv.Intervals(self.events["start_ns"].to_numpy()[mask], self.events["end_ns"].to_numpy()[mask])

    def busy(self, *kinds: str) -> iv.Intervals:
        """Union of ``spans(*kinds)`` inside the window: when at least one such event ran."""
        return self.memo(("busy", kinds), lambda: self.union_in_window(self.spans(*kinds)))

    @cached_property
    def gpu(self) -> pd.DataFrame:
        """GPU activity (kernels, copies, sets) of the profiled steps."""
        return self.of_kind(*GPU_KINDS)

    @cached_property
    def main_thread(self) -> tuple[int, int] | None:
        """(pid, tid) of the thread that runs the loop (the attribution stage's choice)."""
        return main_thread(self.events)

    @cached_property
    def main_ops(self) -> pd.DataFrame:
        """The main thread's top-level operators, by start (MAIN_OP_COLUMNS; the index is
        their row ids)."""
        ev = self.events
        if self.main_thread is None:
            return ev.iloc[0:0][list(MAIN_OP_COLUMNS)]
        pid, tid = self.main_thread
        mine = ((ev["kind"] == "op").to_numpy() & (ev["parent_op"].to_numpy() < 0)
                & (ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid))
        rows = np.flatnonzero(mine)
        return select_rows(ev[list(MAIN_OP_COLUMNS)], rows[np.argsort(ev["start_ns"].to_numpy()[rows], kind="stable")])

    @cached_property
    def phases(self) -> pd.DataFrame:
        """Phase ranges of the window, their phase name in column ``phase_name``."""
        rows = self.of_kind("phase").copy()
        phase = rows["phase"].astype(str)
        rows["phase_name"] = phase.where(phase != "", rows["name"].astype(str)).to_numpy()
        return rows

    @cached_property
    def phase_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each phase range as (step position, phase name, start_ns, end_ns), clipped to its
        own step: a phase's time counts inside its step only (position -1: in no step)."""
        steps, phases = self.steps, self.phases
        s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
        p_pos = self.step_positions(phases)
        ok = p_pos >= 0
        at = np.maximum(p_pos, 0)
        p_start = np.where(ok, np.maximum(phases["start_ns"].to_numpy(), s_start[at] if len(s_start) else 0), 0)
        p_end = np.where(ok, np.minimum(phases["end_ns"].to_numpy(), s_end[at] if len(s_end) else 0), 0)
        return p_pos, phases["phase_name"].to_numpy(), p_start, p_end

    def phase_intervals(self, name: str) -> iv.Intervals:
        """The window's time in phase ``name`` (its ranges clipped to their steps), as one
        normalised set of intervals."""
        def compute() -> iv.Intervals:
            _, names, starts, ends = self.phase_spans
            mine = names == name
            return iv.union((starts[mine], ends[mine]))

        return self.memo(("phase_intervals", name), compute)

    @cached_property
    def gpu_measured(self) -> bool:
        if self.meta.collector.gpu_measured:
            return True
        return bool(self.events["kind"].isin(GPU_KINDS).any())

    @cached_property
    def unrecorded_launches(self) -> int:
        """Kernel launches the host made where the profile holds no GPU activity at all: the
        job ran on a GPU the trace did not record (CUPTI in range mode, a profiler given
        CPU activities only). 0 where the GPU was measured or nothing was launched."""
        if self.gpu_measured:
            return 0
        ev = self.events
        calls = one_of(ev["kind"], ("runtime", "driver"))
        if not calls.any():
            return 0
        return int((calls & name_matches(ev["name"], LAUNCH_CALLS)).sum())

    @cached_property
    def gpu_not_measured_reason(self) -> str:
        """Why the GPU was not measured, at length (the device table's note)."""
        why = "; ".join(self.meta.collector.notes) or f"the {self.meta.collector.name} collector recorded no GPU activity"
        return f"GPU not measured: {why}"

    @cached_property
    def gpu_not_measured_note(self) -> str:
        """The same, short, for table captions: the session header says why at length."""
        return f"GPU not measured by the {self.meta.collector.name} collector: its GPU columns are empty."

    @cached_property
    def name_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """``coded(events["name"])``: every event's name code and the labels."""
        return coded(self.events["name"])

    def names_of(self, rows: np.ndarray) -> np.ndarray:
        """Event names of the given row ids, as an object array of str."""
        codes, labels = self.name_codes
        return decode(codes[np.asarray(rows, dtype=np.int64)], labels)

    @cached_property
    def parents(self) -> np.ndarray:
        """Row id -> parent_op row id, for walking op ancestry."""
        return self.events["parent_op"].to_numpy()

    def in_window_intervals(self, rows) -> iv.Intervals:
        """The time of ``rows`` (a frame or intervals) clipped to the window."""
        lo, hi = self.window
        return iv.clip(iv.as_intervals(rows), lo, hi)

    def union_in_window(self, rows) -> iv.Intervals:
        return iv.union(self.in_window_intervals(rows))

    def ratio(self, value, base) -> Any:
        """value / base, NaN where the base is 0."""
        base = np.asarray(base, dtype="float64")
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(value, dtype="float64") / base
        return np.where(base > 0, out, np.nan) if out.ndim else (float(out) if base > 0 else float("nan"))

    @cached_property
    def comm_kernels(self) -> np.ndarray:
        """Mask over ``gpu`` of communication kernels."""
        gpu = self.gpu
        return (gpu["kind"] == "kernel").to_numpy() & name_matches(gpu["name"], COMM_KERNEL)

    @cached_property
    def comm_host(self) -> pd.DataFrame:
        """Host ranges of collective communication (c10d ops, nccl:* and gloo:* ranges)."""
        # Picked from the events at once: a frame of every host op and range first would
        # be kept (memoised) for the session's tables, the largest of them on a big trace.
        ev = self.events
        return select_rows(ev, self.mask("op", "annotation") & name_matches(ev["name"], COMM_HOST))

    @cached_property
    def comm_work_host(self) -> pd.DataFrame:
        """The collectives' own work on the host: gloo's gloo:* ranges, on its threads."""
        host = self.comm_host
        return host[name_matches(host["name"], COMM_WORK_HOST)]


def unique_keys(keys) -> np.ndarray:
    """Row keys made unique: a key's second and later rows get "#1", "#2"... (step numbers
    repeat only in a damaged trace; the first row of a key keeps the plain key, so evidence
    can name it)."""
    keys = pd.Series(np.asarray(keys, dtype=object)).astype(str)
    repeat = keys.groupby(keys).cumcount()
    return np.where(repeat > 0, keys + "#" + repeat.astype(str), keys)


def _grouped(keys, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys, sorted or as they first come; each row's position among them, -1
    for a missing key). numpy and one factorize rather than a pandas groupby: the tables
    group small frames many times over, and a groupby's fixed cost was most of their time
    on a small trace."""
    codes, distinct = pd.factorize(np.asarray(keys), sort=sort)
    return np.asarray(distinct), codes


def _runs(sorted_values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in ``sorted_values``."""
    if not len(sorted_values):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], sorted_values[1:] != sorted_values[:-1])))


class Groups:
    """Rows grouped by a key, as a pandas groupby groups them (a missing key in no group;
    ``sort``: the keys sorted, else as they first come), for the per-group sums, extremes,
    counts and first values the tables take: ``keys`` the distinct keys in order, each
    reduction one value per key. Missing values are skipped, as pandas skips them."""

    def __init__(self, keys, sort: bool = True):
        self.keys, codes = _grouped(keys, sort)
        self.codes = codes  # each row's group: its position in ``keys`` (-1: in none)
        rows = np.flatnonzero(codes >= 0)
        self._order = rows[np.argsort(codes[rows], kind="stable")]  # by group, rows in order
        self._starts = _runs(codes[self._order])

    def _sorted(self, values) -> np.ndarray:
        return np.asarray(values)[self._order]

    def size(self) -> np.ndarray:
        return np.diff(np.append(self._starts, len(self._order))).astype(np.int64)

    def count(self, values) -> np.ndarray:
        return self.sum(~pd.isna(np.asarray(values))).astype(np.int64)

    def sum(self, values) -> np.ndarray:
        """Sums (0 for a group with no value), int64 for integers and flags."""
        ordered = self._sorted(values)
        if ordered.dtype.kind == "b":
            ordered = ordered.astype(np.int64)
        elif ordered.dtype.kind == "f":
            ordered = np.where(np.isnan(ordered), 0.0, ordered)
        if not len(ordered):
            return np.zeros(0, dtype=ordered.dtype)
        return np.add.reduceat(ordered, self._starts)

    def min(self, values) -> np.ndarray:
        ordered = self._sorted(values)
        return np.fmin.reduceat(ordered, self._starts) if len(ordered) else ordered

    def max(self, values) -> np.ndarray:
        ordered = self._sorted(values)
        return np.fmax.reduceat(ordered, self._starts) if len(ordered) else ordered

    def any(self, values) -> np.ndarray:
        return self.sum(np.asarray(values, dtype=bool)) > 0

    def first(self, values) -> np.ndarray:
        """Each group's first value that is not missing (NaN where it has none)."""
        ordered = self._sorted(values)
        if not len(ordered):
            return ordered
        at = np.where(pd.isna(ordered), len(ordered), np.arange(len(ordered)))
        first = np.minimum.reduceat(at, self._starts)
        out = ordered[np.minimum(first, len(ordered) - 1)]
        if (first == len(ordered)).any():
            out = out.astype(object if out.dtype.kind not in "fc" else out.dtype)
            out[first == len(ordered)] = np.nan
        return out


def sums_by(keys, columns: dict[str, Any], *, unknown_if_none: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per distinct key (sorted, the index): each of ``columns`` summed, missing values
    skipped; a column named in ``unknown_if_none`` is NaN for a key with no value to sum
    (pandas' min_count=1), where the others give 0."""
    groups = Groups(keys)
    out = pd.DataFrame({name: groups.sum(values) for name, values in columns.items()}, index=pd.Index(groups.keys))
    for name in unknown_if_none:
        out[name] = out[name].where(groups.count(columns[name]) > 0)
    return out


def stats(keys, durations, *, prefix: str) -> pd.DataFrame:
    """calls and {prefix}_total/avg/max/min_ns per key (int64 totals, float avg), one row
    per distinct key in sorted order."""
    groups = Groups(keys)
    durations = np.asarray(durations, dtype=np.int64)
    out = pd.DataFrame(
        {
            "calls": groups.size(),
            f"{prefix}_total_ns": groups.sum(durations),
            f"{prefix}_max_ns": groups.max(durations),
            f"{prefix}_min_ns": groups.min(durations),
        },
        index=pd.Index(groups.keys, name="key"),
    )
    out[f"{prefix}_avg_ns"] = out[f"{prefix}_total_ns"] / out["calls"]
    return out


def most_common(keys, values, *, missing: Any = "") -> pd.Series:
    """The most frequent value per key, ``missing`` values ignored (ties: the smallest)."""
    keys, values = np.asarray(keys), np.asarray(values)
    kept = ~pd.isna(values) & (values != missing)
    keys, values = keys[kept], values[kept]
    if not len(keys):
        return pd.Series(dtype=object)
    key_labels, key_codes = _grouped(keys)
    value_labels, value_codes = _grouped(values)
    value_codes = value_codes[key_codes >= 0]  # a missing key is in no group
    key_codes = key_codes[key_codes >= 0]
    pairs = np.sort(key_codes.astype(np.int64) * len(value_labels) + value_codes)
    starts = _runs(pairs)
    counts = np.diff(np.append(starts, len(pairs)))
    pair = pairs[starts]  # the distinct (key, value) pairs, by key then value
    key_of, value_of = pair // len(value_labels), pair % len(value_labels)
    order = np.lexsort((-counts, key_of))  # stable: within a key, most first, ties by value
    best = order[_runs(key_of[order])]
    return pd.Series(value_labels[value_of[best]], index=key_labels[key_of[best]])


def top_names(keys, names, weights, *, limit: int, labels: np.ndarray | None = None) -> pd.Series:
    """Per key, the ``limit`` names with the largest summed weight, joined by "; ".
    ``names`` may be codes, with ``labels`` to decode them."""
    keys, names = np.asarray(keys), np.asarray(names)
    if not len(keys):
        return pd.Series(dtype=object)
    key_labels, key_codes = _grouped(keys)
    name_labels, name_codes = _grouped(names)
    valid = (key_codes >= 0) & (name_codes >= 0)  # a missing key or name is in no group
    width = len(name_labels)
    pair_codes, pairs = pd.factorize(key_codes[valid].astype(np.int64) * width + name_codes[valid], sort=True)
    weights = np.asarray(weights, dtype="float64")[valid]
    sums = np.bincount(pair_codes, weights=weights, minlength=len(pairs))
    key_of, name_of = pairs // width, pairs % width
    order = np.lexsort((-sums, key_of))  # stable: within a key, heaviest first, ties by name
    key_of, name_of = key_of[order], name_of[order]
    starts = _runs(key_of)
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    head = rank < limit
    named = name_labels[name_of[head]]
    text = decode(named, labels) if labels is not None else np.array([str(n) for n in named], dtype=object)
    joined: dict[Any, str] = {}
    for key, name in zip(key_labels[key_of[head]], text):
        joined[key] = f"{joined[key]}; {name}" if key in joined else name
    return pd.Series(joined, dtype=object)
