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

from advisor.knowledge import hardware as kb
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
        "unit": "'tensor cores' or 'cuda cores' (NVIDIA), 'matrix cores' or 'vector units' (AMD), or 'cpu': the "
                "unit the ideal time assumes ('host-device copy': "
                "no device roofline applies, the interconnect bounds it).",
        "tensor_core_kernels": "Whether the launched kernels use tensor (or matrix) cores, from their names: "
                               "'yes', 'no', 'mixed' or '' (unknown).",
        **{d: f"GEMM/convolution dimension {d} where it applies (NaN otherwise)." for d in DIMS},
        "tile": "A GEMM's output tile as its kernel's name gives it (Tensile's MT256x112x64 is '256x112'); '' "
                "where no name does.",
        "tiles": "Output tiles per call: ceil(M / tile rows) x ceil(N / tile columns) x batch (NaN without a tile).",
        "waves": "tiles over the GPU's multiprocessors (SMs, or AMD's compute units), one tile on each at a "
                 "time: 0.03 is 8 tiles on 304 CUs, most of the GPU idle; 1.1 a second wave almost empty.",
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
    _tile_picture(out, groups, column, target)
    out["target"] = target.name if target is not None else ""
    out["target_id"] = (target.profile.id if target.profile is not None else "cpu") if target is not None else ""
    out["measured_on_target"] = out["measured_ns"].notna()
    with_notes(out, note)
    # Most time above the roofline first; where nothing was measured, most ideal time first.
    order = out["lost_ns"].fillna(-1) if out["measured_ns"].notna().any() else out["ideal_ns"].fillna(-1)
    return out.assign(_order=order).sort_values("_order", ascending=False, kind="stable")


def _tile_picture(out: pd.DataFrame, groups: Groups, column: dict, target) -> None:
    """The tile, tiles and waves columns: how a GEMM's output is cut and how much of the
    GPU one call's tiles fill (waves of one tile per multiprocessor, as
    advisor.knowledge.wave_quantization counts them)."""
    tile_m, tile_n = groups.first(column["tile_m"]), groups.first(column["tile_n"])
    known = ~np.isnan(tile_m) & ~np.isnan(tile_n)
    out["tile"] = np.where(known, [f"{int(a)}x{int(b)}" if k else "" for a, b, k in
                                   zip(np.nan_to_num(tile_m), np.nan_to_num(tile_n), known)], "")
    m, n = out["m"].to_numpy(dtype=float), out["n"].to_numpy(dtype=float)
    batch = np.nan_to_num(out["batch"].to_numpy(dtype=float), nan=1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n) * np.maximum(batch, 1.0)
    out["tiles"] = np.where(known & (m > 0) & (n > 0), tiles, np.nan)
    profile = getattr(target, "profile", None)
    slots = profile.sm_count * kb.knowledge().tensor_cores.wave_quantization.tiles_per_sm if profile else np.nan
    out["waves"] = out["tiles"] / slots
