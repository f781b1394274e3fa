"""The step's time: the mean step, worked out here and nowhere else.

``step_times(session, window)`` is the one function that says how long a step takes; the
step model offers what it returns as ``StepModel.times`` (and its ``mean_step_ns``,
``recorded_step_ns`` and ``unrecorded_step_ns``). Tables, rules, the job's figures,
``advisor compare`` and the report read these facts; none derives a step time of its own.

Three facts, because they mean three things:

    recorded_step_ns    The steady steps the profile holds (recorded, or inferred from what
                        repeats), as the profile timed them; steps found to run extra work every
                        N steps (``Periodic`` from the recorded steps) left out; the window's
                        length where there are no steps. The figures measured in the window (the
                        idle partition, the graph's replay) are per step of these steps.
    unrecorded_step_ns  The steps the collector timed after the window, which ran without the
                        profiler: the job's own pace (None where none ran, as for every trace).
    mean_step_ns        The job's step, which savings are shares of and which rules and rule
                        packs call the mean step: ``unrecorded_step_ns`` where steps ran
                        unrecorded, else the recorded steps as the collector's clock timed them,
                        else ``recorded_step_ns``.

and one beside them, ``beside_ns``: the extra work of the periodic steps, spread over every
step; the step as the run averages it (a user's own timer) is ``mean_step_ns + beside_ns``.

The collector's clock times every step of a script's run (``SessionMeta.timed_steps``); its
frames are here too: ``timed`` (every complete timed step from the first recorded one on,
warm-up left out), and of those the ``recorded`` and ``unrecorded`` steps the facts are
means of, periodic steps left out of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.session import Session
from advisor.step.facts import MODEL_PHASES
from advisor.step.window import SteadyWindow

__all__ = ["StepTimes", "step_times", "timed_frame"]

TIMED_COLUMNS = ("step", "recorded", "duration_ns", *MODEL_PHASES, "Others", "process_cpu_ns")


@dataclass(frozen=True)
class StepTimes:
    """How long a step takes (see the module docstring), ns."""

    mean_step_ns: float
    recorded_step_ns: float
    unrecorded_step_ns: float | None
    beside_ns: float
    # The collector's timed steps: step, recorded, duration_ns, ns per phase (Others the rest)
    # and the process's CPU time (0: not measured).
    timed: pd.DataFrame
    recorded: pd.DataFrame
    unrecorded: pd.DataFrame

    @property
    def job_steps(self) -> pd.DataFrame:
        """The timed steps ``mean_step_ns`` is the mean of: the unrecorded ones where some
        ran, else the recorded ones (empty where the collector timed none)."""
        return self.unrecorded if len(self.unrecorded) else self.recorded


def step_times(session: Session, window: SteadyWindow) -> StepTimes:
    """The step's time in ``session`` (the steady session of ``window``): the one
    derivation of the mean step (see the module docstring)."""
    periodic = window.periodic
    timed = timed_frame(session)
    steady = timed
    if periodic is not None and periodic.source == "timed steps":
        steady = timed[~timed["step"].isin(periodic.steps)]
    recorded = steady[steady["recorded"].to_numpy(dtype=bool)]
    unrecorded = steady[~steady["recorded"].to_numpy(dtype=bool)]
    # The first step after the window pays for stopping the profiler (its buffers are
    # released as the step runs): left out where others remain.
    if len(recorded) and len(unrecorded) > 2:
        unrecorded = unrecorded[unrecorded["step"] != recorded["step"].max() + 1]

    steps = window.steps
    if len(steps):
        took = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.float64)
        if periodic is not None and periodic.source == "recorded steps":
            keep = ~steps["step"].isin(periodic.steps).to_numpy()
            took = took[keep] if keep.any() else took
        recorded_step = float(took.mean())
    else:
        recorded_step = float(window.duration_ns)
    unrecorded_step = float(unrecorded["duration_ns"].mean()) if len(unrecorded) else None
    job = unrecorded if len(unrecorded) else recorded
    mean_step = float(job["duration_ns"].mean()) if len(job) else recorded_step
    beside = periodic.extra_ns / periodic.every if periodic is not None and periodic.every else 0.0
    return StepTimes(mean_step_ns=mean_step, recorded_step_ns=recorded_step, unrecorded_step_ns=unrecorded_step,
                     beside_ns=float(beside), timed=timed, recorded=recorded, unrecorded=unrecorded)


def timed_frame(session: Session) -> pd.DataFrame:
    """One row per complete step the collector's clock timed: step, recorded, duration_ns,
    ns per phase (Others the rest) and process_cpu_ns (the process's CPU time in the step,
    all threads; 0: not measured). Warm-up steps (those before the first recorded
    step) are left out: their time is start-up, not the job's pace."""
    rows = [t for t in session.meta.timed_steps if not t.partial]
    if not rows:
        return pd.DataFrame(columns=list(TIMED_COLUMNS))
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
    frame["process_cpu_ns"] = np.asarray([t.process_cpu_ns for t in kept], dtype=np.int64)
    return frame
