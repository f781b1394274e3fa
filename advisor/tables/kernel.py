"""Kernel Summary: one row per kernel name."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.tables._facts import Facts, coded, decode, most_common, stats, top_names
from advisor.tables._registry import table

TOP_OPS = 5


@table(
    "kernel",
    title="Kernel Summary",
    description=(
        "One row per kernel name over the window's kernels (work queued in a step counts "
        "even if it ran after the step ended). Launch configuration columns give the most "
        "common value over the calls. Empty when the GPU was not measured."
    ),
    key="The kernel name",
    columns={
        "calls": "Launches.",
        "gpu_total_ns": "Sum of durations, ns.",
        "gpu_avg_ns": "Mean duration, ns.",
        "gpu_max_ns": "Longest, ns.",
        "gpu_min_ns": "Shortest, ns.",
        "ratio": "gpu_total_ns / the sum over all kernels (0..1; the rows sum to 1).",
        "grid": "Most common grid dimensions, e.g. '[128, 1, 1]'; '' where not recorded.",
        "block": "Most common block dimensions; '' where not recorded.",
        "registers": "Most common registers per thread; NaN where not recorded.",
        "shared_memory": "Most common shared memory per block, bytes; NaN where not recorded.",
        "flops": "Sum of FLOPs where the trace records them; NaN otherwise.",
        "ops": f"Up to {TOP_OPS} top-level operators that launched it, most GPU time first, '; '-separated.",
    },
)
def kernel_table(f: Facts) -> pd.DataFrame | None:
    gpu = f.gpu
    kernels = gpu[(gpu["kind"] == "kernel").to_numpy()]
    if not len(kernels):
        return None
    names, labels = coded(kernels["name"])
    duration = (kernels["end_ns"] - kernels["start_ns"]).to_numpy()
    out = stats(names, duration, prefix="gpu")
    out["ratio"] = f.ratio(out["gpu_total_ns"], out["gpu_total_ns"].sum())
    for column in ("grid", "block"):
        values, value_labels = coded(kernels[column])
        out[column] = decode(most_common(names, values, missing=-1).reindex(out.index), value_labels)
    for column in ("registers", "shared_memory"):
        common = most_common(names, kernels[column].to_numpy(), missing=-1)
        out[column] = pd.to_numeric(common.reindex(out.index), errors="coerce")
    flops = kernels["flops"].to_numpy()
    known = ~np.isnan(flops)
    out["flops"] = pd.Series(flops[known]).groupby(names[known], sort=True).sum().reindex(out.index)
    top_op = kernels["top_op"].to_numpy()
    launched = top_op >= 0
    name_codes, name_labels = f.name_codes
    ops = top_names(names[launched], name_codes[top_op[launched]], duration[launched], limit=TOP_OPS, labels=name_labels)
    out["ops"] = ops.reindex(out.index).fillna("")
    out.index = decode(out.index.to_numpy(), labels)
    return out.sort_values("gpu_total_ns", ascending=False, kind="stable")
