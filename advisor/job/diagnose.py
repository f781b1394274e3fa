"""A whole job's diagnosis, from its ranks' summaries.

Every single-rank rule has already run on every rank (in the workers). Here the job's
cross-rank tables are made (advisor.tables.job), each rule's findings are merged across
ranks into one finding that says on how many ranks it fires and where it is worst, the
rules that judge the job as a whole (``requires: [ranks]``, e.g. straggler-rank) run over
the cross-rank tables, and all of them are ranked together, so a straggler on one rank
nests the exposed collectives it causes on the others.

A merged finding keeps the worst rank's figures and evidence; its evidence names that
rank's tables as ``rank N/TABLE``, and the report carries those tables, so every row a
finding cites is in the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from advisor.findings import Finding
from advisor.job.run import Job
from advisor.job.summarise import RuleChoice
from advisor.reports.report import JobRank as JobRankEntry
from advisor.reports.report import JobSummary, Report, SessionSummary, StepSummary, Table
from advisor.tables.job import RankRow, job_tables

__all__ = ["JobDiagnosis", "diagnose_job", "diagnose_saved_job", "merge_findings"]


@dataclass
class JobDiagnosis:
    tables: dict[str, pd.DataFrame]
    rank_tables: dict[str, Table]
    findings: list[Finding]
    summary: SessionSummary
    job: JobSummary
    errors: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def report(self) -> Report:
        """The job's report: its summary, cross-rank and cited rank tables, findings."""
        from advisor.reports.build import build_job_report
        from advisor.tables import JOB_TABLE_DOCS

        return build_job_report(self.summary, self.tables, self.findings, self.job, rank_tables=self.rank_tables,
                                table_docs=JOB_TABLE_DOCS, skipped=self.skipped)


def rank_table_name(rank: int, table: str) -> str:
    return f"rank {rank}/{table}"


def merge_findings(job: Job) -> tuple[list[Finding], dict[str, Table]]:
    """One finding per rule fired on any rank: the worst rank's (largest saving), titled
    with how many ranks it fires on; the tables its evidence cites, under their rank."""
    by_rule: dict[str, list[tuple[int, Finding]]] = {}
    for entry in job.ranks:
        for finding in entry.summary.report.findings:
            by_rule.setdefault(finding.rule, []).append((entry.rank, finding))
    reports = {entry.rank: entry.summary.report for entry in job.ranks}
    merged: list[Finding] = []
    cited: dict[str, Table] = {}
    n = len(job.ranks)
    for fired in by_rule.values():
        rank, worst = max(fired, key=lambda item: item[1].saving.ms_per_step)
        ranks = sorted({r for r, _ in fired})
        finding = worst.model_copy(deep=True)
        if n > 1:
            finding.title = f"{finding.title} (on {len(ranks)} of {n} ranks, worst on rank {rank})"
        finding.metrics = {**finding.metrics, "ranks": ranks, "worst_rank": rank,
                           "ms_per_step_by_rank": {str(r): f.saving.ms_per_step for r, f in fired}}
        _retarget(finding, rank, reports[rank], cited)
        merged.append(finding)
    return merged, cited


def _retarget(finding: Finding, rank: int, report, cited: dict[str, Table]) -> None:
    for evidence in finding.evidence:
        if evidence.kind == "table_row" and evidence.table and evidence.table in report.tables:
            name = rank_table_name(rank, evidence.table)
            cited[name] = report.tables[evidence.table]
            evidence.table = name
        evidence.note = f"rank {rank}: {evidence.note}" if evidence.note else f"rank {rank}"
    for symptom in finding.explains:
        _retarget(symptom, rank, report, cited)


def diagnose_job(job: Job, choice: RuleChoice | None = None, *, sources_kept: bool = True) -> JobDiagnosis:
    """The job's tables, findings and report sections. ``sources_kept`` False: the ranks'
    sessions are not kept after this run (a launch without --save), so nothing points at them."""
    from advisor.rules import run_job_rules

    choice = choice or RuleChoice()
    rows = [RankRow(rank=e.rank, rank_from=e.rank_from, source=e.summary.source if sources_kept else "",
                    figures=e.summary.figures,
                    calls=e.summary.calls,
                    top_finding=e.summary.report.findings[0].rule if e.summary.report.findings else None)
            for e in job.ranks]
    tables = job_tables(rows)
    merged, cited = merge_findings(job)
    reports = [e.summary.report for e in job.ranks]
    # The job's step: the mean over its ranks of each rank's mean step, the one its own rules
    # use (its step model's mean_step_ns, advisor.step.timing: its own pace where steps ran
    # unrecorded).
    means = [e.summary.figures.get("mean_step_ns") for e in job.ranks]
    means = [m for m in means if m]
    mean_step = float(sum(means) / len(means)) if means else 0.0
    steps = min(r.session.steps.count for r in reports)
    gpu_measured = all(r.session.collector.gpu_measured for r in reports)
    result = run_job_rules(tables, merged, ranks=len(job.ranks), step_count=steps, mean_step_ns=mean_step,
                           gpu_measured=gpu_measured, specs=choice.specs, disabled=set(choice.disabled),
                           enabled=set(choice.enabled), preview=choice.preview)
    findings = _nest_under_stragglers(result.findings, len(job.ranks))
    errors = [f"rank {e.rank}: {error}" for e in job.ranks for error in e.summary.errors] + result.errors
    skipped = {}
    for e in job.ranks:
        skipped.update(e.summary.skipped)
    skipped.update(result.skipped)
    return JobDiagnosis(tables=tables, rank_tables=cited, findings=findings,
                        summary=_job_summary(job, reports, steps, gpu_measured),
                        job=_job_entries(job), errors=errors, skipped=skipped)


def _nest_under_stragglers(findings: list[Finding], n_ranks: int) -> list[Finding]:
    """A finding that fires on the straggler alone is part of what it does differently:
    shown under the straggler (its cause at the job's level), not ranked beside it."""
    stragglers = {f.metrics.get("rank"): f for f in findings if f.rule == "straggler-rank"}
    if n_ranks < 2 or not stragglers:
        return findings
    roots = []
    for finding in findings:
        only = finding.metrics.get("ranks")
        owner = stragglers.get(only[0]) if isinstance(only, list) and len(only) == 1 else None
        if owner is not None and finding is not owner:
            owner.explains.append(finding)
        else:
            roots.append(finding)
    return roots


def _job_summary(job: Job, reports, steps: int, gpu_measured: bool) -> SessionSummary:
    """The job's session line: the lowest rank's window and devices, the ranks' notes once."""
    first = reports[0].session
    notes: list[str] = []
    for report in reports:
        for note in report.session.collector.notes:
            if note not in notes:
                notes.append(note)
    collector = first.collector.model_copy(update={
        "name": f"{first.collector.name}, {len(reports)} rank{'s' if len(reports) != 1 else ''}",
        "gpu_measured": gpu_measured, "notes": notes,
        "dropped_records": sum(r.session.collector.dropped_records for r in reports),
        "gaps": [g for r in reports for g in r.session.collector.gaps],
    })
    fewest = min(reports, key=lambda r: r.session.steps.count).session
    recorded = [r.session.steps.mean_step_ns for r in reports if r.session.steps.mean_step_ns]
    unrecorded = [r.session.steps.unrecorded_mean_step_ns for r in reports if r.session.steps.unrecorded_mean_step_ns]
    return first.model_copy(update={
        "source": job.source,
        "source_format": "job",
        "collector": collector,
        "steps": StepSummary(count=steps, numbers=list(fewest.steps.numbers),
                             mean_step_ns=sum(recorded) / len(recorded) if recorded else None,
                             unrecorded_steps=min(r.session.steps.unrecorded_steps for r in reports),
                             unrecorded_mean_step_ns=sum(unrecorded) / len(unrecorded) if unrecorded else None),
        "command": job.command,
        "script_error": _first_cause(job, reports),
    })


# Errors a rank raises because another rank died first: the knock-on, not the cause.
_KNOCK_ON = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|NCCL communicator was aborted|"
                       r"ProcessGroup.*(abort|timed out)|Socket Timeout|KeyboardInterrupt|signal \d+", re.IGNORECASE)


def _first_cause(job: Job, reports) -> str | None:
    """How the job failed, in the words of the rank that caused it: a rank's own error
    before another's knock-on error (a lost peer, an abort), else the lowest rank's."""
    errors = [(e.rank, r.session.script_error) for e, r in zip(job.ranks, reports, strict=True)
              if r.session.script_error]
    if not errors:
        return None
    own = [(rank, error) for rank, error in errors if not _KNOCK_ON.search(error)]
    rank, error = (own or errors)[0]
    return f"rank {rank}: {error}"


def _job_entries(job: Job) -> JobSummary:
    return JobSummary(
        world_size=job.world_size,
        missing_ranks=list(job.missing),
        notes=list(job.notes),
        ranks=[JobRankEntry(
            rank=e.rank, rank_from=e.rank_from, source=e.summary.source,
            steps=e.summary.report.session.steps.count,
            mean_step_ns=e.summary.report.session.steps.mean_step_ns,
            findings=[f.model_copy(update={"explains": []}) for f in e.summary.report.findings[:3]],
            exit_code=e.exit_code, ending=e.ending,
        ) for e in job.ranks],
    )


def diagnose_saved_job(folder, choice: RuleChoice | None = None, *, workers: int = 1) -> tuple[Job, JobDiagnosis]:
    """A job saved with --save (job.json and rank-N/ sessions), read and diagnosed as
    `advisor diagnose FOLDER` does."""
    from pathlib import Path

    from advisor.job.inputs import job_sources, read_manifest
    from advisor.job.launch import Launch
    from advisor.job.run import order_ranks, summarise_job

    folder = Path(folder)
    launch = Launch.from_manifest(folder, read_manifest(folder))
    summaries = summarise_job(job_sources([folder]), choice=choice, workers=workers)
    job = order_ranks(summaries, source=str(folder), launcher_ranks=launch.ranks)
    launch.annotate(job)
    return job, diagnose_job(job, choice)
