"""The one place a report is assembled: ``build_report`` copies what the earlier stages
produced (the session's metadata, the summary tables, the ranked findings) into a
:class:`~advisor.reports.report.Report`; it computes nothing new. ``to_python`` turns the
tables' numpy and pandas values into plain JSON values.

The models live apart (advisor.reports.report, no pandas), so a kept report is read and
rendered without the libraries that built it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime, timezone
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from advisor._version import __version__
from advisor.findings import Finding
from advisor.reports.report import (
    METRIC_DEFINITIONS,
    CollectorSummary,
    CombinedSaving,
    JobSummary,
    Report,
    SessionSummary,
    StepSummary,
    Table,
    TableColumn,
    Window,
)
from advisor.session import DeviceInfo

if TYPE_CHECKING:
    from advisor.session import Session

__all__ = ["build_job_report", "build_report", "table_from_frame", "to_python"]


# -- conversion -----------------------------------------------------------------------------


def to_python(value: Any) -> Any:
    """``value`` as plain JSON-able Python: numpy scalars and arrays to int/float/bool/list,
    NaN, infinities and pandas' missing values to None, timestamps to ISO text, timedeltas
    to integer ns; containers converted item by item. Anything else unknown becomes str."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Enum):
        return to_python(value.value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating, Decimal)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, str):
        return str(value)
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, np.datetime64):
        return None if np.isnat(value) else pd.Timestamp(value).isoformat()
    if isinstance(value, (pd.Timedelta, np.timedelta64)):
        td = pd.Timedelta(value)
        return None if td is pd.NaT else int(td.value)
    if isinstance(value, BaseModel):
        return to_python(value.model_dump())
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray, pd.Series, pd.Index)):
        return [to_python(v) for v in value]
    return str(value)


def _row_key(value: Any) -> str:
    if isinstance(value, tuple):
        return "|".join(_row_key(v) for v in value)
    value = to_python(value)
    return "" if value is None else str(value)


def _doc_columns(doc: Mapping[str, Any]) -> dict[str, str]:
    """Column descriptions from a table doc, given as {name: text} or [{name, description}]."""
    columns = doc.get("columns") or {}
    if isinstance(columns, Mapping):
        return {str(k): str(v) for k, v in columns.items()}
    out = {}
    for item in columns:
        if isinstance(item, Mapping) and "name" in item:
            out[str(item["name"])] = str(item.get("description", ""))
    return out


def doc_for(name: str, frame: pd.DataFrame, table_docs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The table's documentation: the frame's own ``attrs`` overlaid by ``table_docs[name]``
    (a mapping or an object with title, description, key, columns, notes attributes)."""
    doc: dict[str, Any] = {}
    for source in (frame.attrs, (table_docs or {}).get(name)):
        if source is None:
            continue
        if isinstance(source, BaseModel):
            source = source.model_dump()
        elif not isinstance(source, Mapping):
            fields = ("title", "description", "key", "columns", "notes")
            source = {k: getattr(source, k) for k in fields if hasattr(source, k)}
        for field in ("title", "description", "key"):
            if source.get(field):
                doc[field] = str(source[field])
        for note in source.get("notes") or ():
            if note and str(note) not in doc.setdefault("notes", []):
                doc["notes"].append(str(note))
        columns = _doc_columns(source)
        if columns:
            doc.setdefault("columns", {}).update(columns)
    return doc


def table_from_frame(name: str, frame: pd.DataFrame, doc: Mapping[str, Any] | None = None) -> Table:
    """A summary table frame (index = the row key) as a :class:`Table`, values copied."""
    doc = dict(doc or {})
    if "key" in frame.columns and isinstance(frame.index, pd.RangeIndex) and frame.index.name is None:
        frame = frame.set_index("key")
    kept = [i for i, c in enumerate(frame.columns) if str(c) != "key"]
    columns = [str(frame.columns[i]) for i in kept]
    descriptions = doc.get("columns") or {}
    keys = [_row_key(k) for k in frame.index]
    # The whole frame as one object array, a block at a time: a Series per column cost more
    # than the values (each one a copy of the frame's attrs).
    values = frame.to_numpy(dtype=object)[:, kept].tolist() if len(keys) else []
    rows = []
    for key, cells in zip(keys, values):
        row: dict[str, Any] = {"key": key}
        for column, cell in zip(columns, cells):
            row[column] = to_python(cell)
        rows.append(row)
    index_name = frame.index.name if frame.index.name not in (None, "key") else ""
    return Table(
        title=doc.get("title") or name.replace("_", " ").title(),
        description=doc.get("description", ""),
        key=doc.get("key") or str(index_name or ""),
        columns=[TableColumn(name=c, description=descriptions.get(c, "")) for c in columns],
        notes=list(doc.get("notes") or []),
        rows=rows,
    )


def _number(value: Any) -> float | None:
    """A table cell as a float, None where it is missing or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _session_summary(session: Session, tables: dict[str, pd.DataFrame], window: Window | None = None,
                     steps: StepSummary | None = None) -> SessionSummary:
    meta = session.meta
    start, end = session.window()
    collector = meta.collector
    return SessionSummary(
        source=meta.source,
        source_format=meta.source_format,
        collector=CollectorSummary(
            name=collector.name,
            gpu_measured=collector.gpu_measured,
            notes=list(collector.notes),
            dropped_records=collector.dropped_records,
            gaps=list(collector.gaps),
        ),
        devices=[DeviceInfo.model_validate(to_python(d.model_dump())) for d in meta.devices],
        window=window if window is not None else Window(start_ns=start, end_ns=end, duration_ns=end - start),
        steps=steps if steps is not None else _steps_of(session, tables),
        command=list(meta.command) if meta.command is not None else None,
        exit_code=meta.exit_code,
        script_error=meta.script_error,
    )


def _steps_of(session: Session, tables: Mapping[str, pd.DataFrame]) -> StepSummary:
    """The steps where the step model's were not given: the session's steps and the Step
    Timing table's figures, copied. The mean step is the step model's (advisor.step.timing),
    never worked out here: a report built without it states none."""
    timing = tables.get("step_timing")
    unrecorded = 0
    unrecorded_mean = overhead = None
    if timing is not None and "ProfileStep" in timing.index:
        unrecorded = int(timing.at["ProfileStep", "unrecorded_steps"] or 0)
        if unrecorded:
            unrecorded_mean = _number(timing.at["ProfileStep", "unrecorded_avg_ns"])
            overhead = _number(timing.at["ProfileStep", "overhead_ratio"])
    numbers = [int(s) for s in session.steps()["step"]]
    return StepSummary(count=len(numbers), numbers=numbers, unrecorded_steps=unrecorded,
                       unrecorded_mean_step_ns=unrecorded_mean, overhead_ratio=overhead)


def _notes(summary: SessionSummary) -> list[str]:
    notes = []
    collector = summary.collector
    # The collector's own notes, each on its line; the GPU one first where it said one.
    gpu_notes = [n for n in collector.notes if n.startswith("GPU not measured")]
    if not collector.gpu_measured:
        notes.extend(gpu_notes or [f"GPU not measured: the {collector.name} collector recorded no GPU activity"])
    notes.extend(n for n in collector.notes if n not in gpu_notes)
    if collector.dropped_records:
        notes.append(f"The collector dropped {collector.dropped_records:,} records; totals may be low.")
    if summary.script_error:
        notes.append(f"The script did not finish normally: {summary.script_error}")
    if summary.steps.count == 0 and not summary.window.source:
        notes.append("No steps were found; the window runs from the first to the last event.")
    return notes


def build_report(
    session: Session,
    tables: Mapping[str, pd.DataFrame],
    findings: list[Finding],
    *,
    table_docs: Mapping[str, Any] | None = None,
    skipped: Mapping[str, str] | None = None,
    window: Window | None = None,
    combined: CombinedSaving | None = None,
    steps: StepSummary | None = None,
) -> Report:
    """Assemble the report from what the earlier stages produced; compute nothing new.

    ``tables`` are the summary tables (index = stable row key), copied row by row with
    NaN as null and numpy values as plain Python. ``findings`` keep the order given (the
    ranking is the rule engine's). ``table_docs`` (name -> {title, description, key,
    columns}) describes the tables; a frame's own ``attrs`` may carry the same.
    ``skipped`` (rule id -> why, the engine's) puts the rules this profile could not
    judge in the notes, so "No findings" never reads as "nothing to fix" for them, and the
    rules that failed (why ``failed: <error>``), so a failure is never silence.
    ``window`` (the step model's window, as the report states it), ``steps`` (its steps and
    their times: the mean step, advisor.diagnosis.report_steps) and ``combined`` (every fix
    at once, replayed) are copied as given; without ``steps`` the report states the
    session's steps and no mean step.
    """
    summary = _session_summary(session, tables, window, steps)
    return _assembled(summary, tables, findings, table_docs=table_docs, skipped=skipped, combined=combined)


def _assembled(summary: SessionSummary, tables: Mapping[str, pd.DataFrame], findings: list[Finding], *,
               table_docs: Mapping[str, Any] | None, skipped: Mapping[str, str] | None,
               rank_tables: Mapping[str, Table] | None = None, job: JobSummary | None = None,
               combined: CombinedSaving | None = None) -> Report:
    """The Report of a session or a job: its tables copied, its findings, the notes."""
    return Report(
        advisor_version=__version__,
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        session=summary,
        findings=[Finding.model_validate(to_python(f.model_dump())) for f in findings],
        tables={
            **{str(name): table_from_frame(str(name), frame, doc_for(str(name), frame, table_docs))
               for name, frame in tables.items()},
            **dict(rank_tables or {}),
        },
        metrics=dict(METRIC_DEFINITIONS),
        notes=(list(job.notes) if job is not None else []) + _notes(summary) + _skipped_notes(skipped or {}),
        combined=combined,
        job=job,
    )


# The engine's reasons for not running a rule that say something about the profile (not
# the user's choices: disabled, preview, deprecated).
_PROFILE_REASONS = {
    "needs a measured GPU": "Rules that judge GPU work did not run, the GPU was not measured",
    "needs steps, and the profile has none": "Rules that need training steps did not run, the profile has none",
    "needs steady steps, and the profile is all start-up, compilation or graph capture":
        "Rules that judge steady steps did not run, the profile is all start-up, compilation or graph capture",
}


# How the engine marks a rule that failed in its skipped rules, before the error's one line.
_FAILED = "failed: "


def _skipped_notes(skipped: Mapping[str, str]) -> list[str]:
    notes = []
    for reason, lead in _PROFILE_REASONS.items():
        rules = sorted(rule for rule, why in skipped.items() if why == reason)
        if rules:
            notes.append(f"{lead}: {', '.join(rules)}.")
    # A rule that failed is said in every format, so a reader of the report (CI, an agent)
    # never takes its silence for a clean bill.
    for rule, why in sorted(skipped.items()):
        if isinstance(why, str) and why.startswith(_FAILED):
            notes.append(f"Rule {rule} failed and was skipped, so its findings are missing from this report: "
                         f"{why[len(_FAILED):]}")
    return notes


def build_job_report(
    summary: SessionSummary,
    tables: Mapping[str, pd.DataFrame],
    findings: list[Finding],
    job: JobSummary,
    *,
    rank_tables: Mapping[str, Table] | None = None,
    table_docs: Mapping[str, Any] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> Report:
    """Assemble a job's report, as ``build_report`` does a session's: the job's summary and
    cross-rank tables, the merged findings, the rank tables they cite (already tables,
    copied as they are) and the job's ranks; computes nothing new."""
    return _assembled(summary, tables, findings, table_docs=table_docs, skipped=skipped, rank_tables=rank_tables,
                      job=job)
