"""Roofline Ceilings: the peaks the Roofline Summary judges ops against, one row per unit
and dtype it used, so a report can draw the roofline's ceilings from a table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.knowledge import hardware as kb
from advisor.step.facts import Facts
from advisor.tables._op_costs import call_target, per_call
from advisor.tables._registry import table, with_notes

# Units in the per-call roofline rows that have no device ceiling to draw.
_NO_CEILING = ("", "host-device copy")


@table(
    "roofline_ceilings",
    title="Roofline Ceilings",
    description=(
        "The target device's peaks behind the Roofline Summary's ideal times, one row per "
        "compute unit and dtype that its rows use: peak FLOP/s, peak memory bandwidth and the "
        "arithmetic intensity where the two meet (the ridge point). An op whose FLOPs per byte "
        "lie left of the ridge is bound by memory, right of it by compute. Empty where no "
        "target device is known."
    ),
    key="'<unit> <dtype>', e.g. 'tensor cores bf16'",
    columns={
        "target": "The device the peaks are for.",
        "unit": "'tensor cores' or 'cuda cores' (NVIDIA), 'matrix cores' or 'vector units' (AMD), or 'cpu'.",
        "dtype": "Compute dtype.",
        "peak_flops_per_s": "Peak FLOP/s for the unit and dtype (NaN: not known).",
        "peak_bytes_per_s": "Peak memory bandwidth, bytes/s (NaN: not known).",
        "ridge_flops_per_byte": "peak_flops_per_s / peak_bytes_per_s: the intensity where compute "
                                "starts to bound, FLOP/byte.",
        "ops": "Roofline Summary rows (operator and shapes) judged against this ceiling.",
    },
)
def ceilings_table(f: Facts) -> pd.DataFrame | None:
    calls = per_call(f)
    if calls is None:
        return None
    target, note = call_target(f)
    if target is None:
        return with_notes(None, note)
    # A call whose dtype the cost model could not tell has no peak to look up.
    used = calls[~calls["unit"].isin(_NO_CEILING) & ~calls["dtype"].isin(("", "None"))]
    if not len(used):
        return None
    rows = {}
    bandwidth = target.bandwidth()
    for (unit, dtype), group in used.groupby(["unit", "dtype"], sort=True):
        peak = target.peak(str(dtype), tensor_core=unit in kb.MATRIX_UNITS)
        rows[f"{unit} {dtype}"] = {
            "target": target.name,
            "unit": unit,
            "dtype": dtype,
            "peak_flops_per_s": float(peak) if peak else np.nan,
            "peak_bytes_per_s": float(bandwidth) if bandwidth else np.nan,
            "ops": int(group["key"].nunique()),
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["ridge_flops_per_byte"] = f.ratio(out["peak_flops_per_s"], out["peak_bytes_per_s"])
    return with_notes(out, note)
