"""Roofline Summary: how far each op (by name and shapes) is from the hardware's limit.

One row per operator name and input shapes, over the calls whose cost advisor.costs can
model (each FLOP counted once: aten::linear, not also the aten::addmm inside it). Measured
time is the GPU time of the work the calls launched where the GPU was measured, else their
CPU time. Ideal time is max(flops / peak FLOP/s, bytes / peak bandwidth) on the target
device (advisor.roofline); efficiency = ideal / measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor import knowledge as kb
from advisor.costs import costs_for_ops
from advisor.roofline import MATRIX_KINDS, compute_dtype, resolve_target
from advisor.tables._facts import Facts
from advisor.tables._registry import table, with_notes
from advisor.tables.operator import NESTED_SUFFIX, _calls

TENSOR_DTYPES = ("fp16", "bf16", "fp8", "int8")
DIMS = ("m", "n", "k", "batch", "c_in", "c_out", "groups")


@table(
    "roofline",
    title="Roofline Summary",
    description=(
        "One row per operator name and input shapes, for the calls whose FLOPs and bytes "
        "advisor can model from the recorded shapes and dtypes. Measured time is the GPU work "
        "the calls launched (CPU time where no GPU was measured); ideal time is "
        "max(flops / peak FLOP/s, bytes / peak bandwidth) on the target device for the unit "
        "the op can use; efficiency = ideal / measured. Judged against a device the session "
        "did not run on (--gpu), measured times are empty and the ideal times are the target's."
    ),
    key="'<operator> <input shapes>'",
    columns={
        "name": "Operator name.",
        "input_dims": "Input shapes as recorded (JSON text).",
        "kind": "gemm, conv, attention, elementwise, reduction, norm, embedding, copy...",
        "dtype": "Compute dtype (fp32, bf16, fp16...).",
        "calls": "Calls in the window.",
        "flops": "FLOPs over the calls.",
        "bytes": "Bytes read and written over the calls.",
        "measured_ns": "Measured time over the calls, ns (NaN: not measured on the target).",
        "ideal_ns": "Ideal time over the calls on the target, ns (NaN: no peak known).",
        "efficiency": "ideal_ns / measured_ns (0..1).",
        "lost_ns": "measured_ns - ideal_ns: the time above the roofline, ns.",
        "achieved_flops_per_s": "flops / measured time.",
        "achieved_bytes_per_s": "bytes / measured time.",
        "bound": "'compute' or 'memory': which ceiling sets the ideal time.",
        "unit": "'tensor cores', 'cuda cores' or 'cpu': the unit the ideal time assumes ('host-device copy': "
                "no device roofline applies, the interconnect bounds it).",
        "tensor_core_kernels": "Whether the launched kernels use tensor cores, from their names: "
                               "'yes', 'no', 'mixed' or '' (unknown).",
        **{d: f"GEMM/convolution dimension {d} where it applies (NaN otherwise)." for d in DIMS},
        "target": "The device the ideal time is for.",
        "target_id": "Its knowledge-base id ('cpu' for this machine's calibrated peaks; '' for none).",
        "measured_on_target": "Whether measured_ns was measured on the target device.",
    },
)
def roofline_table(f: Facts) -> pd.DataFrame | None:
    calls = per_call(f)
    if calls is None:
        return None
    target = calls.attrs["target"]
    grouped = calls.groupby("key", sort=False)
    out = grouped.agg(
        name=("name", "first"), input_dims=("input_dims", "first"), kind=("kind", "first"),
        dtype=("dtype", "first"), calls=("name", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        measured_ns=("measured_ns", lambda s: s.sum(min_count=1)), ideal_ns=("ideal_ns", lambda s: s.sum(min_count=1)),
        compute_ns=("compute_ns", "sum"), memory_ns=("memory_ns", "sum"), unit=("unit", "first"),
        tc_yes=("tc_yes", "sum"), tc_no=("tc_no", "sum"),
        **{d: (d, "first") for d in DIMS},
    )
    add_rates(out)
    out["bound"] = np.where(out["ideal_ns"].isna(), "",
                            np.where(out["compute_ns"] >= out["memory_ns"], "compute", "memory"))
    out["tensor_core_kernels"] = np.select(
        [(out["tc_yes"] > 0) & (out["tc_no"] > 0), out["tc_yes"] > 0, out["tc_no"] > 0], ["mixed", "yes", "no"], "")
    out["target"] = target.name if target is not None else ""
    out["target_id"] = (target.profile.id if target.profile is not None else "cpu") if target is not None else ""
    out["measured_on_target"] = out["measured_ns"].notna()
    with_notes(out, calls.attrs["note"])
    # Most time above the roofline first; where nothing was measured, most ideal time first.
    order = out["lost_ns"].fillna(-1) if out["measured_ns"].notna().any() else out["ideal_ns"].fillna(-1)
    return out.assign(_order=order).sort_values("_order", ascending=False, kind="stable")


def add_rates(out: pd.DataFrame) -> None:
    """efficiency, lost_ns and the achieved rates from flops, bytes, measured_ns, ideal_ns."""
    measured = out["measured_ns"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["efficiency"] = np.where(measured > 0, np.minimum(out["ideal_ns"] / measured, 1.0), np.nan)
        out["lost_ns"] = np.maximum(measured - out["ideal_ns"], 0)
        out["achieved_flops_per_s"] = np.where(measured > 0, out["flops"] / measured * 1e9, np.nan)
        out["achieved_bytes_per_s"] = np.where(measured > 0, out["bytes"] / measured * 1e9, np.nan)


def per_call(f: Facts) -> pd.DataFrame | None:
    """One row per costed op call (each FLOP once): its cost, measured and ideal time on
    the target. Shared by the roofline, operator and kernel tables (memoised per session);
    ``attrs`` carries the target and a note on where its figures come from."""
    return f.memo("roofline_calls", lambda: _per_call(f))


def _per_call(f: Facts) -> pd.DataFrame | None:
    target, why = resolve_target(f.session)
    calls = _calls(f)
    ops = calls.ops
    if not len(ops):
        return None
    costs = costs_for_ops(ops)
    counted = costs["counted"].to_numpy(dtype=bool)
    if not counted.any():
        return None
    positions = np.flatnonzero(counted)
    rows = ops.iloc[positions]
    cost = costs.iloc[positions]

    gpu_here = f.gpu_measured and (target is None or target.measured_here)
    if gpu_here:
        gpu = f.gpu
        duration = (gpu["end_ns"] - gpu["start_ns"]).to_numpy()[calls.pair_gpu]
        per_op = np.bincount(calls.pair_call, weights=duration, minlength=len(ops))
        measured = per_op[positions]
        tc_yes, tc_no = _tensor_core_kernels(f, calls, len(ops))
        tc_yes, tc_no = tc_yes[positions], tc_no[positions]
    elif target is None or target.measured_here:
        measured = (rows["end_ns"] - rows["start_ns"]).to_numpy().astype(float)
        tc_yes = tc_no = np.zeros(len(rows), dtype=np.int64)
    else:
        measured = np.full(len(rows), np.nan)
        tc_yes = tc_no = np.zeros(len(rows), dtype=np.int64)

    kind = cost["kind"].astype(str).to_numpy()
    dtype = np.array([compute_dtype(d) for d in cost["dtype"].astype(object).to_numpy()], dtype=object)
    flops = cost["flops"].to_numpy(dtype=float)
    nbytes = cost["bytes"].to_numpy(dtype=float)
    matrix = np.isin(kind, MATRIX_KINDS)
    # Tensor cores: half-precision matrix work always can; fp32 matrix work only as TF32,
    # which shows where its kernels are tensor-core kernels.
    tensor = matrix & (np.isin(dtype.astype(str), TENSOR_DTYPES) | ((dtype == "fp32") & (tc_yes > 0)))
    compute_ns, memory_ns, unit = ideal_parts(target, dtype, tensor, flops, nbytes)
    if gpu_here:
        # A copy between host and device is bound by the interconnect, not by device
        # memory: no device roofline applies (sync-memcpy-stall judges those copies).
        crossing = _host_device_copies(f, calls, len(ops))[positions]
        compute_ns[crossing] = np.nan
        memory_ns[crossing] = np.nan
        unit[crossing] = "host-device copy"

    name = rows["name"].astype(str).to_numpy()
    dims_text = rows["input_dims"].astype(str).to_numpy()
    ids = rows["id"].to_numpy()
    top = rows["top_op"].to_numpy()
    out = pd.DataFrame({
        "id": ids,
        "key": [f"{n} {d}".rstrip() for n, d in zip(name, dims_text)],
        "operator": np.where((top >= 0) & (top != ids), np.char.add(name.astype(str), NESTED_SUFFIX), name),
        "name": name, "input_dims": dims_text, "kind": kind, "dtype": dtype.astype(str),
        "flops": flops, "bytes": nbytes, "measured_ns": measured, "ideal_ns": np.fmax(compute_ns, memory_ns),
        "compute_ns": compute_ns, "memory_ns": memory_ns, "unit": unit,
        "tc_yes": tc_yes, "tc_no": tc_no,
        **{d: pd.to_numeric(cost[d], errors="coerce").to_numpy(dtype=float) for d in DIMS},
    })
    out.attrs["target"] = target
    out.attrs["note"] = f"Target: {target.how}." if target is not None else f"Ideal times not computed: {why}"
    return out


def ideal_parts(target, dtype: np.ndarray, tensor: np.ndarray, flops: np.ndarray,
                nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute-bound and memory-bound ideal times (ns) and the unit assumed, per row."""
    n = len(flops)
    compute_ns = np.full(n, np.nan)
    memory_ns = np.full(n, np.nan)
    unit = np.full(n, "", dtype=object)
    if target is None:
        return compute_ns, memory_ns, unit
    bandwidth = target.bandwidth()
    peaks: dict[tuple, float | None] = {}
    for i in range(n):
        key = (dtype[i], bool(tensor[i]))
        if key not in peaks:
            peaks[key] = target.peak(dtype[i], tensor_core=key[1])
        peak = peaks[key]
        compute_ns[i] = flops[i] / peak * 1e9 if peak else np.nan
        memory_ns[i] = nbytes[i] / bandwidth * 1e9 if bandwidth else np.nan
    unit[:] = "cpu" if target.kind == "cpu" else np.where(tensor, "tensor cores", "cuda cores")
    return compute_ns, memory_ns, unit


def _host_device_copies(f: Facts, calls, n_ops: int) -> np.ndarray:
    """Per op call: whether it launched a copy between host and device memory."""
    gpu = f.gpu
    kinds = gpu["copy_kind"].astype(str).to_numpy()[calls.pair_gpu]
    crossing = np.isin(kinds, ("HtoD", "DtoH"))
    return np.bincount(calls.pair_call[crossing], minlength=n_ops) > 0


def _tensor_core_kernels(f: Facts, calls, n_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op call: how many of the kernels it launched are tensor-core kernels by name,
    and how many are known not to be."""
    gpu = f.gpu
    is_kernel = (gpu["kind"] == "kernel").to_numpy()[calls.pair_gpu]
    name_codes, labels = f.name_codes
    verdict = np.array([kb.uses_tensor_cores(str(n)) for n in labels] + [None], dtype=object)
    codes = name_codes[gpu["id"].to_numpy()[calls.pair_gpu]]
    per_pair = verdict[np.where(codes >= 0, codes, len(labels))]
    yes = is_kernel & (per_pair == True)  # noqa: E712  (an object array of True/False/None)
    no = is_kernel & (per_pair == False)  # noqa: E712
    return (np.bincount(calls.pair_call[yes], minlength=n_ops), np.bincount(calls.pair_call[no], minlength=n_ops))
