"""Step Timing: every step as the collector's clock timed it, recorded or not, and what
recording cost.

The profiler records a window of steps (2 to 6 by default); the collector's step clock
times every step of the run. Steps after the window ran without the profiler, so their
times are the job's own, and the recorded steps' excess over them is what profiling
cost. The hooks' own time in each step (the collector's code the job would not run) is
taken off it. Rules take step times and phase shares from the unrecorded steps where there
are any: a saving is then a share of the job's real step, not of a slowed-down one. Steps
that run extra work every N steps are left out of those figures (see unrecorded_steps).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step.facts import MODEL_PHASES, Facts
from advisor.tables._registry import table, with_notes

ROWS = ("ProfileStep", *MODEL_PHASES, "Others")


def timed_frame(f: Facts) -> pd.DataFrame:
    """One row per complete timed step: step, recorded, duration_ns and ns per phase
    (Others the rest). Warm-up steps (those before the first recorded step) are left out:
    their time is start-up, not the job's pace."""

    def compute() -> pd.DataFrame:
        rows = [t for t in f.meta.timed_steps if not t.partial]
        if not rows:
            return pd.DataFrame(columns=["step", "recorded", "duration_ns", *MODEL_PHASES, "Others"])
        recorded = [t.step for t in rows if t.recorded]
        first = min(recorded) if recorded else min(t.step for t in rows)
        kept = [t for t in rows if t.step >= first]
        # The collector's own time in a step (its hooks' code) is not the job's: taken off
        # the step (and so off its Others, the time between its phases).
        frame = pd.DataFrame({
            "step": [t.step for t in kept],
            "recorded": [t.recorded for t in kept],
            "duration_ns": np.asarray([max(t.duration_ns - t.own_ns, 0) for t in kept], dtype=np.int64),
            **{phase: np.asarray([t.phases.get(phase, 0) for t in kept], dtype=np.int64) for phase in MODEL_PHASES},
        })
        frame["Others"] = np.maximum(frame["duration_ns"] - frame[list(MODEL_PHASES)].sum(axis=1), 0)
        return frame

    return f.memo("timed_steps", compute)


def unrecorded_steps(f: Facts) -> pd.DataFrame:
    """The steps that ran after the window without the profiler: the job's own pace. The
    first one after the window pays for stopping the profiler (its buffers are released
    as the step runs) and is left out where others remain; so are the steps that run extra
    work every N steps (a validation pass, a checkpoint: the step model's periodic steps),
    judged apart by periodic-step-work rather than spread into every step's figures."""
    frame = timed_frame(f)
    periodic = f.model.window.periodic if f.model is not None else None
    if periodic is not None and periodic.source == "timed steps":
        frame = frame[~frame["step"].isin(periodic.steps)]
    recorded = frame[frame["recorded"]]
    unrecorded = frame[~frame["recorded"]]
    if len(recorded) and len(unrecorded) > 2:
        unrecorded = unrecorded[unrecorded["step"] != recorded["step"].max() + 1]
    return unrecorded


def job_steps(f: Facts) -> pd.DataFrame:
    """The steps whose times stand for the job: the unrecorded ones where some ran, else
    the recorded ones."""
    unrecorded = unrecorded_steps(f)
    return unrecorded if len(unrecorded) else timed_frame(f)


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
    },
)
def step_timing_table(f: Facts) -> pd.DataFrame | None:
    frame = timed_frame(f)
    if not len(frame):
        return None
    recorded = frame[frame["recorded"]]
    unrecorded = unrecorded_steps(f)
    columns = {"ProfileStep": "duration_ns", **{phase: phase for phase in (*MODEL_PHASES, "Others")}}
    rows = {}
    step_unrecorded = float(unrecorded["duration_ns"].mean()) if len(unrecorded) else np.nan
    step_recorded = float(recorded["duration_ns"].mean()) if len(recorded) else np.nan
    for row in ROWS:
        column = columns[row]
        rec = float(recorded[column].mean()) if len(recorded) else np.nan
        unrec = float(unrecorded[column].mean()) if len(unrecorded) else np.nan
        best, base, source = (unrec, step_unrecorded, "unrecorded steps") if len(unrecorded) else \
            (rec, step_recorded, "recorded steps")
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
        }
    periodic = f.model.window.periodic if f.model is not None else None
    if periodic is not None and periodic.source == "timed steps":
        rows["PeriodicStep"] = _periodic_row(timed_frame(f), periodic.steps, step_unrecorded, step_recorded)
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not len(unrecorded):
        with_notes(out, "No step ran after the recorded ones, so the job's unprofiled pace was not measured: "
                        "figures are the recorded steps' (run more steps than --steps records to measure it).")
    return out


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
            "source": "unrecorded steps" if len(unrecorded) else "recorded steps"}
