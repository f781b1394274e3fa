"""The report: the contract of the JSON report, and the one place a report is assembled.

``build_report`` copies what the earlier stages produced (the session's metadata, the
summary tables, the ranked findings) into a :class:`Report`; it computes nothing new.
Every renderer (terminal, JSON, Markdown) reads only a Report, so a report rendered again
from a saved session says the same thing in every format.

The JSON Schema in ``advisor/schemas/report.schema.json`` is generated from these models
(see :mod:`advisor.reports.schema`); change a model, regenerate the schema.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, datetime, timezone
from decimal import Decimal
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from advisor._version import __version__
from advisor.findings import Finding
from advisor.session import CollectionGap, DeviceInfo, Session

__all__ = [
    "METRIC_DEFINITIONS",
    "CollectorSummary",
    "JobRank",
    "JobSummary",
    "Report",
    "SessionSummary",
    "StepSummary",
    "Table",
    "TableColumn",
    "Window",
    "build_job_report",
    "build_report",
    "to_python",
]

# The metric definitions of DESIGN.md, stated in every report so a reader knows what the
# figures mean without the source.
METRIC_DEFINITIONS: dict[str, str] = {
    "window": "The profiled window: first step start to last step end; where there are no steps, first to last event.",
    "gpu_utilization": "Union of GPU activity (kernels, copies, sets) inside the window over the window "
    "length, per device.",
    "dataloader_share": "Time in the data loader's __next__ over step time.",
    "ideal_time": "max(flops / peak FLOP/s for the dtype and unit used, bytes / peak bandwidth).",
    "efficiency": "Ideal time over measured time.",
    "saving": "A finding's estimated time saved per step if fixed, and that time as a share of the mean "
    "step time; findings are ranked by it.",
}


class _Model(BaseModel):
    # A field added without regenerating the schema fails the schema test instead of
    # passing through unnoticed.
    model_config = ConfigDict(extra="forbid")


class CollectorSummary(_Model):
    """What collected the session and what it could not measure."""

    name: str = Field(description="The collector or importer, e.g. 'cupti', 'host', 'kineto-import'.")
    gpu_measured: bool = Field(description="Whether GPU activity was measured at all.")
    notes: list[str] = Field(default_factory=list, description="What was not measured and why, one line each.")
    dropped_records: int = Field(default=0, description="Records the collector lost (buffers full...).")
    gaps: list[CollectionGap] = Field(default_factory=list, description="What the collection missed, structured "
                                                                        "(the Collection Summary's rows).")


class Window(_Model):
    """The profiled window on the session's clock (see metrics.window)."""

    start_ns: int = Field(description="Window start, ns on the source's clock.")
    end_ns: int = Field(description="Window end, ns on the source's clock.")
    duration_ns: int = Field(description="end_ns - start_ns.")


class StepSummary(_Model):
    """The steps found in the window."""

    count: int = Field(description="Number of steps.")
    numbers: list[int] = Field(default_factory=list, description="Step numbers, in time order.")
    mean_step_ns: float | None = Field(default=None, description="Mean step duration in ns; null without steps.")
    unrecorded_steps: int = Field(default=0, description="Steps that ran after the recorded ones, timed but not "
                                                         "recorded (the Step Timing table).")
    unrecorded_mean_step_ns: float | None = Field(default=None, description="Their mean duration in ns: the job's "
                                                                            "own pace; null where none ran.")
    overhead_ratio: float | None = Field(default=None, description="How much longer the recorded steps took than "
                                                                   "the unrecorded ones (0.1: 10% longer).")


class SessionSummary(_Model):
    """The session's metadata: where the profile came from and what it covers."""

    source: str = Field(description="The trace file or script the session came from.")
    source_format: str = Field(description="'kineto', 'script', 'session', ...")
    collector: CollectorSummary
    devices: list[DeviceInfo] = Field(default_factory=list, description="The devices the session ran on.")
    window: Window
    steps: StepSummary
    command: list[str] | None = Field(default=None, description="The script and its arguments, where one ran.")
    exit_code: int | None = Field(default=None, description="The script's own exit code, where one ran.")
    script_error: str | None = Field(default=None, description="How the script ended, if not normally.")


class TableColumn(_Model):
    """One column of a summary table."""

    name: str = Field(description="The column's name, as in each row.")
    description: str = Field(default="", description="What the column holds, with its unit.")


class Table(_Model):
    """A summary table: rows keyed by a stable key, in the table's own order."""

    title: str = Field(description="The table's name for people, e.g. 'Model Summary'.")
    description: str = Field(default="", description="What the table shows.")
    key: str = Field(default="", description="What a row's key is, in words (e.g. 'the phase', 'the kernel name').")
    columns: list[TableColumn] = Field(default_factory=list, description="The value columns, in order.")
    notes: list[str] = Field(
        default_factory=list, description="What the table could not measure and why, one line each."
    )
    rows: list[dict[str, Any]] = Field(
        default_factory=list,
        description="One object per row: its stable 'key' and a value per column (null where missing).",
        json_schema_extra={
            "items": {
                "type": "object",
                "required": ["key"],
                "properties": {"key": {"type": "string", "title": "Key", "description": "The row's stable key."}},
            }
        },
    )

    @field_validator("rows")
    @classmethod
    def _rows_have_keys(cls, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, row in enumerate(rows):
            if not isinstance(row.get("key"), str):
                raise ValueError(f"row {i} has no string 'key'")
        return rows

    def row(self, key: str) -> dict[str, Any] | None:
        """The row with this key, or None."""
        for row in self.rows:
            if row["key"] == key:
                return row
        return None


class JobRank(_Model):
    """One rank of a job: where it came from and its own top findings."""

    rank: int = Field(description="The rank number.")
    rank_from: str = Field(description="How the number was found: distributedInfo, file name, launcher or "
                                       "order given.")
    source: str = Field(description="The rank's trace or saved session.")
    steps: int = Field(default=0, description="Steps in the rank's window.")
    mean_step_ns: float | None = Field(default=None, description="The rank's mean step, ns.")
    findings: list[Finding] = Field(default_factory=list, description="The rank's own top findings (at most "
                                                                      "three), ranked.")
    exit_code: int | None = Field(default=None, description="The rank's exit code, where advisor ran it.")
    ending: str | None = Field(default=None, description="How the rank's process ended, where advisor ran it.")


class JobSummary(_Model):
    """A job of many ranks: which ranks the report covers and which it lacks."""

    world_size: int = Field(description="The job's number of ranks.")
    ranks: list[JobRank] = Field(default_factory=list, description="The ranks read, in rank order.")
    missing_ranks: list[int] = Field(default_factory=list, description="Ranks of the job with no profile.")
    notes: list[str] = Field(default_factory=list, description="How ranks were numbered, what was left out.")


class Report(_Model):
    """The whole report: what the JSON report holds and every renderer reads."""

    advisor_version: str = Field(description="The advisor version that built the report.")
    generated: str = Field(description="When the report was built, ISO 8601 with time zone.")
    session: SessionSummary
    findings: list[Finding] = Field(
        default_factory=list,
        description="Findings ranked by estimated saving, best first; symptoms nest under their cause in 'explains'.",
    )
    tables: dict[str, Table] = Field(default_factory=dict, description="Every summary table, by name.")
    metrics: dict[str, str] = Field(
        default_factory=lambda: dict(METRIC_DEFINITIONS), description="How the report's metrics are defined."
    )
    notes: list[str] = Field(
        default_factory=list, description="Things a reader must know, e.g. 'GPU not measured: ...'."
    )
    job: JobSummary | None = Field(default=None, title="Job", description="For a job of many ranks: its ranks; the "
                                                             "findings are merged across ranks and the "
                                                             "tables are the job's (ranks, collectives) "
                                                             "and the rank tables the findings cite.")


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


def _doc_for(name: str, frame: pd.DataFrame, table_docs: Mapping[str, Any] | None) -> dict[str, Any]:
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
    columns = [str(c) for c in frame.columns if str(c) != "key"]
    descriptions = doc.get("columns") or {}
    keys = [_row_key(k) for k in frame.index]
    values = {str(c): frame[c].tolist() for c in frame.columns if str(c) != "key"}
    rows = []
    for i, key in enumerate(keys):
        row: dict[str, Any] = {"key": key}
        for column in columns:
            row[column] = to_python(values[column][i])
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


def _session_summary(session: Session, tables: dict[str, pd.DataFrame]) -> SessionSummary:
    meta = session.meta
    timing = tables.get("step_timing")
    unrecorded = 0
    unrecorded_mean = overhead = None
    if timing is not None and "ProfileStep" in timing.index:
        unrecorded = int(timing.at["ProfileStep", "unrecorded_steps"] or 0)
        if unrecorded:
            unrecorded_mean = _number(timing.at["ProfileStep", "unrecorded_avg_ns"])
            overhead = _number(timing.at["ProfileStep", "overhead_ratio"])
    start, end = session.window()
    steps = session.steps()
    durations = steps["end_ns"] - steps["start_ns"]
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
        window=Window(start_ns=start, end_ns=end, duration_ns=end - start),
        steps=StepSummary(
            count=len(steps),
            numbers=[int(s) for s in steps["step"]],
            mean_step_ns=float(durations.mean()) if len(steps) else None,
            unrecorded_steps=unrecorded,
            unrecorded_mean_step_ns=unrecorded_mean,
            overhead_ratio=overhead,
        ),
        command=list(meta.command) if meta.command is not None else None,
        exit_code=meta.exit_code,
        script_error=meta.script_error,
    )


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
    if summary.steps.count == 0:
        notes.append("No steps were found; the window runs from the first to the last event.")
    return notes


def build_report(
    session: Session,
    tables: Mapping[str, pd.DataFrame],
    findings: list[Finding],
    *,
    table_docs: Mapping[str, Any] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> Report:
    """Assemble the report from what the earlier stages produced; compute nothing new.

    ``tables`` are the summary tables (index = stable row key), copied row by row with
    NaN as null and numpy values as plain Python. ``findings`` keep the order given (the
    ranking is the rule engine's). ``table_docs`` (name -> {title, description, key,
    columns}) describes the tables; a frame's own ``attrs`` may carry the same.
    ``skipped`` (rule id -> why, the engine's) puts the rules this profile could not
    judge in the notes, so "No findings" never reads as "nothing to fix" for them.
    """
    summary = _session_summary(session, tables)
    return _assembled(summary, tables, findings, table_docs=table_docs, skipped=skipped)


def _assembled(summary: SessionSummary, tables: Mapping[str, pd.DataFrame], findings: list[Finding], *,
               table_docs: Mapping[str, Any] | None, skipped: Mapping[str, str] | None,
               rank_tables: Mapping[str, Table] | None = None, job: JobSummary | None = None) -> Report:
    """The Report of a session or a job: its tables copied, its findings, the notes."""
    return Report(
        advisor_version=__version__,
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        session=summary,
        findings=[Finding.model_validate(to_python(f.model_dump())) for f in findings],
        tables={
            **{str(name): table_from_frame(str(name), frame, _doc_for(str(name), frame, table_docs))
               for name, frame in tables.items()},
            **dict(rank_tables or {}),
        },
        metrics=dict(METRIC_DEFINITIONS),
        notes=(list(job.notes) if job is not None else []) + _notes(summary) + _skipped_notes(skipped or {}),
        job=job,
    )


# The engine's reasons for not running a rule that say something about the profile (not
# the user's choices: disabled, preview, deprecated).
_PROFILE_REASONS = {
    "needs a measured GPU": "Rules that judge GPU work did not run, the GPU was not measured",
    "needs steps, and the profile has none": "Rules that need training steps did not run, the profile has none",
}


def _skipped_notes(skipped: Mapping[str, str]) -> list[str]:
    notes = []
    for reason, lead in _PROFILE_REASONS.items():
        rules = sorted(rule for rule, why in skipped.items() if why == reason)
        if rules:
            notes.append(f"{lead}: {', '.join(rules)}.")
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
