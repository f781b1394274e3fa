"""The report: the contract of the JSON report, as pydantic models (no pandas).

``advisor.reports.build`` assembles a :class:`Report` from what the earlier stages
produced; it computes nothing new. Every renderer (terminal, JSON, Markdown, HTML) reads
only a Report, so a report rendered again from a saved session, or from a kept report
(advisor.cli.report_cache), says the same thing in every format.

The JSON Schema in ``advisor/schemas/report.schema.json`` is generated from these models
(see :mod:`advisor.reports.schema`); change a model, regenerate the schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from advisor.findings import Finding
from advisor.session import CollectionGap, DeviceInfo

__all__ = [
    "METRIC_DEFINITIONS",
    "CollectorSummary",
    "CombinedSaving",
    "JobRank",
    "JobSummary",
    "PeriodicSteps",
    "Report",
    "SessionSummary",
    "SetApartSpan",
    "StepSummary",
    "Table",
    "TableColumn",
    "Window",
]

# The metric definitions of docs/design.md, stated in every report so a reader knows what the
# figures mean without the source.
METRIC_DEFINITIONS: dict[str, str] = {
    "window": "The steady window: first to last steady step (recorded, else inferred from what repeats: the data "
    "loader's reads, the optimizer's steps, the top-level module call, graph replays); where there are no steps, the "
    "stretch where the work runs. Start-up, compilation, graph capture, work in flight from before the trace and "
    "start-up steps are set apart and named.",
    "idle_partition": "The GPU's idle time in the window, each nanosecond given one cause (work queued on the device, "
    "the host blocked on it, data loading, communication, launch calls, host work in or outside the model, nothing "
    "recorded): the causes sum to the idle time.",
    "gpu_utilization": "Union of GPU activity (kernels, copies, sets) inside the window over the window "
    "length, per device.",
    "dataloader_share": "Time in the data loader's __next__ over step time.",
    "ideal_time": "max(flops / peak FLOP/s for the dtype and unit used, bytes / peak bandwidth).",
    "efficiency": "Ideal time over measured time.",
    "mean_step": "The job's step: the mean of the steps that ran after the recorded ones without the profiler where "
    "there are any (the job's own pace), else of the recorded steps; steps that run extra work every N steps left out, "
    "that work spread over the steps where a saving is a share of the step. The session line's mean step is the "
    "recorded steady steps' mean, beside the unrecorded steps' where some ran.",
    "saving": "A finding's estimated time saved per step if fixed, and that time as a share of the mean "
    "step time; findings are ranked by it. Where the step model's graph holds the fix, it is the replayed step's "
    "reduction with the fix applied, never more than the time the fix changes.",
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


class SetApartSpan(_Model):
    """A stretch of the profile judged apart from the steady steps."""

    kind: str = Field(description="start-up, compilation, capture, in flight, start-up step or periodic step.")
    start_ns: int = Field(description="Start, ns on the source's clock.")
    end_ns: int = Field(description="End, ns on the source's clock.")
    duration_ns: int = Field(description="end_ns - start_ns.")
    what: str = Field(description="What it is, in words, with what shows it.")
    event_ids: list[int] = Field(default_factory=list, description="Row ids of the events that show it.")


class PeriodicSteps(_Model):
    """Steps that run extra work every N steps (validation, checkpointing, logging)."""

    every: int = Field(description="The period, in steps.")
    steps: list[int] = Field(default_factory=list, description="The slow steps' numbers.")
    extra_ns: float = Field(description="A slow step's time over a steady one's, ns (mean).")
    steady_ns: float = Field(description="A steady step, ns (median).")
    share_of_run: float = Field(description="The extra time over all the timed steps' time (0..1).")
    phase: str = Field(description="Where the extra time is: a phase, or Others (outside every phase).")
    source: str = Field(description="'timed steps' (every step the collector timed) or 'recorded steps'.")
    timed: int = Field(description="How many steps the figures cover.")


class Window(_Model):
    """The profiled window on the session's clock (see metrics.window), as the step model
    chose it."""

    start_ns: int = Field(description="Window start, ns on the source's clock.")
    end_ns: int = Field(description="Window end, ns on the source's clock.")
    duration_ns: int = Field(description="end_ns - start_ns.")
    source: str = Field(default="", description="Where the steps came from: recorded, dataloader, optimizer, "
                                                "module calls, graph replays (inferred), or work span (no steps).")
    how: str = Field(default="", description="The same, in words.")
    steady: bool = Field(default=True, description="Whether the profile holds steady work; false for a profile "
                                                   "that is all start-up, compilation or graph capture.")
    not_steady: str = Field(default="", description="Why not, where not steady.")
    one_pass: bool = Field(default=False, description="Whether the profile shows its work once (no steps found, "
                                                      "or a first step alone): each saving is then per pass.")
    headline: str = Field(default="", description="What a reader must know before any finding, said at the top "
                                                  "of every format: the profile is one pass, or no steady state, "
                                                  "and how to record steady steps; empty where neither.")
    set_apart: list[SetApartSpan] = Field(default_factory=list, description="What was judged apart from the "
                                                                             "steady steps, and why.")
    periodic: PeriodicSteps | None = Field(default=None, title="Periodic", description="Steps that run extra work "
                                                                                        "every N steps, where there "
                                                                                        "are any.")


class CombinedSaving(_Model):
    """Every finding's fix applied at once, replayed on the step model's graph."""

    ms_per_step: float = Field(ge=0, description="Milliseconds saved per step with every fix applied.")
    share_of_step: float = Field(ge=0, le=1, description="The same as a share of the step (0..1).")
    step_before_ms: float = Field(ge=0, description="The step as the graph replays it, ms.")
    step_after_ms: float = Field(ge=0, description="The step with every fix applied, ms.")
    rules: list[str] = Field(default_factory=list, description="The findings whose fixes it applies.")
    includes: str = Field(default="", description="What step_before_ms counts beside the steady step (work run "
                                                  "every N steps, spread over them); empty where nothing.")
    basis: str = Field(default="", description="How it was made, in one sentence.")


class StalledStep(_Model):
    """A step set apart from the mean step as a stall (advisor.step.timing)."""

    step: int = Field(description="The step's number.")
    duration_ns: float = Field(description="How long it took, ns.")
    times_median: float = Field(description="Its time over the median step's.")


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
    stalled: list[StalledStep] = Field(default_factory=list, description=(
        "Steps set apart from the mean step as stalls: over ten times the median step, and few (at most one in "
        "twenty, three in all); a pause of the process (most likely the garbage collector or the machine), not the "
        "loop's pace."))


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
    combined: CombinedSaving | None = Field(default=None, title="Combined", description="Every finding's fix at "
                                                                                          "once: shared time counted "
                                                                                          "once (null where no fix "
                                                                                          "was replayed).")
    job: JobSummary | None = Field(default=None, title="Job", description="For a job of many ranks: its ranks; the "
                                                             "findings are merged across ranks and the "
                                                             "tables are the job's (ranks, collectives) "
                                                             "and the rank tables the findings cite.")


