"""Small helpers the checks share: savings, severities and table-row evidence."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from advisor.findings import Evidence, Saving, Severity
from advisor.rules.registry import RuleContext
from advisor.units import format_ns, format_ratio


def saving(ctx: RuleContext, ns_per_step: float, basis: str, *, low_ns: float | None = None,
           high_ns: float | None = None, remains: str = "") -> Saving:
    """A finding's saving: the point estimate ``ns_per_step`` (ranking uses it), and where
    the rule models them, the bounds it lies between and what the fix cannot remove."""
    step = ctx.mean_step_ns or 0.0
    ns = max(float(ns_per_step), 0.0)
    share = min(ns / step, 1.0) if step > 0 else 0.0
    if not ctx.step_count:
        basis += "; no steps were found, so the whole window counts as one step"
    low = None if low_ns is None else round(min(max(float(low_ns), 0.0), ns) / 1e6, 4)
    high = None if high_ns is None else round(max(float(high_ns), ns) / 1e6, 4)
    return Saving(ms_per_step=round(ns / 1e6, 4), share_of_step=round(share, 4), basis=basis,
                  low_ms_per_step=low, high_ms_per_step=high, remains=remains)


def severity_by_share(ctx: RuleContext, share: float, high: str = "high_share", medium: str = "medium_share") -> Severity:
    if share >= ctx.threshold(high):
        return Severity.high
    if share >= ctx.threshold(medium):
        return Severity.medium
    return Severity.low


def value(frame: pd.DataFrame, row: str, column: str, default: Any = None) -> Any:
    if frame is None or row not in frame.index or column not in frame.columns:
        return default
    item = frame.at[row, column]
    if isinstance(item, float) and math.isnan(item):
        return default
    return item.item() if hasattr(item, "item") else item


def row_evidence(table: str, frame: pd.DataFrame, row: str, column: str, note: str = "") -> Evidence | None:
    item = value(frame, row, column)
    if item is None:
        return None
    unit = value(frame, row, "unit")  # tables with mixed units (perf) carry one per row
    return Evidence(kind="table_row", table=table, row=row, column=column, value=item,
                    unit=str(unit) if unit else None, note=note)


def ms(ns: float) -> str:
    """A duration for a finding's message ("69.3 ms"), as the reports write them."""
    return format_ns(ns)


def pct(share: float) -> str:
    """A share for a finding's message ("39.6%")."""
    return format_ratio(share)


# Below this share of the step idle, the GPU sets the step's pace.
GPU_BOUND_IDLE_SHARE = 0.05


def gpu_speedup_cap(ctx: RuleContext, gpu_saving_ns: float) -> tuple[float, str]:
    """What doing the same GPU work in ``gpu_saving_ns`` less GPU time takes off a step,
    and why, where that is less.

    Where the GPU is busy nearly all the step, all of it. Where the GPU idles a real share
    of the step the host sets the pace: the host's own work stays, and the step shrinks
    only by the time the host spends waiting for the GPU (its blocking calls, from the
    step_gpu table); the rest of the GPU time saved becomes idle time.
    """
    balance = ctx.table("step_gpu")
    idle = gpu_idle_per_step(ctx)
    step = ctx.mean_step_ns
    if not ctx.gpu_measured or balance is None or not len(balance) or idle is None or not step:
        return gpu_saving_ns, ""
    row = "mean" if "mean" in balance.index else "window"
    blocking = float(value(balance, row, "blocking_ns", 0.0) or 0.0)
    # While the host waits and the GPU idles too (a copy from pageable memory being staged),
    # faster kernels change nothing: only the waits on a busy GPU shrink.
    steps = max(ctx.step_count, 1)
    idle_blocked = float(value(ctx.table("gpu_idle"), "blocking sync", "idle_ns", 0.0) or 0.0) / steps
    waits = max(blocking - idle_blocked, 0.0)
    if idle < GPU_BOUND_IDLE_SHARE * float(step) or gpu_saving_ns <= waits:
        return gpu_saving_ns, ""
    return waits, (f"The GPU idles {ms(idle)} of each {ms(float(step))} step, so the host sets the pace: faster GPU "
                   f"work shortens the step only by the {ms(waits)} the host waits for a busy GPU, not by the "
                   f"{ms(gpu_saving_ns)} of GPU time it saves (that becomes idle time until the host is faster).")


def gpu_idle_per_step(ctx: RuleContext) -> float | None:
    """The GPU's idle time per step, from the gpu_idle table (all its rows: the time in the
    window with no GPU work running, whenever that work was launched); None without it."""
    idle = ctx.table("gpu_idle")
    if not ctx.gpu_measured or idle is None or not len(idle) or "idle_ns" not in idle.columns:
        return None
    return float(idle["idle_ns"].sum()) / max(ctx.step_count, 1)
