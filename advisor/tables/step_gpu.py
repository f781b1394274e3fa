"""Step GPU Balance: per recorded step, the GPU's work against the host's.

What a fix that shortens the host's part of a step can win depends on what the GPU does in
that step: the step cannot get shorter than the GPU's own busy time, and where the host
waits for the GPU once a step (a ``.item()``, a copy from pageable memory), the GPU's
work still running after the host's last launch (the tail) is added back to every step.
The rules read the "mean" row; the per-step rows are the evidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts, unique_keys
from advisor.step.waits import blocking_calls
from advisor.tables._registry import table, with_notes

SHORT_KERNEL_NS = 10_000  # a kernel this short costs about what launching it does


@table(
    "step_gpu",
    title="Step GPU Balance",
    description=(
        "Per recorded step: the host's step time, the GPU's busy time for the work launched "
        "in the step (the union of its kernels, copies and sets, wherever they ran), the "
        "kernels and how many ran under 10 us, the host calls that launched GPU work, the "
        "tail (how long the step's GPU work ran on after the host's last launch call of the "
        "step returned) and the host's blocking waits on the GPU in the step. The 'mean' "
        "row averages the steps; without steps the window is one row. Empty when the GPU "
        "was not measured."
    ),
    key="'step N' for each recorded step, then 'mean' ('window' when there are no steps)",
    columns={
        "step_ns": "The step's length on the host, ns.",
        "gpu_busy_ns": "GPU busy time of the work launched in the step, ns.",
        "kernels": "Kernels launched in the step.",
        "short_kernels": "Those that ran under 10 us.",
        "launches": "Host calls that launched GPU work in the step.",
        "tail_ns": "How long the step's GPU work ran after the host's last launch call of the step returned, ns "
                   "(0 when the GPU had already finished).",
        "blocking_calls": "Host calls in the step that waited for the GPU (the host_sync table's).",
        "blocking_ns": "Their time, ns.",
    },
)
def step_gpu_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    if f.window_ns <= 0:
        return None
    ev = f.events
    gpu = f.gpu
    if f.has_steps:
        steps = f.steps
        keys = list(unique_keys([f"step {int(s)}" for s in steps["step"]]))
        step_ns = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype="int64")
        gpu_pos = f.step_positions(gpu)
    else:
        keys, step_ns = ["window"], np.array([f.window_ns], dtype="int64")
        gpu_pos = np.zeros(len(gpu), dtype=np.int64)
    n = len(keys)
    rows = {c: np.zeros(n, dtype="int64") for c in ("gpu_busy_ns", "kernels", "short_kernels", "launches",
                                                     "tail_ns", "blocking_calls", "blocking_ns")}
    start, end = gpu["start_ns"].to_numpy(), gpu["end_ns"].to_numpy()
    is_kernel = (gpu["kind"] == "kernel").to_numpy()
    launch = gpu["launch"].to_numpy()
    launch_end = np.where(launch >= 0, ev["end_ns"].to_numpy()[np.maximum(launch, 0)], -1)
    # Each step's GPU rows as one slice of a stable sort by step: linear in the events,
    # where a mask per step would cost steps x events.
    order = np.argsort(gpu_pos, kind="stable")
    bounds = np.searchsorted(gpu_pos[order], np.arange(n + 1))
    for pos in range(n):
        mine = order[bounds[pos]:bounds[pos + 1]]
        if not len(mine):
            continue
        s, e, kernel = start[mine], end[mine], is_kernel[mine]
        rows["gpu_busy_ns"][pos] = iv.union(iv.Intervals(s, e)).length
        rows["kernels"][pos] = int(kernel.sum())
        rows["short_kernels"][pos] = int((kernel & (e - s < SHORT_KERNEL_NS)).sum())
        launched = launch[mine] >= 0
        rows["launches"][pos] = len(np.unique(launch[mine][launched]))
        if launched.any():
            rows["tail_ns"][pos] = max(int(e.max() - launch_end[mine][launched].max()), 0)
    calls = blocking_calls(f)
    if len(calls):
        call_step = ev["step"].to_numpy()[calls["row"].to_numpy()]
        call_pos = (pd.Series(call_step).map(f.step_index).fillna(-1).to_numpy(dtype=np.int64)
                    if f.has_steps else np.zeros(len(calls), dtype=np.int64))
        took = (calls["end_ns"] - calls["start_ns"]).to_numpy()
        ok = call_pos >= 0
        np.add.at(rows["blocking_calls"], call_pos[ok], 1)
        np.add.at(rows["blocking_ns"], call_pos[ok], took[ok])
    out = pd.DataFrame({"step_ns": step_ns, **rows}, index=keys)
    if f.has_steps:
        out = pd.concat([out.astype("float64"), out.mean(axis=0).to_frame("mean").T])
    return out
