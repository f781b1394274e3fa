"""One diagnosis, whatever door it came through.

``diagnose(session)`` assembles the flow once: the step model (the steady window, the
steady Session, the partition of the step's time and the graph fixes are replayed on),
the summary tables of the steady Session, the rules over both, and the report. The command
line, a job's ranks, the Profiler API and the rule-pack scaffold all call it, so a
diagnosis says the same thing whichever way it was asked for.

    diagnosis = diagnose(session)                      # the built-in rules
    diagnosis = diagnose(session, specs=pack.rules)    # a pack's
    diagnosis.findings, diagnosis.tables, diagnosis.report
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advisor.reports.build import build_report
from advisor.reports.report import (CombinedSaving, PeriodicSteps, Report, SetApartSpan, StalledStep, StepSummary,
                                   Window)
from advisor.rules.engine import Combined, EngineResult, combined_estimate, run_rules
from advisor.session import Session
from advisor.session.busy import busy_share
from advisor.step import StepModel, build_step_model
from advisor.step.steady import headline_for
from advisor.tables import TABLE_DOCS, compute_tables
from advisor.units import format_ns

__all__ = ["Diagnosis", "cached_tables", "command_tables", "diagnose", "report_steps", "report_window"]


@dataclass
class Diagnosis:
    """What a diagnosis made: the step model, the tables, the rules' result, the report."""

    model: StepModel
    tables: dict[str, pd.DataFrame]
    result: EngineResult
    report: Report

    @property
    def session(self) -> Session:
        """The steady session every figure is of."""
        return self.model.session

    @property
    def findings(self) -> list[Any]:
        return self.result.findings


def diagnose(session: Session, *, specs: list[Any] | None = None, disabled: Iterable[str] = (),
             enabled: Iterable[str] = (), preview: bool = False,
             tables: Callable[[StepModel, list[str] | None], dict[str, pd.DataFrame]] | None = None) -> Diagnosis:
    """Diagnose ``session`` (as read or collected): the chosen rules (the built-in ones by
    default) over its step model and tables. ``tables(model, None)`` gives the tables
    where given (``cached_tables``: the session cache's, which keeps them); else they are
    computed here."""
    model = build_step_model(session)
    steady = model.session
    computed = tables(model, None) if tables is not None else compute_tables(steady, None, model=model)
    result = run_rules(steady, computed, specs, disabled=set(disabled), enabled=set(enabled), preview=preview,
                       model=model)
    _say_the_load(result.findings, busy_share(steady.meta.trace_metadata))
    report = build_report(_named_devices(steady), computed, result.findings, table_docs=TABLE_DOCS,
                          skipped=result.skipped,
                          window=report_window(model), combined=_combined(result.combined, model),
                          steps=report_steps(model))
    return Diagnosis(model, computed, result, report)


def _named_devices(session: Session) -> Session:
    """``session`` with each AMD GPU's architecture named from the knowledge base
    ('gfx942, CDNA 3'): ROCm writes its GFXIP version where CUDA's compute capability goes,
    which reads as an NVIDIA part's ('sm 9.4') without it. The same session where none is."""
    from advisor.knowledge import hardware as kb

    devices, named = [], False
    for device in session.meta.devices:
        profile = kb.match_device(device) if device.kind == "gpu" and device.vendor == "amd" else None
        if profile is not None and profile.vendor == "amd" and not device.architecture:
            device, named = device.model_copy(update={"architecture": profile.label}), True
        devices.append(device)
    if not named:
        return session
    return Session(session.meta.model_copy(update={"devices": devices}), session.events, window=session.window())


def _say_the_load(findings: list[Any], share: float | None) -> None:
    """On a busy machine, each saving carries the load its milliseconds were measured under
    (the reports then lead with the share of the step, which holds)."""
    if share is None:
        return
    for finding in findings:
        if finding.saving is not None and finding.saving.ms_per_step > 0:
            finding.saving.busy_share = round(share, 4)
        _say_the_load(list(finding.explains), share)


def command_tables(model: StepModel, names: list[str] | None = None) -> dict[str, pd.DataFrame]:
    """The summary tables of ``model`` as advisor's own commands compute them: the memory
    each table's work freed given back before the next, on a large session
    (advisor.importers.pages). advisor.Profiler, inside the user's job, computes them without."""
    from advisor.importers.pages import give_back_freed

    return compute_tables(model.session, names, between=give_back_freed, model=model)


def cached_tables(read_from: Path | None) -> Callable[[StepModel, list[str] | None], dict[str, pd.DataFrame]]:
    """The tables as a command gets them (``command_tables``), kept in the session cache
    entry of the trace file ``read_from`` where one is given: the door says the session was
    read from that file through the cache (advisor.importers.cache.tables)."""
    from advisor.importers import cache

    def tables(model: StepModel, names: list[str] | None) -> dict[str, pd.DataFrame]:
        return cache.tables(model.session, lambda _steady, wanted: command_tables(model, wanted), names,
                            read_from=read_from)

    return tables


def report_window(model: StepModel) -> Window:
    """The step model's window as the report states it."""
    window = model.window
    periodic = window.periodic
    return Window(
        start_ns=window.start_ns, end_ns=window.end_ns, duration_ns=window.duration_ns, source=window.source,
        how=window.how, steady=window.steady, not_steady=window.not_steady,
        one_pass=window.steady and not window.recurs and window.source != "empty", headline=headline_for(window),
        set_apart=[SetApartSpan(kind=s.kind, start_ns=s.start_ns, end_ns=s.end_ns, duration_ns=s.duration_ns,
                                what=s.what, event_ids=list(s.events)) for s in window.set_apart],
        periodic=None if periodic is None else PeriodicSteps(
            every=periodic.every, steps=list(periodic.steps), extra_ns=periodic.extra_ns,
            steady_ns=periodic.steady_ns, share_of_run=periodic.share_of_run, phase=periodic.phase,
            source=periodic.source, timed=periodic.timed),
    )


def report_steps(model: StepModel) -> StepSummary:
    """The step model's steps and their times as the report states them: the steady steps'
    mean (``recorded_step_ns``) and the unrecorded steps' (``unrecorded_step_ns``), the
    facts of advisor.step.timing; what recording cost, the one over the other less one (the
    line says the two means and the cost, so the cost is theirs: the Step Timing table's
    overhead is of its own means, over every recorded step)."""
    steps = model.window.steps
    times = model.times
    unrecorded = len(times.unrecorded)
    recorded, unrecorded_ns = times.recorded_step_ns, times.unrecorded_step_ns
    overhead = (recorded / unrecorded_ns - 1.0 if unrecorded and len(steps) and unrecorded_ns and recorded
                and math.isfinite(recorded / unrecorded_ns) else None)
    job = times.job_steps
    median = float(np.median(job["duration_ns"].to_numpy(dtype=np.float64))) if len(job) else 0.0
    stalled = [StalledStep(step=int(row.step), duration_ns=float(row.duration_ns),
                           times_median=round(float(row.duration_ns) / median, 1) if median > 0 else 0.0)
               for row in times.stalled.itertuples()]
    return StepSummary(count=len(steps), numbers=[int(n) for n in steps["step"]] if len(steps) else [],
                       mean_step_ns=times.recorded_step_ns if len(steps) else None, unrecorded_steps=unrecorded,
                       unrecorded_mean_step_ns=times.unrecorded_step_ns, overhead_ratio=overhead, stalled=stalled)


def with_verified(diagnosis: Diagnosis, findings: list[Any]) -> Report:
    """The report with the findings as `advisor verify` left them (measured, ranked by what
    was measured) and every fix at once replayed again without the fixes the trials measured
    slower: a combined estimate that keeps a fix known to cost time promises what no one
    will see."""
    kept = [f for f in findings if f.verification is None or f.verification.measured_saving_ms_per_step > 0]
    combined = combined_estimate(diagnosis.model, kept) if len(kept) < len(findings) else diagnosis.result.combined
    return diagnosis.report.model_copy(update={"findings": findings,
                                               "combined": _combined(combined, diagnosis.model)})


def _combined(combined: Combined | None, model: StepModel) -> CombinedSaving | None:
    if combined is None or combined.before_ns <= 0:
        return None
    periodic = model.window.periodic
    beside = (f"the work run every {periodic.every} steps, {format_ns(combined.beside_ns)} a step spread over them"
              if combined.beside_ns > 0 and periodic is not None else "")
    # The step it starts from is the one the report states (the Window line's, with the
    # work run every N steps spread over it) and every finding's share is of; the replay's
    # own step, a little off it, gives only what the fixes save. Where a fix's base took
    # advisor's own cost out of the step, the findings' shares are of that step: so is this.
    stated = model.mean_step_ns + model.times.beside_ns
    before = combined.before_ns if combined.based or not stated else stated
    saved = min(combined.saved_ns, before)
    return CombinedSaving(
        ms_per_step=round(saved / 1e6, 4),
        share_of_step=round(min(saved / before, 1.0), 4),
        step_before_ms=round(before / 1e6, 4), step_after_ms=round((before - saved) / 1e6, 4),
        rules=list(combined.rules),
        includes=beside,
        basis="every finding's fix applied at once to the step's dependency graph and replayed: time two fixes "
              "share is saved once")
