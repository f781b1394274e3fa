"""The job's own pace: what the profiler cost each host node of the step graph, taken off.

A profiled step is slower on the host than the same step unprofiled: the recorder's work
around every op (advisor's op recorder, torch.profiler's RecordFunction callbacks), its
ranges, its buffers. A diagnosis that replays the host as recorded diagnoses the profiler
(a "slow host" that is the recorder's own cost; a fix sized against a host that will not be
there once the profiler is gone). So every replay of the step graph runs at the job's own
pace: the collector's cost is a host state of its own, and it is removed.

Where the cost comes from, best first:

- **timed steps**: the collector times every step, recorded or not (advisor.step.timing).
  Per phase (Dataloader, Forward, Backward, Optimization, Others), the recorded steps'
  mean less the unrecorded steps' is what recording added to that phase a step; it is
  taken off that phase's host nodes in proportion to their time (a recorder's cost sits
  around its ops as much as in them: the time between two recorded ops is its too). Waits
  on the device are not scaled: they end when the device's work does, in the replay as in
  the run.
- **a calibrated per-op cost**: the CUPTI collector measures in every run what recording
  adds to one op (``CollectorInfo.cost.per_op_ns``); each host node loses that much per op
  it records. Used where no step ran unrecorded.
- **nothing**: a trace another profiler wrote says neither; the host is replayed as
  recorded, and ``Pace.says`` states what the host figures include.

``Pace.scale`` is one factor per graph node (1 for GPU nodes and waits); the graph's
baseline and every what-if replay apply it (advisor.step.graph, advisor.step.whatif).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from advisor.session import intervals as iv
from advisor.step.facts import MODEL_PHASES
from advisor.step.load import Density, QuietMix, quiet_mix

if TYPE_CHECKING:
    from advisor.step.graph import StepGraph

__all__ = ["MAX_REMOVED_SHARE", "Pace", "job_pace"]


class StepModel(Protocol):
    """What the pace reads of the step model (advisor.step.model.StepModel, which makes the
    pace of its graph: named here by what it offers, so neither module imports the other's)."""

    session: Any
    facts: Any
    window: Any
    times: Any

# A host node keeps at least this share of its recorded time: the job's own work is in it.
MAX_REMOVED_SHARE = 0.95
# A phase whose recorded and unrecorded means differ by less than this share of the phase
# is taken as unchanged: the steps' own spread, not the profiler.
NOISE_SHARE = 0.02


@dataclass(frozen=True)
class Pace:
    """The profiler's cost taken off the host nodes of a step graph."""

    scale: np.ndarray  # per node: the share of its recorded duration the job spends (1: all)
    removed_ns: float  # per step: the host time taken off
    source: str  # "timed steps", "calibrated per-op cost", "quiet mix", or "" (the host as recorded)
    says: str  # one line: what the host figures are
    # Where the run was busy, the host's time weighed as the work it holds on a quiet
    # machine (advisor.step.load): a fix's spans take their weighed share of a node.
    mix: QuietMix | None = None

    @property
    def density(self) -> Density | None:
        return self.mix.density if self.mix is not None else None

    @property
    def changes(self) -> bool:
        return bool(len(self.scale)) and bool((self.scale < 1.0).any())


def job_pace(model: StepModel, graph: StepGraph) -> Pace:
    """The pace of ``model``'s job for ``graph`` (see the module docstring), weighed as on a
    quiet machine where the run was recorded on a busy one (advisor.step.load)."""
    pace = _profiler_off(model, graph)
    mix = quiet_mix(model, graph, pace.scale)
    if mix is None:
        return pace
    return Pace(mix.scale, pace.removed_ns, "quiet mix", f"{mix.says}; {pace.says}", mix)


def _profiler_off(model: StepModel, graph: StepGraph) -> Pace:
    """The profiler's cost taken off the host nodes (see the module docstring)."""
    n = len(graph)
    none = Pace(np.ones(n), 0.0, "", _as_recorded(model))
    if not n or not graph.steps:
        return none
    host = graph.kind == 0
    eligible = host & ~graph.host_nodes("wait")
    ops = _ops_in(model, graph)
    times = model.times
    if len(times.unrecorded) and len(times.recorded):
        removed = _from_timed_steps(model, graph, eligible)
        source = "timed steps"
        if removed is None:
            return Pace(np.ones(n), 0.0, source, "the recorded steps ran at the job's own pace: the host is "
                                                 "replayed as recorded")
    else:
        per_op = _calibrated_per_op(model)
        if per_op is None:
            return none
        removed = np.where(eligible, ops * per_op, 0.0)
        source = "calibrated per-op cost"
    duration = graph.duration.astype(np.float64)
    removed = np.minimum(removed, duration * MAX_REMOVED_SHARE)
    scale = np.where(duration > 0, 1.0 - removed / np.maximum(duration, 1.0), 1.0)
    per_step = float(removed.sum()) / max(graph.steps, 1)
    says = (f"the host is replayed at the job's own pace: {per_step / 1e6:.3g} ms a step of recording's cost taken "
            f"off ({'the recorded steps against those run without the profiler, phase by phase' if source == 'timed steps' else 'the collector measured what recording adds to an op'})")
    return Pace(scale, per_step, source, says)


def _as_recorded(model: StepModel) -> str:
    meta = model.session.meta
    if meta.source_format == "script":
        return ("no step ran without the profiler and no per-op cost was measured: the host figures include what "
                "recording cost")
    return ("the host figures are as the trace recorded them, its profiler's own cost included (with record_shapes "
            "or with_stack a recorded op costs the host several times an unrecorded one)")


def _ops_in(model: StepModel, graph: StepGraph) -> np.ndarray:
    """How many recorded ops start inside each host node of the loop's process."""
    f = model.facts
    ops = f.ops
    starts = ops["start_ns"].to_numpy()
    if f.main_thread is not None and len(ops):
        pid = f.main_thread[0]
        starts = starts[f.events["pid"].to_numpy()[ops["id"].to_numpy()] == pid]
    starts = np.sort(starts)
    host = graph.kind == 0
    counts = np.zeros(len(graph), dtype=np.float64)
    if not len(starts):
        return counts
    counts[host] = (np.searchsorted(starts, graph.end[host], side="left")
                    - np.searchsorted(starts, graph.start[host], side="left"))
    return counts


def _phase_of_nodes(model: StepModel, graph: StepGraph) -> np.ndarray:
    """Each node's phase (an index into MODEL_PHASES, or len(MODEL_PHASES) for Others), by
    the phase range its middle falls in."""
    f = model.facts
    middle = (graph.start + graph.end) // 2
    out = np.full(len(graph), len(MODEL_PHASES), dtype=np.int64)
    for code, phase in enumerate(MODEL_PHASES):
        spans = f.phase_intervals(phase)
        if len(spans):
            out[iv.covers(spans, middle)] = code
    return out


def _from_timed_steps(model: StepModel, graph: StepGraph, eligible: np.ndarray) -> np.ndarray | None:
    """Per node, the host time recording added, from the timed steps phase by phase; None
    where no phase was slower recorded."""
    times = model.times
    recorded, unrecorded = times.recorded, times.unrecorded
    # The recorded steps the graph holds: a start-up step set apart from the window is not.
    steady = recorded[recorded["step"].isin(model.window.steps["step"].to_numpy())] if len(model.window.steps) else recorded
    recorded = steady if len(steady) else recorded
    phase_of = _phase_of_nodes(model, graph)
    duration = graph.duration.astype(np.float64)
    removed = np.zeros(len(graph), dtype=np.float64)
    any_phase = False
    for code, phase in enumerate((*MODEL_PHASES, "Others")):
        if phase not in recorded.columns:
            continue
        slower = float(recorded[phase].mean()) - float(unrecorded[phase].mean())
        if slower <= NOISE_SHARE * max(float(recorded[phase].mean()), 1.0):
            continue
        mine = eligible & (phase_of == code)
        if not mine.any():
            continue
        total = slower * graph.steps
        weight = duration[mine]
        if weight.sum() <= 0:
            continue
        removed[mine] = total * weight / weight.sum()
        any_phase = True
    return removed if any_phase else None


def _calibrated_per_op(model: StepModel) -> float | None:
    cost = model.session.meta.collector.cost
    if cost is None or cost.per_op_ns is None or cost.per_op_ns <= 0:
        return None
    # Below the burst's own noise, no cost is told from nothing.
    if cost.spread_ns_per_op is not None and cost.per_op_ns <= cost.spread_ns_per_op:
        return None
    return float(cost.per_op_ns)
