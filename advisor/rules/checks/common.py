"""Small helpers the checks share: savings, severities and table-row evidence."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import pandas as pd

from advisor.findings import Evidence, Saving, Severity
from advisor.rules.registry import RuleContext

if TYPE_CHECKING:
    from advisor.step.whatif import Fix
from advisor.rules.savings import saving  # noqa: F401  (the checks take it from here)
from advisor.units import format_ns, format_ratio


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


_SITE = re.compile(r"^(?P<file>.+):(?P<line>\d+)$")


def site_evidence(site: str, name: str, note: str = "") -> Evidence | None:
    """A user's line given as 'file:line' (a table's source or called_from column) as a
    source-line evidence; None where the text is not one."""
    match = _SITE.match(str(site or ""))
    if not match:
        return None
    return Evidence(kind="source_line", file=match["file"], line=int(match["line"]), name=name, note=note or None)


def ms(ns: float) -> str:
    """A duration for a finding's message ("69.3 ms"), as the reports write them."""
    return format_ns(ns)


def pct(share: float) -> str:
    """A share for a finding's message ("39.6%")."""
    return format_ratio(share)


def faster_gpu(ctx: RuleContext, items: list[tuple[str, str, float]], gpu_saving_ns: float, basis: str,
               ) -> tuple[Saving, Fix | None]:
    """The saving of running some operators' GPU work faster: ``items`` are (operator
    name, recorded input shapes, the factor their GPU time is scaled by). Replayed on the
    step graph where the GPU was measured: the step shrinks only where the GPU sets its
    pace, or where the host waits for that work; where the host sets the pace the GPU time
    saved becomes idle time. Without a measured GPU (judged against --gpu) the GPU time
    itself (``gpu_saving_ns`` per step) is the estimate."""
    from advisor.rules.savings import replayed
    from advisor.step.whatif import Fix

    if not ctx.gpu_measured or ctx.model is None:
        return saving(ctx, gpu_saving_ns, basis), None
    rows: dict[int, float] = {}
    for name, dims, factor in items:
        for row in ctx.model.gpu_under_ops(name, dims):
            rows[int(row)] = min(rows.get(int(row), 1.0), factor)
    if not rows:
        return saving(ctx, 0.0, basis + "; no GPU work of these operators was found in the window"), None
    fix = Fix("the listed operators' GPU work faster", gpu_rows=rows)
    found = replayed(ctx, fix, basis + ", replayed on the step graph: what the step loses where the GPU sets its pace",
                     high=Fix("the listed operators' GPU work faster, the host not waiting", gpu_rows=rows))
    if found is None:
        return saving(ctx, gpu_saving_ns, basis), None
    return found[0], fix


def gpu_idle_per_step(ctx: RuleContext) -> float | None:
    """The GPU's idle time per steady step in the window (the gpu_idle table's window
    rows); None without it."""
    idle = ctx.table("gpu_idle")
    if not ctx.gpu_measured or idle is None or not len(idle) or "idle_ns" not in idle.columns:
        return None
    inside = idle[idle["in_window"].astype(bool)] if "in_window" in idle.columns else idle
    steps = ctx.model.partition.steps if ctx.model is not None else ctx.step_count
    return float(inside["idle_ns"].sum()) / max(steps, 1)
