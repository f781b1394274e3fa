"""GPU Idle Breakdown: what the host was doing while the GPU had nothing to run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.tables._facts import Facts
from advisor.tables._registry import table, with_notes
from advisor.tables.gpu_idle_host import IDLE_STATES, idle_by_host_state


@table(
    "gpu_idle",
    title="GPU Idle Breakdown",
    description=(
        "Time in the window when no GPU work ran (kernels, copies or sets, on any device), "
        "split by why: work already launched but not started (work queued: the device waited on "
        "an event, another stream or a peer, not on the host), else by what the host was doing: "
        "in a Dataloader phase (data loading), in a "
        "blocking call of the host_sync table (blocking sync), in an operator or CUDA API call "
        "(launching: the host is dispatching work but none has reached the GPU), or none of "
        "these (other: Python, or outside the recorded ranges; the gpu_idle_host table says "
        "where). Where several apply, the first in that order takes the time. Empty when the GPU was not measured."
    ),
    key="work queued, data loading, blocking sync, launching, other",
    columns={
        "idle_ns": "GPU idle time with the host in this state, ns.",
        "share_of_idle": "idle_ns / all GPU idle time (0..1; the rows sum to 1).",
        "share_of_window": "idle_ns / window (0..1).",
        "per_step_ns": "idle_ns per step, ns (NaN without steps).",
    },
)
def gpu_idle_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    if f.window_ns <= 0:
        return None
    split = idle_by_host_state(f)
    idle = split["idle"]
    totals = {name: split[name].length for name in IDLE_STATES}
    out = pd.DataFrame({"idle_ns": pd.Series(totals, dtype="int64")})
    out["share_of_idle"] = f.ratio(out["idle_ns"], idle.length)
    out["share_of_window"] = f.ratio(out["idle_ns"], f.window_ns)
    out["per_step_ns"] = out["idle_ns"] / len(f.steps) if f.has_steps else np.nan
    return out
