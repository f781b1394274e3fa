"""Operator Summary and its per-operator kernel detail.

Rows aggregate the calls of one operator name at one level: top-level calls (not nested in
another operator) under the plain name, nested calls under "name (nested)". Summing the
top-level rows never counts a nested operator twice; the nested rows are there for rules
that need the inner operators' shapes (aten::addmm under aten::linear). GPU time of a call
is the GPU work launched anywhere inside it, found by walking each GPU event's ``parent_op``
chain, so it is inclusive at both levels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step.facts import (
    Facts,
    coded,
    decode,
    most_common,
    stats,
    sums_by,
    top_names,
)
from advisor.tables._op_costs import add_rates, op_calls, per_call
from advisor.tables._registry import table, with_notes

TOP_KERNELS = 3


@table(
    "operator",
    title="Operator Summary",
    description=(
        "One row per operator name and level. Top-level rows (key = the name) hold calls "
        "not nested in another operator: they never double count, and on one thread they sum "
        "to at most the window. Nested rows (key = 'name (nested)') hold the calls made inside "
        "another operator. CPU time is the call's duration; GPU time is the duration of the GPU "
        "work (kernels, copies, sets) launched inside the call, summed. Ratios are of the "
        "window, as in the Paddle profiler (several threads can take the sum above 1)."
    ),
    key="The operator name, with ' (nested)' appended for nested calls",
    columns={
        "name": "Operator name.",
        "level": "'top' (not inside another operator) or 'nested'.",
        "calls": "Calls in the window.",
        "cpu_total_ns": "Sum of the calls' durations, ns.",
        "cpu_avg_ns": "Mean call duration, ns.",
        "cpu_max_ns": "Longest call, ns.",
        "cpu_min_ns": "Shortest call, ns.",
        "cpu_ratio": "cpu_total_ns / window.",
        "gpu_total_ns": "GPU time of the work the calls launched, ns (NaN: GPU not measured).",
        "gpu_avg_ns": "Mean per call, ns (calls launching nothing count as 0).",
        "gpu_max_ns": "Largest per call, ns.",
        "gpu_min_ns": "Smallest per call, ns.",
        "gpu_ratio": "gpu_total_ns / window.",
        "kernel_count": "Kernels launched by the calls.",
        "top_kernels": f"Up to {TOP_KERNELS} kernels with the most GPU time, '; '-separated.",
        "input_dims": "Most common input shapes (as recorded, JSON text); '' where not recorded.",
        "input_types": "Most common input dtypes (as recorded); '' where not recorded.",
        "flops": "Sum of the calls' FLOPs: the trace's own where it records them, else advisor's cost model "
                 "(roofline table); NaN where neither knows.",
        "bytes": "Bytes the calls read and wrote, from the cost model; NaN where unknown.",
        "ideal_ns": "Their ideal time on the target device (roofline table), ns.",
        "efficiency": "ideal_ns / measured time (GPU time where measured, else CPU time), 0..1.",
        "achieved_flops_per_s": "flops / measured time.",
        "achieved_bytes_per_s": "bytes / measured time.",
    },
)
def operator_table(f: Facts) -> pd.DataFrame | None:
    calls = op_calls(f)
    ops, codes = calls.ops, calls.codes
    if not len(ops):
        return None
    pair_call, pair_gpu = calls.pair_call, calls.pair_gpu
    out = stats(codes, (ops["end_ns"] - ops["start_ns"]).to_numpy(), prefix="cpu")
    row_codes = out.index.to_numpy()
    out["name"] = calls.names(row_codes)
    out["level"] = np.where(row_codes % 2 == 1, "nested", "top")

    gpu = f.gpu
    duration = (gpu["end_ns"] - gpu["start_ns"]).to_numpy()[pair_gpu]
    per_call = np.bincount(pair_call, weights=duration, minlength=len(ops)).astype(np.int64)
    gpu_stats = stats(codes, per_call, prefix="gpu")
    for column in ("gpu_total_ns", "gpu_avg_ns", "gpu_max_ns", "gpu_min_ns"):
        out[column] = gpu_stats[column]
    is_kernel = (gpu["kind"] == "kernel").to_numpy()[pair_gpu]
    kernels = np.bincount(pair_call[is_kernel], minlength=len(ops))
    out["kernel_count"] = pd.Series(kernels).groupby(codes, sort=True).sum().astype("int64")
    name_codes, name_labels = f.name_codes
    kernel_names = name_codes[gpu["id"].to_numpy()[pair_gpu[is_kernel]]]
    top = top_names(codes[pair_call[is_kernel]], kernel_names, duration[is_kernel], limit=TOP_KERNELS, labels=name_labels)
    out["top_kernels"] = top.reindex(out.index).fillna("")
    for column in ("input_dims", "input_types"):
        values, labels = coded(ops[column])
        out[column] = decode(most_common(codes, values, missing=-1).reindex(out.index), labels)
    flops = ops["flops"].to_numpy()
    known = ~np.isnan(flops)
    out["flops"] = pd.Series(flops[known]).groupby(codes[known], sort=True).sum().reindex(out.index)

    _roofline_columns(f, out, calls.keys(row_codes))
    if not f.gpu_measured:
        for column in ("gpu_total_ns", "gpu_avg_ns", "gpu_max_ns", "gpu_min_ns"):
            out[column] = np.nan
        with_notes(out, f.gpu_not_measured_note)
    out["cpu_ratio"] = f.ratio(out["cpu_total_ns"], f.window_ns)
    out["gpu_ratio"] = f.ratio(out["gpu_total_ns"], f.window_ns)
    out.index = calls.keys(row_codes)
    out["_order"] = row_codes % 2
    return out.sort_values(["_order", "cpu_total_ns"], ascending=[True, False], kind="stable")


def _roofline_columns(f: Facts, out: pd.DataFrame, keys: np.ndarray) -> None:
    """Bytes, ideal time and efficiency per operator row, from the roofline's costed calls
    (only calls whose cost is known count, each FLOP once)."""
    costed = per_call(f)
    for column in ("bytes", "ideal_ns", "efficiency", "achieved_flops_per_s", "achieved_bytes_per_s"):
        out[column] = np.nan
    if costed is None:
        return
    by_operator = sums_by(costed["operator"].to_numpy(), {c: costed[c].to_numpy() for c in
                                                          ("flops", "bytes", "measured_ns", "ideal_ns")},
                          unknown_if_none=("measured_ns", "ideal_ns"))
    add_rates(by_operator)
    aligned = by_operator.reindex(pd.Index(keys))
    for column in ("bytes", "ideal_ns", "efficiency", "achieved_flops_per_s", "achieved_bytes_per_s"):
        out[column] = aligned[column].to_numpy()
    # The trace's own FLOPs (with_flops) where present, else the model's.
    out["flops"] = out["flops"].where(out["flops"].notna(), aligned["flops"].to_numpy())


@table(
    "operator_kernels",
    title="Operator Kernel Detail",
    description=(
        "The GPU work of each operator row, by kernel (copies and sets appear under their own "
        "names). An operator row's detail rows sum to its gpu_total_ns."
    ),
    key="'<operator key> -> <kernel name>'",
    columns={
        "operator": "The operator table's row key.",
        "kernel": "Kernel (or copy / set) name.",
        "calls": "Launches of this kernel inside the operator's calls.",
        "gpu_total_ns": "Sum of their durations, ns.",
        "gpu_avg_ns": "Mean duration, ns.",
        "ratio": "gpu_total_ns / the operator's gpu_total_ns (0..1).",
    },
)
def operator_kernels_table(f: Facts) -> pd.DataFrame | None:
    calls = op_calls(f)
    if not len(calls.pair_call):
        return None
    gpu = f.gpu
    name_codes, labels = f.name_codes
    width = len(labels) + 1
    kernel_codes = name_codes[gpu["id"].to_numpy()[calls.pair_gpu]]
    op_codes = calls.codes[calls.pair_call]
    groups, inverse = np.unique(op_codes * width + (kernel_codes + 1), return_inverse=True)
    duration = (gpu["end_ns"] - gpu["start_ns"]).to_numpy()[calls.pair_gpu]
    count = np.bincount(inverse, minlength=len(groups))
    total = np.bincount(inverse, weights=duration, minlength=len(groups)).astype(np.int64)
    op_of = groups // width
    op_total = pd.Series(total).groupby(op_of).transform("sum").to_numpy()
    operator = calls.keys(op_of)
    kernel = decode(groups % width - 1, labels)
    out = pd.DataFrame(
        {
            "operator": operator,
            "kernel": kernel,
            "calls": count,
            "gpu_total_ns": total,
            "gpu_avg_ns": total / count,
            "ratio": f.ratio(total, op_total),
        },
        index=[f"{o} -> {k}" for o, k in zip(operator, kernel)],
    )
    return out.sort_values(["operator", "gpu_total_ns"], ascending=[True, False], kind="stable")
