"""Kernel Summary: one row per kernel name."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.knowledge import hardware as kb
from advisor.knowledge.costs import kernel_costs
from advisor.knowledge.roofline import MATRIX_KINDS, compute_dtypes
from advisor.step.facts import Facts, coded, decode, most_common, stats, sums_by, top_names
from advisor.tables._op_costs import (
    TENSOR_DTYPES,
    add_rates,
    call_target,
    ideal_parts,
    op_calls,
    op_cost_groups,
    per_call,
)
from advisor.tables._registry import table

TOP_OPS = 5
_COLUMNS_READ = ("kind", "name", "start_ns", "end_ns", "grid", "block", "registers", "shared_memory", "flops",
                  "top_op", "parent_op")


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
        "flops": "Sum of FLOPs: the trace's own where recorded, else the cost model's for kernels that are "
                 "their op's only kernel; NaN otherwise.",
        "bytes": "Bytes read and written, from the cost model (as flops); NaN otherwise.",
        "ideal_ns": "Ideal time on the target device (roofline), over the calls with a known cost, ns.",
        "efficiency": "ideal_ns / the same calls' measured time (0..1).",
        "achieved_flops_per_s": "flops / the same calls' measured time.",
        "achieved_bytes_per_s": "bytes / the same calls' measured time.",
        "ops": f"Up to {TOP_OPS} top-level operators that launched it, most GPU time first, '; '-separated.",
    },
)
def kernel_table(f: Facts) -> pd.DataFrame | None:
    gpu = f.gpu
    # The columns read here and by kernel_costs, not a copy of every column of the kernel
    # rows (the GPU frame's blank ones too, made whole by the copy): a large trace's peak.
    kernels = gpu.loc[(gpu["kind"] == "kernel").to_numpy(), list(_COLUMNS_READ)]
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
    _roofline_columns(f, kernels, names, duration, out)
    top_op = kernels["top_op"].to_numpy()
    launched = top_op >= 0
    name_codes, name_labels = f.name_codes
    ops = top_names(names[launched], name_codes[top_op[launched]], duration[launched], limit=TOP_OPS, labels=name_labels)
    out["ops"] = ops.reindex(out.index).fillna("")
    out.index = decode(out.index.to_numpy(), labels)
    return out.sort_values("gpu_total_ns", ascending=False, kind="stable")


def _roofline_columns(f: Facts, kernels: pd.DataFrame, names: np.ndarray, duration: np.ndarray,
                      out: pd.DataFrame) -> None:
    """Cost-model FLOPs, bytes, ideal time and efficiency per kernel name, for kernels that
    are the only kernel of an op with a known cost (advisor.knowledge.costs.kernel_costs)."""
    for column in ("bytes", "ideal_ns", "efficiency", "achieved_flops_per_s", "achieved_bytes_per_s"):
        out[column] = np.nan
    ops = op_calls(f).ops
    costs = kernel_costs(kernels, ops=ops, groups=op_cost_groups(f))
    flops = costs["flops"].to_numpy(dtype=float)
    known = ~np.isnan(flops)
    if not known.any():
        return
    costed = per_call(f)
    target = call_target(f)[0] if costed is not None else None
    rows = np.flatnonzero(known)  # only these are costed: the rest are judged no further
    flops = flops[rows]
    dtype = compute_dtypes(costs["dtype"].to_numpy()[rows])
    kind = costs["kind"].to_numpy()[rows].astype(str)
    names_of = kernels["name"].astype("category")  # judged once per distinct kernel name
    verdicts = np.array([kb.uses_tensor_cores(str(n)) is True for n in names_of.cat.categories] + [False], dtype=bool)
    codes = names_of.cat.codes.to_numpy()[rows]
    tensor_name = verdicts[np.where(codes >= 0, codes, len(verdicts) - 1)]
    tensor = np.isin(kind, MATRIX_KINDS) & (np.isin(dtype.astype(str), TENSOR_DTYPES) | tensor_name)
    nbytes = costs["bytes"].to_numpy(dtype=float)[rows]
    compute_ns, memory_ns, _ = ideal_parts(target, dtype, tensor, flops, nbytes)
    per_name = sums_by(names[rows], {"flops": flops, "bytes": nbytes, "measured_ns": duration[rows].astype(float),
                                     "ideal_ns": np.fmax(compute_ns, memory_ns)}, unknown_if_none=("ideal_ns",))
    add_rates(per_name)
    aligned = per_name.reindex(out.index)
    for column in ("bytes", "ideal_ns", "efficiency", "achieved_flops_per_s", "achieved_bytes_per_s"):
        out[column] = aligned[column].to_numpy()
    out["flops"] = out["flops"].where(out["flops"].notna(), aligned["flops"].to_numpy())
