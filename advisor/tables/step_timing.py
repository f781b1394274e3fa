"""Step Timing: every step as the collector's clock timed it, recorded or not, and what
recording cost.

The profiler records a window of steps (2 to 6 by default); the collector's step clock
times every step of the run. Steps after the window ran without the profiler, so their
times are the job's own, and the recorded steps' excess over them is what profiling
cost. The hooks' own time in each step (the collector's code the job would not run) is
taken off it. Rules take step times and phase shares from the unrecorded steps where there
are any: a saving is then a share of the job's real step, not of a slowed-down one. Steps
that run extra work every N steps are left out of those figures. The timed steps, and the
mean step the ProfileStep row states, are the step model's (advisor.step.timing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step import StepTimes, build_step_model
from advisor.step.facts import MODEL_PHASES, Facts
from advisor.tables._registry import table, with_notes

ROWS = ("ProfileStep", *MODEL_PHASES, "Others")


def times_of(f: Facts) -> StepTimes:
    """The step model's step times (advisor.step.timing): the timed steps' frames and the
    mean step, worked out there once."""
    model = f.model if f.model is not None else build_step_model(f.session)
    return model.times


def timed_frame(f: Facts) -> pd.DataFrame:
    """One row per complete timed step from the first recorded one (warm-up left out):
    step, recorded, duration_ns and ns per phase (Others the rest); the step model's."""
    return times_of(f).timed


def job_steps(f: Facts) -> pd.DataFrame:
    """The steps whose times stand for the job, those the mean step is the mean of: the
    unrecorded ones where some ran, else the recorded ones (periodic steps left out)."""
    return times_of(f).job_steps


@table(
    "step_timing",
    title="Step Timing",
    description=(
        "Each phase's mean time per step as the collector's own clock measured it, over the "
        "steps the profiler recorded and over the steps after them, which ran without it "
        "(warm-up steps before the window are left out, as are steps cut off by the end of "
        "the run). The unrecorded steps are the job's own pace: overhead is what recording "
        "added per step. Rules use the unrecorded steps' times where there are any. Empty for "
        "traces, whose steps advisor did not time."
    ),
    key="ProfileStep, Dataloader, Forward, Backward, Optimization, Others; PeriodicStep where steps run extra work "
        "every N steps (those steps' own figures, left out of the rows above)",
    columns={
        "recorded_steps": "Steps the profiler recorded.",
        "recorded_avg_ns": "Mean time per recorded step, ns.",
        "unrecorded_steps": "Steps after the window, timed but not recorded (the first one after it, which "
                            "pays for stopping the profiler, left out).",
        "unrecorded_avg_ns": "Mean time per unrecorded step, ns (NaN: none ran).",
        "unrecorded_ratio": "unrecorded_avg_ns / the unrecorded steps' mean step time: the phase's share of "
                            "the job's own step.",
        "overhead_ns": "recorded_avg_ns - unrecorded_avg_ns: what recording added per step, ns.",
        "overhead_ratio": "overhead_ns / unrecorded_avg_ns.",
        "best_avg_ns": "The figure to use: unrecorded_avg_ns where steps ran unrecorded, else recorded_avg_ns.",
        "best_ratio": "best_avg_ns / the matching mean step time.",
        "source": "'unrecorded steps' or 'recorded steps': where best_avg_ns comes from.",
        "cpu_cores": "ProfileStep only: the process's CPU time per step (all its threads: torch's operator "
                     "threads too) over the step's time, over the steps best_avg_ns is the mean of: the cores "
                     "the training process keeps busy, idle operator threads spinning between operators included "
                     "(NaN on the other rows and where not measured).",
    },
)
def step_timing_table(f: Facts) -> pd.DataFrame | None:
    times = times_of(f)
    if not len(times.timed):
        return None
    # The step model's frames (periodic steps left out of both) and its step times: the
    # ProfileStep row states the facts as advisor.step.timing worked them out.
    recorded, unrecorded = times.recorded, times.unrecorded
    columns = {"ProfileStep": "duration_ns", **{phase: phase for phase in (*MODEL_PHASES, "Others")}}
    rows = {}
    step_unrecorded = times.unrecorded_step_ns if times.unrecorded_step_ns is not None else np.nan
    step_recorded = float(recorded["duration_ns"].mean()) if len(recorded) else np.nan
    for row in ROWS:
        column = columns[row]
        if row == "ProfileStep":
            rec, unrec = step_recorded, step_unrecorded
        else:
            rec = float(recorded[column].mean()) if len(recorded) else np.nan
            unrec = float(unrecorded[column].mean()) if len(unrecorded) else np.nan
        best, base, source = (unrec, step_unrecorded, "unrecorded steps") if len(unrecorded) else \
            (rec, step_recorded, "recorded steps")
        if row == "ProfileStep" and (len(recorded) or len(unrecorded)):
            best = times.mean_step_ns  # the mean step itself (the same figure: read, not derived again)
        rows[row] = {
            "recorded_steps": len(recorded),
            "recorded_avg_ns": rec,
            "unrecorded_steps": len(unrecorded),
            "unrecorded_avg_ns": unrec,
            "unrecorded_ratio": unrec / step_unrecorded if step_unrecorded > 0 else np.nan,
            "overhead_ns": rec - unrec,
            "overhead_ratio": (rec - unrec) / unrec if unrec > 0 else np.nan,
            "best_avg_ns": best,
            "best_ratio": best / base if base > 0 else np.nan,
            "source": source,
            "cpu_cores": _cpu_cores(unrecorded if len(unrecorded) else recorded) if row == "ProfileStep" else np.nan,
        }
    periodic = f.model.window.periodic if f.model is not None else None
    if periodic is not None and periodic.source == "timed steps":
        rows["PeriodicStep"] = _periodic_row(times.timed, periodic.steps, step_unrecorded, step_recorded)
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not len(unrecorded):
        with_notes(out, "No step ran after the recorded ones, so the job's unprofiled pace was not measured: "
                        "figures are the recorded steps' (run more steps than --steps records to measure it).")
    return out


def _cpu_cores(steps: pd.DataFrame) -> float:
    """The process's CPU time over the wall time of ``steps``; NaN where any step's CPU
    time was not measured."""
    cpu = steps["process_cpu_ns"].to_numpy(dtype=np.float64) if "process_cpu_ns" in steps else np.zeros(0)
    wall = float(steps["duration_ns"].sum()) if len(steps) else 0.0
    if not len(cpu) or (cpu <= 0).any() or wall <= 0:
        return np.nan
    return float(cpu.sum() / wall)


def _periodic_row(frame: pd.DataFrame, steps: tuple[int, ...], steady_unrecorded: float,
                  steady_recorded: float) -> dict:
    """The periodic steps' own figures: their mean time, recorded and not, against the
    steady step's (the ratio columns)."""
    slow = frame[frame["step"].isin(steps)]
    recorded, unrecorded = slow[slow["recorded"]], slow[~slow["recorded"]]
    rec = float(recorded["duration_ns"].mean()) if len(recorded) else np.nan
    unrec = float(unrecorded["duration_ns"].mean()) if len(unrecorded) else np.nan
    best, base = (unrec, steady_unrecorded) if len(unrecorded) else (rec, steady_recorded)
    return {"recorded_steps": len(recorded), "recorded_avg_ns": rec, "unrecorded_steps": len(unrecorded),
            "unrecorded_avg_ns": unrec,
            "unrecorded_ratio": unrec / steady_unrecorded if steady_unrecorded > 0 else np.nan,
            "overhead_ns": rec - unrec, "overhead_ratio": (rec - unrec) / unrec if unrec > 0 else np.nan,
            "best_avg_ns": best, "best_ratio": best / base if base > 0 else np.nan,
            "source": "unrecorded steps" if len(unrecorded) else "recorded steps", "cpu_cores": np.nan}
