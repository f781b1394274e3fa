"""Tables over time: each step's phases (Step Phases) and GPU busy and idle per slice of
the window (GPU Timeline).

The Model Summary aggregates over steps and the GPU Idle Breakdown over the window; these
two keep the time axis, so a report can draw a stacked bar per step and the GPU's busy and
idle time across the window without computing anything itself. Their figures use the same
definitions as the aggregate tables, so they add up to them: the step rows of step_phases
sum to the Model Summary's totals, and the idle columns of gpu_timeline sum to the GPU Idle
Breakdown's rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS
from advisor.session import intervals as iv
from advisor.step.facts import MODEL_PHASES, Facts, unique_keys
from advisor.step.idle import GPU_CAUSES
from advisor.tables._registry import table, with_notes
from advisor.tables.model_summary import union_per_step

# Slices of the window in the GPU timeline: fine enough to see each step's idle gap in a
# handful of steps, few enough to draw as bars and read as rows.
BUCKETS = 120

PHASE_COLUMNS = {phase: f"{phase.lower()}_ns" for phase in (*MODEL_PHASES, "Others")}
# The host states of the GPU Idle Breakdown, in its order of precedence, as column names.
IDLE_COLUMNS = {cause: "idle_" + cause.replace(" ", "_") + "_ns" for cause in GPU_CAUSES}


@table(
    "step_phases",
    title="Step Phases",
    description=(
        "One row per step: its wall time and the host (CPU) time of each phase inside it, with "
        "the Model Summary's definitions (a phase's merged ranges inside its own step; Others is "
        "the step's time outside every phase), and the GPU busy time of the work launched in the "
        "step. Summed over the rows, each column gives the Model Summary's cpu_total_ns for that "
        "phase. Empty without steps."
    ),
    key="The step number",
    columns={
        "step": "Step number.",
        "offset_ns": "Step start less the window start, ns.",
        "duration_ns": "Step wall time (ProfileStep), ns.",
        **{column: f"Host time in {phase} in this step, ns." for phase, column in PHASE_COLUMNS.items()},
        "gpu_busy_ns": "Union of the GPU work (kernels, copies, sets) launched in this step, ns "
                       "(NaN: GPU not measured).",
        "gpu_ratio": "gpu_busy_ns / duration_ns (0..1; may pass 1 where work queued in the step runs after it).",
    },
)
def step_phases_table(f: Facts) -> pd.DataFrame | None:
    if not f.has_steps:
        return None
    steps = f.steps
    n = len(steps)
    s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    durations = s_end - s_start

    p_pos, p_name, p_start, p_end = f.phase_spans
    out = pd.DataFrame(
        {
            "step": steps["step"].to_numpy(dtype=np.int64),
            "offset_ns": (s_start - f.window[0]).astype(np.int64),
            "duration_ns": durations.astype(np.int64),
        }
    )
    for phase in MODEL_PHASES:
        mine = p_name == phase
        out[PHASE_COLUMNS[phase]] = union_per_step(p_pos[mine], p_start[mine], p_end[mine], n).astype(np.int64)
    in_any = np.isin(p_name, MODEL_PHASES)
    out[PHASE_COLUMNS["Others"]] = (durations - union_per_step(p_pos[in_any], p_start[in_any], p_end[in_any], n)).astype(
        np.int64
    )
    if f.gpu_measured:
        gpu = f.gpu
        busy = union_per_step(f.step_positions(gpu), gpu["start_ns"].to_numpy(), gpu["end_ns"].to_numpy(), n)
        out["gpu_busy_ns"] = busy.astype(np.int64)
        out["gpu_ratio"] = f.ratio(busy, durations)
    else:
        out["gpu_busy_ns"] = np.nan
        out["gpu_ratio"] = np.nan
        with_notes(out, f.gpu_not_measured_note)
    out.index = unique_keys(out["step"])
    return out


def per_bucket(spans: iv.Intervals, edges: np.ndarray) -> np.ndarray:
    """Time a normalised interval set covers in each bucket [edges[i], edges[i+1])."""
    return np.diff(iv.covered_before(spans, edges))


@table(
    "gpu_timeline",
    title="GPU Timeline",
    description=(
        f"The window cut into {BUCKETS} equal slices (fewer for a window shorter than that many "
        "ns): in each, the time some GPU work ran (kernels, copies or sets, on any device) and the "
        "idle time split by what the host was doing, with the GPU Idle Breakdown's definitions "
        "and precedence (work queued, data loading, blocking sync, launching, other). busy_ns plus the idle "
        "columns is the slice's length; each idle column sums over the rows to that row of the "
        "GPU Idle Breakdown. Empty when the GPU was not measured."
    ),
    key="The slice's position in the window, from 0",
    columns={
        "offset_ns": "Slice start less the window start, ns.",
        "duration_ns": "Slice length, ns.",
        "busy_ns": "GPU busy time in the slice, ns.",
        "utilization": "busy_ns / duration_ns (0..1).",
        **{column: f"GPU idle time in the slice in the state {state!r} (the GPU Idle Breakdown's), ns."
           for state, column in IDLE_COLUMNS.items()},
        "step": "The step running at the slice's start (-1: none).",
    },
)
def gpu_timeline_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    lo, hi = f.window
    if hi <= lo:
        return None
    count = int(min(BUCKETS, hi - lo))
    edges = lo + (np.arange(count + 1, dtype=np.int64) * (hi - lo)) // count
    busy = f.busy(*GPU_KINDS)
    out = pd.DataFrame(
        {
            "offset_ns": edges[:-1] - lo,
            "duration_ns": np.diff(edges),
            "busy_ns": per_bucket(busy, edges),
        }
    )
    out["utilization"] = f.ratio(out["busy_ns"], out["duration_ns"])
    part = f.model.partition if f.model is not None else None
    for state, column in IDLE_COLUMNS.items():
        out[column] = per_bucket(part.causes[state], edges) if part is not None and part.on_gpu else 0
    out["step"] = _step_at(f, edges[:-1])
    return out


def _step_at(f: Facts, points: np.ndarray) -> np.ndarray:
    """The step whose range holds each point (the latest-starting one), -1 where none."""
    if not f.has_steps:
        return np.full(len(points), -1, dtype=np.int64)
    steps = f.steps
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    i = np.searchsorted(starts, points, side="right") - 1
    ok = (i >= 0) & (points < ends[np.maximum(i, 0)])
    return np.where(ok, steps["step"].to_numpy()[np.maximum(i, 0)], -1).astype(np.int64)

