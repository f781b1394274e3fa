"""The step model: what a step is and where its time goes, built once from a Session.

``build_step_model(session)`` chooses the steady window (advisor.step.window), makes the
steady Session the later stages judge (advisor.step.steady), and offers, worked out on
first use:

    times       how long a step takes: the mean step, the one place it is worked out
                (advisor.step.timing; ``mean_step_ns``, ``recorded_step_ns``,
                ``unrecorded_step_ns``)
    partition   the window's time by cause, each idle nanosecond once (advisor.step.idle)
    graph       the dependency graph of the steady steps and its replay (advisor.step.graph),
                its host at the job's own pace (``pace``: the profiler's cost taken off,
                advisor.step.pace)

Tables read the model through its ``facts``; rules read it through their context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from advisor.session import Session, one_of
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step.facts import Facts
from advisor.step.idle import Partition, partition
from advisor.step.pace import Pace, job_pace
from advisor.step.steady import steady_session
from advisor.step.timing import StepTimes, step_times
from advisor.step.window import SteadyWindow, find_window

if TYPE_CHECKING:
    from advisor.step.graph import StepGraph

__all__ = ["StepModel", "build_step_model"]


@dataclass
class StepModel:
    """One profile's steady window, its steady Session and what is worked out from them."""

    source: Session  # the session as collected or read
    window: SteadyWindow
    session: Session  # the steady session: the one tables, rules and reports judge
    facts: Facts = field(init=False)

    def __post_init__(self) -> None:
        self.facts = Facts(self.session)
        self.facts.model = self

    @property
    def steady(self) -> bool:
        return self.window.steady

    @property
    def steps(self) -> int:
        """The steady steps in the window (0 where there are none)."""
        return len(self.window.steps)

    @cached_property
    def partition(self) -> Partition:
        return partition(self.facts, self.window)

    @cached_property
    def _paced_graph(self) -> tuple[StepGraph, Pace]:
        # The graph and its pace are made together: the pace is measured on the graph's
        # nodes, and the graph replays at that pace, so neither is ever seen without the other.
        from advisor.step.graph import StepGraph

        graph = StepGraph.build(self.facts, self.partition)
        pace = job_pace(self, graph)
        graph.pace_scale = pace.scale
        graph.density = pace.density
        return graph, pace

    @property
    def graph(self) -> StepGraph:
        """The step graph, its host at the job's own pace (``pace``)."""
        return self._paced_graph[0]

    @property
    def pace(self) -> Pace:
        """What the profiler cost the host, per node of ``graph`` (advisor.step.pace)."""
        return self._paced_graph[1]

    @cached_property
    def times(self) -> StepTimes:
        """How long a step takes: the one derivation of the mean step (advisor.step.timing)."""
        return step_times(self.session, self.window)

    @property
    def mean_step_ns(self) -> float:
        """The job's step, ns: the steps run without the profiler where some were, else the
        recorded ones (advisor.step.timing). Savings are shares of it."""
        return self.times.mean_step_ns

    @property
    def recorded_step_ns(self) -> float:
        """The steady steps the profile holds, as it timed them, ns (the window where it has
        none): the step the window's own per-step figures are of (advisor.step.timing)."""
        return self.times.recorded_step_ns

    @property
    def unrecorded_step_ns(self) -> float | None:
        """The steps run after the window without the profiler, ns: the job's own pace; None
        where none ran (advisor.step.timing)."""
        return self.times.unrecorded_step_ns

    # -- what the rules ask of the profile, in the window -------------------------------------------

    def waits(self) -> pd.DataFrame:
        """The host's waits on the device (advisor.step.waits): row, name, reason, start_ns,
        end_ns, source."""
        from advisor.step.waits import blocking_calls

        return blocking_calls(self.facts)

    def host_ranges(self, pattern: str | re.Pattern) -> iv.Intervals:
        """When the loop's process was in a host range or operator whose name matches
        ``pattern`` (a regular expression), in the window."""
        f = self.facts
        ev = f.events
        names = name_matches(ev["name"], re.compile(pattern) if isinstance(pattern, str) else pattern)
        mask = names & one_of(ev["kind"], ("op", "annotation", "python", "phase"))
        if f.main_thread is not None:
            mask &= ev["pid"].to_numpy() == f.main_thread[0]
        return f.union_in_window((ev["start_ns"].to_numpy()[mask], ev["end_ns"].to_numpy()[mask]))

    def gpu_under_ops(self, name: str, input_dims: str | None = None) -> np.ndarray:
        """Row ids of the GPU work launched inside the operators named ``name`` (with these
        recorded input shapes, where given), at any depth below them."""
        from advisor.step.facts import ancestors

        f = self.facts
        ev = f.events
        target = (ev["kind"] == "op").to_numpy() & (ev["name"] == name).to_numpy()
        if input_dims is not None:
            target &= (ev["input_dims"] == input_dims).to_numpy()
        gpu = f.gpu
        launch = gpu["launch"].to_numpy()
        known = launch >= 0
        if not target.any() or not known.any():
            return np.zeros(0, dtype=np.int64)
        start = ev["parent_op"].to_numpy()[launch[known]]
        hit = np.zeros(int(known.sum()), dtype=bool)
        for where, row in ancestors(f.parents, start):
            hit[where[target[row]]] = True
        return gpu["id"].to_numpy()[known][hit]

    def gpu_named(self, pattern: str | re.Pattern) -> np.ndarray:
        """Row ids of the window's GPU work whose name matches ``pattern``."""
        gpu = self.facts.gpu
        mask = name_matches(gpu["name"], re.compile(pattern) if isinstance(pattern, str) else pattern)
        return gpu["id"].to_numpy()[mask]

    def gpu_launched_in(self, spans: iv.Intervals) -> np.ndarray:
        """Row ids of the GPU work launched by calls that began inside ``spans``."""
        f = self.facts
        gpu = f.gpu
        launch = gpu["launch"].to_numpy()
        known = launch >= 0
        if not known.any() or not len(spans):
            return np.zeros(0, dtype=np.int64)
        call_start = f.events["start_ns"].to_numpy()[launch[known]]
        inside = iv.covers(iv.union(spans), call_start)
        return gpu["id"].to_numpy()[known][inside]


def build_step_model(session: Session) -> StepModel:
    """The step model of ``session`` as read or collected. The stages of a diagnosis pass
    the model they built to the next (advisor.diagnosis); a steady session asked of again
    (``model.session``, in a notebook or a test) is taken as it is, its window the steady
    one, through the model it keeps: choosing a window again in a session whose start-up is
    already set apart would judge other steps."""
    made_by = getattr(session, "step_model", None)
    if made_by is not None:
        return made_by
    window = find_window(session)
    model = StepModel(session, window, steady_session(session, window))
    model.session.step_model = model
    return model
