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

A step the process stalled in is set apart from the job's steps too (``stalled``): one over
``STALL_TIMES`` the median step, where at most one in twenty, and three in all, are
(``isolated_stalls``). One read of a data loader stopped for 190 ms among steps of 6 to
9 ms (a full collection of Python's garbage collector took 140-260 ms in that process under
advisor); in the mean of 71 steps it added 2.6 ms to each, and to what a fix of the loader
promised. Such pauses come once, where they come at all, and are not the loop's pace; slow
steps that recur more often than that are the loop's own and stay.

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

__all__ = ["STALL_TIMES", "StepTimes", "isolated_stalls", "step_times", "timed_frame"]

# A time over STALL_TIMES the median, where at most STALL_SHARE of the times are (one at
# least) and no more than STALL_MAX, is a stall; fewer than STALL_MIN times cannot tell one
# from the loop's own spread. A pause comes once or twice in a run: slow steps that come
# dozens of times (a per-sample loop's 5 ms steps among 0.4 ms ones, 80 in 2000) are the
# loop's own, however far over the median.
STALL_TIMES = 10.0
STALL_SHARE = 0.05
STALL_MAX = 3
STALL_MIN = 10

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
    # The job's steps set apart as stalls (isolated_stalls), in the timed frame's columns.
    stalled: pd.DataFrame

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
    # Stalls are set apart from the steps the job's pace is the mean of (module docstring).
    job = unrecorded if len(unrecorded) else recorded
    stalled = job.iloc[isolated_stalls(job["duration_ns"].to_numpy(dtype=np.float64))]
    if len(stalled):
        apart = ~job["step"].isin(stalled["step"]).to_numpy()
        if len(unrecorded):
            unrecorded = unrecorded[apart]
        else:
            recorded = recorded[apart]

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
                     beside_ns=float(beside), timed=timed, recorded=recorded, unrecorded=unrecorded,
                     stalled=stalled)


def isolated_stalls(times: np.ndarray) -> np.ndarray:
    """Positions in ``times`` (durations, one per step or read) of the stalls among them:
    those over STALL_TIMES the median, where they are few (at most STALL_SHARE of the
    times, one at least, and STALL_MAX) among STALL_MIN or more; none otherwise."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) < STALL_MIN or not np.isfinite(times).all():
        return np.zeros(0, dtype=np.int64)
    over = np.flatnonzero(times > STALL_TIMES * max(float(np.median(times)), 1.0))
    few = len(over) <= min(max(1, int(STALL_SHARE * len(times))), STALL_MAX)
    return over if few else np.zeros(0, dtype=np.int64)


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
