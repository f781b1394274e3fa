"""Kernel Counters: Nsight Compute's hardware counters for the kernels that were profiled.

A session may carry an ncu export (``advisor diagnose --ncu REPORT``, or ``--kernel-counters``
running the script once more under ncu): ``trace_metadata["ncu"]``, one record per profiled
kernel (advisor.importers.ncu). Each is matched to the session's own kernels by name, grid and
block, then by order: the n-th profiled launch of a kernel with that shape is the n-th such
launch in the session (ncu profiles launches in order, after its ``--launch-skip``). A name
is compared by its base (``vectorized_elementwise_kernel``, ``sm80_xmma_gemm_...``): ncu and
CUPTI spell templates and anonymous namespaces differently.

One row per profiled kernel: its counters, the session kernel it is, the op that launched
it, and ncu's own rule verdicts. The rules read it to say *why* a kernel is slow.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.step.facts import Facts
from advisor.tables._registry import table

NCU_KEY = "ncu"
_TEMPLATE_OR_ARGS = re.compile(r"[<(]")


def base_name(name: str) -> str:
    """A kernel name's base: no ``void``, template arguments, parameters or namespaces."""
    text = str(name).strip().removeprefix("void ").strip()
    cut = _TEMPLATE_OR_ARGS.search(text)
    head = text[:cut.start()] if cut else text
    return head.rsplit("::", 1)[-1].strip()


@table(
    "kernel_counters",
    title="Kernel Counters",
    description=(
        "The kernels Nsight Compute profiled (an ncu export the session carries), each matched to the "
        "session's kernel by name, grid, block and order: throughput as a share of the hardware's peak, "
        "occupancy and what limits it, waves, registers, the tensor and FMA pipes' utilisation, and "
        "ncu's own rules with their estimated speedups. Empty without an ncu export."
    ),
    key="'ncu #ID base name'",
    columns={
        "kernel": "The kernel's name as ncu gives it.",
        "matched": "Whether a kernel of the session is this one (same base name, grid and block).",
        "event_id": "The matched session kernel's event id (-1: none).",
        "op": "The operator that launched the matched kernel ('' where none).",
        "session_avg_ns": "The session's mean duration of kernels with this name and shape, ns (NaN: none).",
        "grid": "Grid, '[x,y,z]'.",
        "block": "Block, '[x,y,z]'.",
        "duration_ns": "Duration under ncu, ns (ncu replays a kernel with its clocks as configured).",
        "sm_pct": "Compute (SM) throughput, % of peak.",
        "memory_pct": "Memory throughput, % of peak (the busiest of L1, L2 and DRAM).",
        "dram_pct": "DRAM throughput, % of peak.",
        "achieved_occupancy": "Achieved occupancy, % of the SM's warps.",
        "theoretical_occupancy": "Theoretical occupancy, %.",
        "limiter": "What bounds the theoretical occupancy: registers, shared memory, warps or blocks per SM.",
        "waves": "Waves per SM: blocks over the blocks the GPU runs at once.",
        "registers": "Registers per thread.",
        "tensor_pct": "Tensor pipes' issue utilisation, % of peak (NaN: not collected).",
        "fma_pct": "FMA pipe's issue utilisation, % of peak (NaN: not collected).",
        "rules": "ncu's rules with an estimated speedup: 'Name speedup% (kind)', '; '-separated.",
        "top_rule": "The rule with the largest estimated speedup ('' where none).",
        "top_speedup_pct": "Its estimated speedup, % (NaN: none).",
        "source": "The ncu export the counters come from.",
    },
)
def kernel_counters_table(f: Facts) -> pd.DataFrame | None:
    found = f.meta.trace_metadata.get(NCU_KEY)
    if not isinstance(found, dict) or not found.get("kernels"):
        return None
    records = [r for r in found["kernels"] if isinstance(r, dict)]
    if not records:
        return None
    ev = f.events
    kernels = f.gpu[(f.gpu["kind"] == "kernel").to_numpy()] if len(f.gpu) else f.gpu
    if not len(kernels):  # a window without kernels: match against the whole session
        kernels = ev[(ev["kind"] == "kernel").to_numpy()]
    kernels = kernels.sort_values("start_ns", kind="stable")
    keys = pd.Series([base_name(n) for n in kernels["name"].astype(str)], index=kernels.index)
    shape = keys + "|" + kernels["grid"].astype(str).str.replace(" ", "") + "|" + \
        kernels["block"].astype(str).str.replace(" ", "")
    by_shape = {key: group for key, group in kernels.groupby(shape.to_numpy(), sort=False)}
    taken: dict[str, int] = {}
    names = ev["name"].astype(str).to_numpy() if len(ev) else np.zeros(0, dtype=object)
    rows = {}
    for record in records:
        base = base_name(record.get("kernel", ""))
        key = f"{base}|{record.get('grid', '')}|{record.get('block', '')}"
        group = by_shape.get(key)
        nth = taken.get(key, 0)
        matched = group is not None and len(group) > 0
        event = group.iloc[min(nth, len(group) - 1)] if matched else None
        taken[key] = nth + 1
        parent = int(event["parent_op"]) if event is not None and int(event["parent_op"]) >= 0 else -1
        rules = [r for r in record.get("rules") or [] if isinstance(r, dict)]
        ranked = sorted((r for r in rules if r.get("speedup") is not None), key=lambda r: -float(r["speedup"]))
        label = f"ncu #{record.get('id', '')} {base}"[:200]
        rows[label] = {
            "kernel": record.get("kernel", ""), "matched": matched,
            "event_id": int(event["id"]) if event is not None else -1,
            "op": str(names[parent]) if parent >= 0 and parent < len(names) else "",
            "session_avg_ns": float((group["end_ns"] - group["start_ns"]).mean()) if matched else np.nan,
            "grid": record.get("grid", ""), "block": record.get("block", ""),
            **{k: _float(record.get(k)) for k in ("duration_ns", "sm_pct", "memory_pct", "dram_pct",
                                                  "achieved_occupancy", "theoretical_occupancy")},
            "limiter": record.get("limiter") or "",
            **{k: _float(record.get(k)) for k in ("waves", "registers", "tensor_pct", "fma_pct")},
            "rules": "; ".join(f"{r['name']} {float(r['speedup']):g}% ({r.get('speedup_kind') or 'estimate'})"
                               for r in ranked),
            "top_rule": ranked[0]["name"] if ranked else "",
            "top_speedup_pct": float(ranked[0]["speedup"]) if ranked else np.nan,
            "source": str(found.get("source", "")),
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "key"
    return out


def _float(value) -> float:
    try:
        return float(value) if value is not None else np.nan
    except (TypeError, ValueError):
        return np.nan
