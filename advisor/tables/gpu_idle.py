"""GPU Idle Breakdown: the step model's partition of the GPU's idle time, each idle
nanosecond given exactly one cause (advisor.step.idle), so the rows sum to the idle time."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts
from advisor.step.idle import GPU_CAUSES, OUTSIDE
from advisor.tables._registry import table, with_notes


@table(
    "gpu_idle",
    title="GPU Idle Breakdown",
    description=(
        "The GPU's idle time (no kernel, copy or set running on any device), each nanosecond given the first "
        "cause that covers it: work queued (work already launched that the device did not start: it waited "
        "on another stream, an event, a peer or work the profile does not hold), blocking sync (the host blocked "
        "on the device), data loading, communication (the host in a collective), launch calls (the host in the "
        "calls that launch work), host in model (the host in an operator or Python inside the model's phases or "
        "a module's call), host outside model (preprocessing, logging, the loop's own code; the gpu_idle_host "
        "table names it), unrecorded (nothing recorded on the host). The rows of the window sum to its idle "
        "time; 'set apart' (start-up, compilation, capture, work in flight, start-up steps) and 'outside window' "
        "are the profile's idle time outside the steady window. Empty when the GPU was not measured."
    ),
    key=", ".join(GPU_CAUSES + OUTSIDE),
    columns={
        "idle_ns": "GPU idle time with this cause, ns.",
        "in_window": "Whether the row is of the steady window (the other rows are outside it).",
        "share_of_idle": "idle_ns / the window's GPU idle time (0..1; the window's rows sum to 1).",
        "share_of_window": "idle_ns / window (0..1).",
        "per_step_ns": "idle_ns per steady step, ns (the window counts as one step where it has none).",
    },
)
def gpu_idle_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    if f.window_ns <= 0 or f.model is None:
        return None
    part = f.model.partition
    if not part.on_gpu:
        return with_notes(None, f.gpu_not_measured_note)
    rows = {name: part.causes[name].length for name in GPU_CAUSES}
    rows.update({name: part.outside.get(name, iv.EMPTY).length for name in OUTSIDE})
    out = pd.DataFrame({"idle_ns": pd.Series(rows, dtype="int64")})
    inside = out.index.isin(GPU_CAUSES)
    out["in_window"] = inside
    idle = part.idle_ns
    out["share_of_idle"] = np.where(inside, f.ratio(out["idle_ns"], idle), np.nan)
    out["share_of_window"] = np.where(inside, f.ratio(out["idle_ns"], f.window_ns), np.nan)
    out["per_step_ns"] = np.where(inside, out["idle_ns"] / max(part.steps, 1), np.nan)
    return out

