"""UserDefined Summary: the user's own ranges (record_function, NVTX) and the GPU work
launched inside them."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.session import PHASES
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step.facts import Facts, decode, stats
from advisor.tables._registry import table, with_notes

# Ranges that are the profiler's or advisor's own bookkeeping, not the user's.
BOOKKEEPING = re.compile(r"^(ProfilerStep#\d+|advisor::.*|" + "|".join(PHASES) + r")$")


def user_ranges(f: Facts) -> pd.DataFrame:
    """Host annotations of the window that are the user's (see the table description)."""

    def compute() -> pd.DataFrame:
        ann = f.of_kind("annotation")
        if not len(ann):
            return ann
        keep = ~name_matches(ann["name"], BOOKKEEPING)
        return ann[keep]

    return f.memo("user_ranges", compute)


def expand_ranges(first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For index ranges [first, stop) per row: (row, index) for every index in every range."""
    counts = np.maximum(stop - first, 0)
    rows = np.repeat(np.arange(len(first)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, first[rows] + offsets


def launched_inside(f: Facts, ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (position in ``ranges``, position in ``f.gpu``) of GPU events whose launch
    call started inside the range, on the range's thread."""
    gpu = f.gpu
    launch = gpu["launch"].to_numpy()
    gpu_pos = np.flatnonzero(launch >= 0)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not len(gpu_pos) or not len(ranges):
        return empty
    ev = f.events
    rows = launch[gpu_pos]
    calls = pd.DataFrame({"pid": ev["pid"].to_numpy()[rows], "tid": ev["tid"].to_numpy()[rows]})
    both = pd.concat([calls, ranges[["pid", "tid"]]], ignore_index=True)
    thread = both.groupby(["pid", "tid"], sort=False).ngroup().to_numpy()
    call_thread, range_thread = thread[: len(calls)], thread[len(calls):]
    call_start = ev["start_ns"].to_numpy()[rows]
    r_start, r_end = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    out_r, out_g = [], []
    for t in np.unique(range_thread):
        mine = np.flatnonzero(call_thread == t)
        if not len(mine):
            continue
        mine = mine[np.argsort(call_start[mine], kind="stable")]
        starts = call_start[mine]
        which = np.flatnonzero(range_thread == t)
        first = np.searchsorted(starts, r_start[which], side="left")
        stop = np.searchsorted(starts, r_end[which], side="left")
        r, i = expand_ranges(first, stop)
        out_r.append(which[r])
        out_g.append(gpu_pos[mine[i]])
    if not out_r:
        return empty
    return np.concatenate(out_r), np.concatenate(out_g)


@table(
    "userdefined",
    title="UserDefined Summary",
    description=(
        "One row per name of the user's ranges (record_function, NVTX), steps and phases "
        "excluded. CPU statistics are per call and sum the calls. GPU time is the union of the "
        "GPU work launched from inside the ranges on the range's own thread (so autograd's "
        "backward thread is not counted under a main-thread range); gpu_range_ns is the union "
        "of the ranges as the profiler projected them onto the GPU, gaps included."
    ),
    key="The range's name",
    columns={
        "calls": "Host ranges of this name in the window (0: seen on the GPU only).",
        "cpu_total_ns": "Sum of the ranges' durations, ns.",
        "cpu_avg_ns": "Mean duration, ns.",
        "cpu_max_ns": "Longest, ns.",
        "cpu_min_ns": "Shortest, ns.",
        "cpu_ratio": "cpu_total_ns / window (0..1; nested or parallel ranges can exceed 1).",
        "gpu_total_ns": "Union of GPU work launched inside the ranges, ns (NaN: GPU not measured).",
        "gpu_ratio": "gpu_total_ns / window (0..1).",
        "gpu_range_ns": "Union of the GPU-side ranges of this name, ns (0 where the trace has none).",
    },
)
def userdefined_table(f: Facts) -> pd.DataFrame | None:
    ranges = user_ranges(f)
    gpu_ranges = f.of_kind("gpu_annotation")
    gpu_ranges = gpu_ranges[~name_matches(gpu_ranges["name"], BOOKKEEPING)]
    if not len(ranges) and not len(gpu_ranges):
        return None
    codes, labels = f.name_codes
    names = codes[ranges["id"].to_numpy()]
    out = stats(names, (ranges["end_ns"] - ranges["start_ns"]).to_numpy(), prefix="cpu")
    r, g = launched_inside(f, ranges)
    gpu = f.gpu
    launched = iv.grouped_union_length(
        names[r], (gpu["start_ns"].to_numpy()[g], gpu["end_ns"].to_numpy()[g])
    )
    projected = iv.grouped_union_length(codes[gpu_ranges["id"].to_numpy()], iv.as_intervals(gpu_ranges))
    out = out.reindex(out.index.union(projected.index))
    out["calls"] = out["calls"].fillna(0).astype("int64")
    out["cpu_total_ns"] = out["cpu_total_ns"].fillna(0).astype("int64")
    out["gpu_total_ns"] = launched.reindex(out.index).fillna(0).astype("int64")
    out["gpu_range_ns"] = projected.reindex(out.index).fillna(0).astype("int64")
    if not f.gpu_measured:
        out["gpu_total_ns"] = np.nan
        with_notes(out, f.gpu_not_measured_note)
    out["cpu_ratio"] = f.ratio(out["cpu_total_ns"], f.window_ns)
    out["gpu_ratio"] = f.ratio(out["gpu_total_ns"], f.window_ns)
    out.index = decode(out.index.to_numpy(), labels)
    return out.sort_values(["cpu_total_ns", "gpu_range_ns"], ascending=False, kind="stable")
