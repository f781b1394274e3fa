"""`advisor compare`: what changed between two profiles of a job (before and after a fix).

``compare(before, after)`` takes two (StepModel, tables, findings) triples, as the rest of
advisor produces them, and returns a :class:`Comparison`: the headline figures (step time,
throughput, GPU utilisation, data-loader share, GPU idle per step), each phase of the Model
Summary, the rows of the operator, kernel, memory, host-sync and GPU-idle tables that moved
most, and which findings appeared, went away or changed their saving. It reads only the
summary tables, the findings and the step model's step times (the mean step,
advisor.step.timing), and it is the one place the two are set against each other; the
renderers in :mod:`advisor.reports.compare_report` only word the result. It is an analysis
stage beside the tables: a pure function of what the two profiles' stages made.

Two profiles rarely hold the same number of steps, so table totals are compared per step
(a total over the steps divided by their count); where either has no steps, per window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from advisor.findings import Finding
from advisor.step import StepModel
from advisor.units import format_ns

__all__ = ["Change", "Comparison", "FindingChange", "Multiplied", "RowChange", "Side", "compare"]

TOP_ROWS = 10
# Moves smaller than this share of the before value, or than this many ns per step, are
# noise between two runs of one job, not a change worth a line.
MIN_RELATIVE = 0.02
MIN_NS = 1_000

# (table, column, what it is) for the moved rows; for all of them, lower is better.
ROW_TABLES: tuple[tuple[str, str, str], ...] = (
    ("operator", "cpu_total_ns", "CPU time of top-level operators"),
    ("operator", "gpu_total_ns", "GPU time launched by top-level operators"),
    ("kernel", "gpu_total_ns", "GPU time of kernels"),
    ("memory", "gpu_total_ns", "GPU time of copies and sets"),
    ("host_sync", "host_total_ns", "host time blocked on the GPU"),
    ("gpu_idle", "idle_ns", "GPU idle time by what the host was doing"),
    # A job's cross-rank tables, already per step.
    ("ranks", "step_mean_ns", "each rank's mean step"),
    ("ranks", "wait_ns", "time each rank waits in collectives for the last rank"),
    ("collectives", "time_ns", "time in each collective"),
)
PER_STEP_TABLES = frozenset({"ranks", "collectives"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Change(_Model):
    """One figure before and after."""

    name: str = Field(description="What the figure is, in words.")
    unit: str = Field(description="'ns', 'ratio', or the unit of a throughput ('steps/s', 'samples/s').")
    before: float | None = None
    after: float | None = None
    delta: float | None = Field(default=None, description="after - before (null where either is missing).")
    relative: float | None = Field(default=None, description="delta / before (null where before is 0 or missing).")
    better: Literal["lower", "higher", ""] = Field(default="", description="Which way is an improvement.")
    verdict: Literal["better", "worse", "same", "new", "gone", ""] = ""


class RowChange(Change):
    """A table row's figure, per step, before and after."""

    table: str
    key: str
    column: str


class FindingChange(_Model):
    """A finding of either profile, matched to its counterpart in the other."""

    status: Literal["appeared", "gone", "changed", "unchanged"]
    rule: str
    title: str
    label_before: str | None = Field(default=None, description="Its number in the before report (1, 1.1...).")
    label_after: str | None = None
    severity_before: str | None = None
    severity_after: str | None = None
    saving_before_ms: float | None = Field(default=None, description="Estimated saving per step, ms.")
    saving_after_ms: float | None = None
    delta_ms: float | None = None
    anchor: str = Field(default="", description="The evidence row that identifies it, e.g. host_sync[aten::to @ x.py:4].")


class Multiplied(_Model):
    """Work that multiplied between the two profiles: a row of the operator, kernel or
    memory table whose time per step grew many times over (or appeared), by enough to
    matter to the step."""

    table: str
    key: str
    what: str = Field(description="What the figure is, in words.")
    before_ns: float = Field(description="Per step (or per window), ns; 0 where the row is absent before.")
    after_ns: float
    calls_before: float | None = Field(default=None, description="Calls per step (or window) before.")
    calls_after: float | None = None
    factor: float | None = Field(default=None, description="after / before (null where it appeared).")
    share_of_step: float | None = Field(default=None, description="The growth as a share of the after step.")
    message: str


class Side(_Model):
    """What one of the two profiles is."""

    source: str
    source_format: str
    devices: list[str] = Field(default_factory=list)
    steps: int
    mean_step_ns: float | None = None
    window_ns: int
    gpu_measured: bool
    findings: int


class Comparison(_Model):
    """Before against after."""

    before: Side
    after: Side
    per: Literal["step", "window"] = Field(description="What the table figures are divided by.")
    headline: list[Change] = Field(default_factory=list)
    phases: list[Change] = Field(default_factory=list, description="Model Summary rows: mean host time per step, "
                                                                   "then mean GPU time per step.")
    rows: list[RowChange] = Field(default_factory=list, description="The rows that moved most, per table and column.")
    findings: list[FindingChange] = Field(default_factory=list)
    multiplied: list[Multiplied] = Field(default_factory=list,
                                         description="Work that grew many times over: the regressions to look at first.")
    notes: list[str] = Field(default_factory=list)


Triple = tuple[StepModel, Mapping[str, pd.DataFrame], list[Finding]]


def _value(frame: pd.DataFrame | None, key: str, column: str) -> float | None:
    if frame is None or column not in frame.columns or key not in frame.index:
        return None
    value = frame.at[key, column]
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _change(name: str, unit: str, before: float | None, after: float | None, better: str) -> Change:
    return Change(name=name, unit=unit, **_delta(before, after, better))


def _delta(before: float | None, after: float | None, better: str) -> dict[str, Any]:
    delta = after - before if before is not None and after is not None else None
    relative = delta / before if delta is not None and before else None
    if before is None and after is None:
        verdict = ""
    elif before is None:
        verdict = "new"
    elif after is None:
        verdict = "gone"
    elif abs(delta) <= abs(before) * MIN_RELATIVE:
        verdict = "same"
    elif not better:
        verdict = ""
    else:
        verdict = "better" if (delta < 0) == (better == "lower") else "worse"
    return {"before": before, "after": after, "delta": delta, "relative": relative, "better": better,
            "verdict": verdict}


def _side(model: StepModel, findings: list[Finding]) -> Side:
    session = model.session  # the steady session every figure of the side is of
    lo, hi = session.window()
    steps = session.steps()
    devices = [d.name or f"{d.kind} {d.id}" for d in session.meta.devices if d.kind == "gpu"]
    return Side(
        source=session.meta.source,
        source_format=session.meta.source_format,
        devices=devices,
        steps=len(steps),
        # The steady steps' mean, the step model's (advisor.step.timing); the unrecorded
        # steps' is the Step Timing table's ProfileStep row, which states the model's.
        mean_step_ns=model.recorded_step_ns if model.steps else None,
        window_ns=hi - lo,
        gpu_measured=session.meta.collector.gpu_measured,
        findings=len(_flatten(findings)),
    )


def _gpu_rows(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    device = tables.get("device")
    if device is None or "kind" not in device.columns:
        return []
    return [str(k) for k in device.index[device["kind"].astype(str) == "gpu"]]


def _headline(b: Triple, a: Triple, sides: tuple[Side, Side]) -> list[Change]:
    tb, ta = b[1], a[1]
    out = []
    # Where both runs timed steps the profiler did not record, those are the job's own
    # pace and come first: recording slows each run by its own amount (a per-sample
    # loop far more than a batched one), so recorded means compare the profilers too.
    own = [_value(t.get("step_timing"), "ProfileStep", "unrecorded_avg_ns") for t in (tb, ta)]
    if all(v is not None for v in own):
        out.append(_change("step time, unrecorded steps (the job's own pace)", "ns", own[0], own[1], "lower"))
    out.append(_change("mean step time" + (" (recorded steps)" if all(v is not None for v in own) else ""), "ns",
                       sides[0].mean_step_ns, sides[1].mean_step_ns, "lower"))
    perf_b, perf_a = tb.get("perf"), ta.get("perf")
    # ips is in samples/s where the batch size was recorded, else steps/s: compare like with like.
    units = {str(f.at["ips", "unit"]) for f in (perf_b, perf_a)
             if f is not None and "unit" in f.columns and "ips" in f.index}
    if len(units) <= 1:
        out.append(_change("throughput (ips)", next(iter(units), "steps/s"), _value(perf_b, "ips", "avg"),
                           _value(perf_a, "ips", "avg"), "higher"))
    for key in dict.fromkeys(_gpu_rows(tb) + _gpu_rows(ta)):
        out.append(_change(f"GPU utilization ({key})", "ratio", _value(tb.get("device"), key, "utilization"),
                           _value(ta.get("device"), key, "utilization"), "higher"))
    out.append(_change("data-loader share of the step", "ratio", _value(tb.get("model"), "Dataloader", "cpu_ratio"),
                       _value(ta.get("model"), "Dataloader", "cpu_ratio"), "lower"))
    idle = []
    for (_, tables, _), side in zip((b, a), sides):
        frame = tables.get("gpu_idle")
        total = float(frame["idle_ns"].sum()) if frame is not None and len(frame) else None
        idle.append(total / side.steps if total is not None and side.steps else None)
    out.append(_change("GPU idle per step", "ns", idle[0], idle[1], "lower"))
    return [c for c in out if c.before is not None or c.after is not None]


def _phases(b: Triple, a: Triple) -> list[Change]:
    mb, ma = b[1].get("model"), a[1].get("model")
    out = []
    keys = list(dict.fromkeys([*(mb.index if mb is not None else []), *(ma.index if ma is not None else [])]))
    for side, column in (("host", "cpu_avg_ns"), ("GPU", "gpu_avg_ns")):
        for key in keys:
            before, after = _value(mb, key, column), _value(ma, key, column)
            if not before and not after:  # absent or zero on both sides: nothing to say
                continue
            out.append(_change(f"{key} ({side})", "ns", before, after, "lower"))
    return out


def _per(frame: pd.DataFrame, column: str, divisor: float) -> dict[str, float]:
    values = pd.to_numeric(frame[column], errors="coerce")
    return {str(k): float(v) / divisor for k, v in values.items() if math.isfinite(v)}


def _rows(b: Triple, a: Triple, divisors: tuple[float, float], top: int) -> list[RowChange]:
    out: list[RowChange] = []
    for table, column, what in ROW_TABLES:
        fb, fa = b[1].get(table), a[1].get(table)
        if fb is None or fa is None or column not in fb.columns or column not in fa.columns:
            continue
        if "level" in fb.columns:  # operators: top-level rows only, which never double count
            fb = fb[fb["level"].astype(str) == "top"]
            fa = fa[fa["level"].astype(str) == "top"]
        per = (1.0, 1.0) if table in PER_STEP_TABLES else divisors
        before, after = _per(fb, column, per[0]), _per(fa, column, per[1])
        moved = []
        for key in set(before) | set(after):
            x, y = before.get(key), after.get(key)
            delta = (y or 0.0) - (x or 0.0)
            if abs(delta) < MIN_NS or abs(delta) < abs(x or 0.0) * MIN_RELATIVE:
                continue
            moved.append((-abs(delta), key, x, y))
        for _, key, x, y in sorted(moved)[:top]:
            out.append(RowChange(name=what, unit="ns", table=table, key=key, column=column,
                                 **_delta(x, y, "lower")))
    return out


# Work that grows this many times over, and by this much of the step (and at least
# MULTIPLIED_MIN_NS per step), is a regression of its own, not one moved row among many.
MULTIPLIED_FACTOR = 5.0
MULTIPLIED_MIN_SHARE = 0.02
MULTIPLIED_MIN_NS = 200_000
MULTIPLIED_TABLES: tuple[tuple[str, str, str], ...] = (
    ("memory", "gpu_total_ns", "GPU time of copies and sets"),
    ("kernel", "gpu_total_ns", "GPU time of kernels"),
    ("operator", "cpu_total_ns", "CPU time of top-level operators"),
)


def _multiplied(b: Triple, a: Triple, divisors: tuple[float, float], after_step: float | None) -> list[Multiplied]:
    out: list[Multiplied] = []
    floor = max(MULTIPLIED_MIN_NS, MULTIPLIED_MIN_SHARE * after_step) if after_step else MULTIPLIED_MIN_NS
    for table, column, what in MULTIPLIED_TABLES:
        fb, fa = b[1].get(table), a[1].get(table)
        if fb is None or fa is None or column not in fb.columns or column not in fa.columns:
            continue
        if "level" in fb.columns:
            fb = fb[fb["level"].astype(str) == "top"]
            fa = fa[fa["level"].astype(str) == "top"]
        before, after = _per(fb, column, divisors[0]), _per(fa, column, divisors[1])
        calls_b = _per(fb, "calls", divisors[0]) if "calls" in fb.columns else {}
        calls_a = _per(fa, "calls", divisors[1]) if "calls" in fa.columns else {}
        for key, y in after.items():
            x = before.get(key) or 0.0
            if y - x < floor or (x and y < MULTIPLIED_FACTOR * x):
                continue
            factor = y / x if x else None
            cb, ca = calls_b.get(key), calls_a.get(key)
            calls = f" ({cb or 0:.1f} -> {ca:.1f} calls per {'step' if divisors != (1.0, 1.0) else 'window'})" \
                if ca is not None else ""
            grew = f"{factor:.1f}x" if factor else "new"
            message = (f"{key}: {grew}, {what} {format_ns(x)} -> {format_ns(y)} per "
                       f"{'step' if divisors != (1.0, 1.0) else 'window'}{calls}")
            out.append(Multiplied(table=table, key=key, what=what, before_ns=x, after_ns=y,
                                  calls_before=cb, calls_after=ca, factor=factor,
                                  share_of_step=(y - x) / after_step if after_step else None, message=message))
    out.sort(key=lambda m: -(m.after_ns - m.before_ns))
    return out


# -- findings ---------------------------------------------------------------------------------


def _flatten(findings: list[Finding], prefix: str = "") -> list[tuple[str, Finding]]:
    out = []
    for i, finding in enumerate(findings, 1):
        label = f"{prefix}{i}"
        out.append((label, finding))
        out.extend(_flatten(finding.explains, f"{label}."))
    return out


def _anchor(finding: Finding) -> str:
    """The evidence that says which instance of a rule this is: its first table row (a
    rule that fires once per op or line names it there), else its first source line."""
    for ev in finding.evidence:
        if ev.kind == "table_row" and ev.table:
            return f"{ev.table}[{ev.row}]"
    for ev in finding.evidence:
        if ev.kind == "source_line" and ev.file:
            return f"{ev.file}:{ev.line}"
    return ""


def _findings(before: list[Finding], after: list[Finding]) -> list[FindingChange]:
    left = _flatten(before)
    right = _flatten(after)
    pairs: list[tuple[tuple[str, Finding] | None, tuple[str, Finding] | None]] = []
    unmatched = list(right)
    for item in left:
        _, finding = item
        # Same rule and same evidence row first; failing that, the same rule.
        match = next((r for r in unmatched if r[1].rule == finding.rule and _anchor(r[1]) == _anchor(finding)), None)
        if match is None:
            match = next((r for r in unmatched if r[1].rule == finding.rule), None)
        if match is not None:
            unmatched.remove(match)
        pairs.append((item, match))
    pairs.extend((None, r) for r in unmatched)

    out = []
    for b, a in pairs:
        ref = (a or b)[1]  # type: ignore[index]
        saving_b = b[1].saving.ms_per_step if b else None
        saving_a = a[1].saving.ms_per_step if a else None
        if b is None:
            status = "appeared"
        elif a is None:
            status = "gone"
        elif b[1].severity != a[1].severity or abs(saving_a - saving_b) > max(0.01, MIN_RELATIVE * saving_b):
            status = "changed"
        else:
            status = "unchanged"
        out.append(FindingChange(
            status=status, rule=ref.rule, title=ref.title,
            label_before=b[0] if b else None, label_after=a[0] if a else None,
            severity_before=b[1].severity.value if b else None, severity_after=a[1].severity.value if a else None,
            saving_before_ms=saving_b, saving_after_ms=saving_a,
            delta_ms=(saving_a or 0.0) - (saving_b or 0.0),
            anchor=_anchor(ref),
        ))
    order = {"appeared": 0, "gone": 1, "changed": 2, "unchanged": 3}

    def rank(label: str | None) -> tuple[int, ...]:
        return tuple(int(p) for p in label.split(".")) if label else ()

    # Within a status, in the order the reports number them (a cause before its symptoms).
    out.sort(key=lambda c: (order[c.status], rank(c.label_after if c.status == "appeared" else c.label_before)))
    return out


def compare(before: Triple, after: Triple, *, top: int = TOP_ROWS) -> Comparison:
    """Set two (StepModel, tables, findings) triples side by side (see the module docstring)."""
    sides = (_side(before[0], before[2]), _side(after[0], after[2]))
    per = "step" if sides[0].steps and sides[1].steps else "window"
    divisors = (float(sides[0].steps), float(sides[1].steps)) if per == "step" else (1.0, 1.0)
    notes = []
    if per == "window":
        notes.append("One of the profiles has no steps: table rows are compared as totals over each window.")
    if sides[0].devices != sides[1].devices:
        notes.append(f"The GPUs differ: {', '.join(sides[0].devices) or 'none'} before, "
                     f"{', '.join(sides[1].devices) or 'none'} after.")
    if sides[0].gpu_measured != sides[1].gpu_measured:
        notes.append("Only one of the profiles measured the GPU: GPU figures of the other are missing.")
    return Comparison(
        before=sides[0],
        after=sides[1],
        per=per,
        headline=_headline(before, after, sides),
        phases=_phases(before, after),
        rows=_rows(before, after, divisors, top),
        findings=_findings(before[2], after[2]),
        multiplied=_multiplied(before, after, divisors, sides[1].mean_step_ns if per == "step" else None),
        notes=notes,
    )
