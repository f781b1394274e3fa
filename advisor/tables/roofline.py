"""Roofline Summary: how far each op (by name and shapes) is from the hardware's limit.

One row per operator name and input shapes, over the calls whose cost advisor.knowledge.costs can
model (each FLOP counted once: aten::linear, not also the aten::addmm inside it). Measured
time is the GPU time of the work the calls launched where the GPU was measured, else their
CPU time. Ideal time is max(flops / peak FLOP/s, bytes / peak bandwidth) on the target
device (advisor.knowledge.roofline); efficiency = ideal / measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step.facts import Facts, Groups
from advisor.tables._op_costs import DIMS, add_rates, call_target, per_call
from advisor.tables._registry import table, with_notes


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
    target, note = call_target(f)
    groups = Groups(calls["key"].to_numpy(), sort=False)  # rows in the order their key first comes
    column = {c: calls[c].to_numpy() for c in calls.columns}
    out = pd.DataFrame({
        **{c: groups.first(column[c]) for c in ("name", "input_dims", "kind", "dtype")},
        "calls": groups.size(),
        **{c: groups.sum(column[c]) for c in ("flops", "bytes", "measured_ns", "ideal_ns", "compute_ns", "memory_ns")},
        "unit": groups.first(column["unit"]),
        **{c: groups.sum(column[c]) for c in ("tc_yes", "tc_no")},
        **{d: groups.first(column[d]) for d in DIMS},
    }, index=pd.Index(groups.keys, name="key"))
    for c in ("measured_ns", "ideal_ns"):  # unknown where no call's time is known, not 0
        out[c] = out[c].where(groups.count(column[c]) > 0)
    add_rates(out)
    out["bound"] = np.where(out["ideal_ns"].isna(), "",
                            np.where(out["compute_ns"] >= out["memory_ns"], "compute", "memory"))
    out["tensor_core_kernels"] = np.select(
        [(out["tc_yes"] > 0) & (out["tc_no"] > 0), out["tc_yes"] > 0, out["tc_no"] > 0], ["mixed", "yes", "no"], "")
    out["target"] = target.name if target is not None else ""
    out["target_id"] = (target.profile.id if target.profile is not None else "cpu") if target is not None else ""
    out["measured_on_target"] = out["measured_ns"].notna()
    with_notes(out, note)
    # Most time above the roofline first; where nothing was measured, most ideal time first.
    order = out["lost_ns"].fillna(-1) if out["measured_ns"].notna().any() else out["ideal_ns"].fillna(-1)
    return out.assign(_order=order).sort_values("_order", ascending=False, kind="stable")
