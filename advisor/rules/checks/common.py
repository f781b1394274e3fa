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
