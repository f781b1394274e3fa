"""Why a kernel is slow, in words, from Nsight Compute's counters (the kernel_counters table).

The roofline says *that* an op runs far from its ideal time; the counters of its kernels
say *why*: which pipe does the work (FMA where tensor cores could), what bounds it (memory
at most of its bandwidth, or compute), how full the SMs are and what stops them being
fuller (registers, shared memory), how many waves of blocks it runs (a partial last wave
idles SMs). And where a kernel already runs at the hardware's limit, the counters win over
the cost model: there is little left to take.

``counters_for(ctx, ops)`` gives the matched rows for kernels launched by ops of those
names; ``why(row)`` one line for one kernel; ``at_limit(row)`` whether it runs at the limit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from advisor.findings import Evidence

if TYPE_CHECKING:
    from advisor.rules.registry import RuleContext

__all__ = ["AT_LIMIT_PCT", "at_limit", "counters_for", "evidence_for", "why"]

AT_LIMIT_PCT = 80.0  # throughput this share of peak or more: at the hardware's limit
MEMORY_BOUND_PCT = 60.0
LOW_OCCUPANCY_PCT = 50.0
TENSOR_IDLE_PCT = 1.0
FMA_BUSY_PCT = 30.0
TINY_PCT = 5.0  # neither pipe nor memory this busy: the launch holds too little work


def counters_for(ctx: RuleContext, ops: set[str] | None = None) -> pd.DataFrame:
    """The kernel_counters rows matched to the session's kernels, for kernels launched by ops
    named in ``ops`` (every matched row where None); empty where there are none."""
    table = ctx.table("kernel_counters")
    if table is None or not len(table) or "matched" not in table.columns:
        return pd.DataFrame()
    rows = table[table["matched"].astype(bool)]
    if ops is not None:
        rows = rows[rows["op"].astype(str).isin(ops)]
    return rows


def _value(row: Any, column: str) -> float:
    try:
        value = float(row[column])
    except (KeyError, TypeError, ValueError):
        return math.nan
    return value


def at_limit(row: Any) -> bool:
    return max(_value(row, "sm_pct"), _value(row, "memory_pct")) >= AT_LIMIT_PCT


def why(row: Any, sm_count: int | None = None) -> str:
    """One line: what the counters say holds the kernel back (or that nothing much does)."""
    sm, memory, dram = _value(row, "sm_pct"), _value(row, "memory_pct"), _value(row, "dram_pct")
    tensor, fma = _value(row, "tensor_pct"), _value(row, "fma_pct")
    achieved, theoretical = _value(row, "achieved_occupancy"), _value(row, "theoretical_occupancy")
    waves, registers = _value(row, "waves"), _value(row, "registers")
    limiter = str(row.get("limiter", "") or "") if hasattr(row, "get") else ""
    parts = []
    fma_work = not math.isnan(fma) and fma >= FMA_BUSY_PCT and (math.isnan(tensor) or tensor < TENSOR_IDLE_PCT)
    if fma_work:
        parts.append(f"fp32 on the FMA pipes ({fma:.0f}% busy), tensor pipes idle "
                     f"({0.0 if math.isnan(tensor) else tensor:.1f}%): TF32 or bf16 moves it to tensor cores")
    if not math.isnan(memory) and memory >= MEMORY_BOUND_PCT and (math.isnan(sm) or memory > sm):
        parts.append(f"memory-bound at {memory:.0f}% of peak memory throughput"
                     + (f" (DRAM {dram:.0f}%)" if not math.isnan(dram) else "") + ": fuse it with its neighbours")
    if not math.isnan(theoretical) and theoretical <= LOW_OCCUPANCY_PCT and limiter:
        parts.append(f"occupancy {achieved:.0f}% ({theoretical:.0f}% at most, limited by {limiter}"
                     + (f", {registers:.0f} a thread" if limiter == "registers" and not math.isnan(registers) else "")
                     + ")")
    on_sms = f" on {sm_count} SMs" if sm_count else ""
    if not math.isnan(waves) and 0 < waves < 0.5:
        parts.append(f"too few blocks to fill the GPU: {waves:.2f} waves{on_sms}, most SMs idle")
    elif not math.isnan(waves) and 1 <= waves < 2 and waves - math.floor(waves) < 0.5 and waves != math.floor(waves):
        parts.append(f"a partial last wave: {waves:.2f} waves{on_sms}")
    if at_limit(row) and fma_work and sm >= memory:
        # At the limit of the units it uses, not of the GPU: the tensor cores stand idle.
        parts.append(f"at the CUDA cores' limit ({sm:.0f}% of peak compute throughput): only tensor cores "
                     "make it faster")
    elif at_limit(row):
        parts.append(f"at the hardware's limit ({max(sm, memory):.0f}% of peak "
                     f"{'compute' if sm >= memory else 'memory'} throughput)")
    if not parts and max(sm, memory) < TINY_PCT:
        parts.append(f"barely uses the GPU ({sm:.0f}% of peak compute, {memory:.0f}% of peak memory "
                     "throughput): too little work per launch, batch or fuse it")
    if not parts:
        parts.append(f"{sm:.0f}% of peak compute and {memory:.0f}% of peak memory throughput"
                     if not (math.isnan(sm) or math.isnan(memory)) else "no counter says why")
    return "; ".join(parts)


def evidence_for(rows: pd.DataFrame, limit: int = 3) -> list[Evidence]:
    return [Evidence(kind="table_row", table="kernel_counters", row=str(key), column="sm_pct",
                     value=_value(row, "sm_pct"), note=f"{str(row['kernel'])[:80]}: {why(row)}")
            for key, row in rows.head(limit).iterrows()]
