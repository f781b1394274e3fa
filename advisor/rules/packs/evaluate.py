"""Running a data rule: its condition over its table's rows, one finding per matching row.

For each row where the condition holds (largest saving first, at most ``limit`` rows) the
finding gets the rule's severity (or the first ``escalate`` level whose condition holds),
the saving from ``saving.ns_per_step``, the message and recommendation with their
placeholders filled from the row, and evidence: the row's ``evidence`` columns and every
``values`` cell the rule read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from advisor.findings import Evidence, Finding, Saving
from advisor.rules.packs.expressions import evaluate, evaluation_frame
from advisor.rules.packs.templates import fill

if TYPE_CHECKING:
    from advisor.rules.registry import RuleContext

__all__ = ["run_data_rule"]


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, list, dict)):
        value = value.item()
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _cell(tables: dict[str, pd.DataFrame], table: str, row: str, column: str) -> Any:
    frame = tables.get(table)
    if frame is None or row not in frame.index or column not in frame.columns:
        return math.nan
    value = _plain(frame.at[row, column])
    return math.nan if value is None else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _facts(ctx: RuleContext) -> dict[str, Any]:
    return {
        "step_count": int(ctx.step_count),
        "steps": max(int(ctx.step_count), 1),
        "mean_step_ns": float(ctx.mean_step_ns),
        "window_ns": int(ctx.window_ns),
        "gpu_measured": bool(ctx.gpu_measured),
    }


def run_data_rule(ctx: RuleContext) -> list[Finding]:
    """The findings of the data rule ``ctx.spec`` on ``ctx.tables``."""
    spec = ctx.spec
    missing = [name for name in ("condition", "table", "saving", "message", "recommendation")
               if getattr(spec, name) is None]
    if missing:  # a spec built in code, not read from a validated pack
        raise ValueError(f"a data rule needs {', '.join(missing)}")
    table = ctx.table(spec.table)
    if table is None or not len(table):
        return []
    frame = evaluation_frame(table)
    values = {name: _cell(ctx.tables, ref.table, ref.row, ref.column) for name, ref in spec.values.items()}
    local_values = {**_facts(ctx), **{k: float(v) for k, v in spec.thresholds.items()}, **values}

    for name, text in spec.derived.items():
        frame[name] = evaluate(text, frame, local_values)
    matched = evaluate(spec.condition, frame, local_values)
    matched = matched.astype("boolean").fillna(False).astype(bool)
    rows = frame[matched.to_numpy()]
    if not len(rows):
        return []
    saving_ns = pd.to_numeric(evaluate(spec.saving.ns_per_step, rows, local_values), errors="coerce")
    saving_ns = saving_ns.fillna(0.0).clip(lower=0.0).astype(float)
    endless = saving_ns[~np.isfinite(saving_ns.to_numpy())]
    if len(endless):  # the engine turns the rule off with this line; the run goes on
        raise ValueError(f"its saving ({' '.join(spec.saving.ns_per_step.split())}) is not a finite number on row "
                         f"{rows.loc[endless.index[0], 'key']!s}")
    severities = pd.Series([spec.severity] * len(rows), index=rows.index, dtype=object)
    decided = pd.Series(False, index=rows.index)
    for level in spec.escalate:
        hit = evaluate(level.when, rows, local_values).astype("boolean").fillna(False).astype(bool) & ~decided
        severities[hit] = level.severity
        decided |= hit
    order = saving_ns.sort_values(ascending=False, kind="stable").index[: spec.limit]

    step_ns = float(ctx.mean_step_ns or 0.0)
    basis = spec.saving.basis or f"estimated as {' '.join(spec.saving.ns_per_step.split())} per step"
    if not ctx.step_count:
        basis += "; no steps were found, so the whole window counts as one step"
    findings: list[Finding] = []
    for index in order:
        row = {column: _plain(value) for column, value in rows.loc[index].items()}
        ns = float(saving_ns[index])
        share = min(ns / step_ns, 1.0) if step_ns > 0 else 0.0
        placeholders = {**row, **local_values, "saving_ns": ns, "saving_share": share}
        key = str(row["key"])
        evidence = []
        for column in spec.evidence:
            value = row.get(column)
            if _missing(value):
                continue
            unit = row.get("unit") if "unit" in table.columns else None
            evidence.append(Evidence(kind="table_row", table=spec.table, row=key, column=column, value=value,
                                     unit=str(unit) if unit else None))
        for name, ref in spec.values.items():
            if not _missing(values[name]):
                # A table with a unit per row (perf) says what the cell is in.
                unit = _cell(ctx.tables, ref.table, ref.row, "unit")
                evidence.append(Evidence(kind="table_row", table=ref.table, row=ref.row, column=ref.column,
                                         value=values[name], unit=str(unit) if isinstance(unit, str) and unit else None,
                                         note=f"@{name}"))
        metrics = {column: row.get(column) for column in spec.evidence if not _missing(row.get(column))}
        metrics.update({name: row.get(name) for name in spec.derived if not _missing(row.get(name))})
        metrics.update({name: value for name, value in values.items() if not _missing(value)})
        metrics["saving_ns"] = ns
        findings.append(
            Finding(
                rule=spec.id,
                title=spec.title,
                severity=severities[index],
                confidence=spec.confidence,
                saving=Saving(ms_per_step=round(ns / 1e6, 4), share_of_step=round(share, 4), basis=basis),
                message=fill(spec.message, placeholders).strip(),
                recommendation=fill(spec.recommendation, placeholders).strip(),
                evidence=evidence,
                metrics=metrics,
            )
        )
    return findings
