"""Fixes as changes to the step graph, replayed: what a fix saves is the replayed step's
reduction, never more than the time it changes.

Every replay, the baseline included, runs at the job's own pace (advisor.step.pace: the
profiler's cost taken off the host), and a fix's factors apply on top of it.

On a GPU run a fix that leaves the GPU's own work as it is can give back at most the GPU
idle time it reaches (``reachable_idle``: the idle partition's causes under the host
states and spans it shortens, the waits it drops, the queued work it frees); the replay's
step is the graph's, a little off the measured one, and that bound holds in the measured
frame whatever the replay says.

A rule describes its fix as a ``Fix``: which nodes of the graph (advisor.step.graph)
change and how, in the user's terms (a host state, the host's time inside some ranges, some
GPU events, the host's waits), plus what the graph cannot see (the rest of the host slowed
by worker processes sharing the CPU; a floor the step cannot go under, such as the time
the workers need to make a batch). ``what_if(model, fix)`` replays the graph with the fix
applied and returns the step before and after.

``combine(fixes)`` applies several fixes at once: where two change the same node the
stronger change holds, so time two findings share is saved once, and the combined estimate
is never more than the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from advisor.session import intervals as iv
from advisor.step.graph import HOST, HOST_STATES, StepGraph

__all__ = ["Fix", "WhatIf", "combine", "reachable_idle", "what_if"]

# The idle partition's cause (advisor.step.idle) of each host state of the graph.
_STATE_CAUSE = {"wait": "blocking sync", "loading": "data loading", "comm": "communication", "launch": "launch calls",
                "model": "host in model", "outside": "host outside model", "unrecorded": "unrecorded"}


@dataclass(frozen=True)
class Fix:
    """A fix, as a change to the step graph; every factor scales a duration (0 removes it)."""

    what: str = ""
    host_states: dict[str, float] = field(default_factory=dict)  # host state -> factor
    host_spans: tuple[tuple[iv.Intervals, float], ...] = ()  # the host's time in these spans -> factor
    gpu_rows: dict[int, float] = field(default_factory=dict)  # GPU event row id -> factor
    drop_waits: bool = False  # the host no longer waits on the device (every wait)
    wait_rows: frozenset[int] = frozenset()  # ... or these blocking calls only
    free_gpu: bool = False  # GPU work starts as soon as its launch and stream allow: no cross-stream
    # wait, no delay the profile does not explain
    rest_factor: float = 1.0  # the host's other work, slowed (>1) or sped up by the fix
    floor_ns: float = 0.0  # per step: the step cannot get shorter than this after the fix
    # Per step: time the job spends beside the graph's steady steps (the extra work of steps
    # that validate or checkpoint every N), and the share of it the fix leaves.
    beside_ns: float = 0.0
    beside_factor: float = 1.0
    # The graph as the job runs it, before the fix (steps run without the profiler, where
    # their pace differs from the recorded one); the fix's factors apply on top of it.
    base: Fix | None = None

    @property
    def empty(self) -> bool:
        return not (self.host_states or self.host_spans or self.gpu_rows or self.drop_waits or self.wait_rows
                    or self.floor_ns or self.free_gpu or self.beside_ns) and self.rest_factor == 1.0


@dataclass(frozen=True)
class WhatIf:
    """A fix replayed: per step, ns."""

    before_ns: float  # the step as the graph replays it unchanged
    after_ns: float  # the step with the fix applied
    changed_ns: float  # the time the fix takes off the nodes it changes (an upper bound of the saving)
    floor_bound: bool  # the step after sits on the fix's floor, not on the graph

    @property
    def saved_ns(self) -> float:
        return max(self.before_ns - self.after_ns, 0.0)


def combine(fixes: list[Fix]) -> Fix:
    """Every fix at once: on a node two fixes change, the stronger change holds; waits
    dropped by any are dropped; the rest of the host is slowed by the most any slows it
    and sped up by the most any speeds it up (workers that share the cores, and loading
    that gives the cores back, are different effects); the step's floor is the highest."""
    states: dict[str, float] = {}
    gpu: dict[int, float] = {}
    spans: list[tuple[iv.Intervals, float]] = []
    waits: set[int] = set()
    for fix in fixes:
        for name, factor in fix.host_states.items():
            states[name] = min(states.get(name, 1.0), factor)
        for row, factor in fix.gpu_rows.items():
            gpu[row] = min(gpu.get(row, 1.0), factor)
        spans.extend(fix.host_spans)
        waits |= set(fix.wait_rows)
    return Fix(what="every fix at once", host_states=states, host_spans=tuple(spans), gpu_rows=gpu,
               drop_waits=any(f.drop_waits for f in fixes), wait_rows=frozenset(waits),
               free_gpu=any(f.free_gpu for f in fixes),
               rest_factor=(max((f.rest_factor for f in fixes if f.rest_factor > 1.0), default=1.0)
                            * min((f.rest_factor for f in fixes if f.rest_factor < 1.0), default=1.0)),
               floor_ns=max((f.floor_ns for f in fixes), default=0.0),
               beside_ns=max((f.beside_ns for f in fixes), default=0.0),
               beside_factor=min((f.beside_factor for f in fixes if f.beside_ns), default=1.0),
               base=next((f.base for f in fixes if f.base is not None), None))


def scales(graph: StepGraph, fix: Fix) -> tuple[np.ndarray, np.ndarray]:
    """Each node's duration factor under ``fix``, and which waits hold."""
    n = len(graph)
    factor = np.ones(n, dtype=np.float64)
    host = graph.kind == HOST
    touched = np.zeros(n, dtype=bool)
    for name, value in fix.host_states.items():
        if name in HOST_STATES:
            mask = graph.host_nodes(name)
            factor[mask] = np.minimum(factor[mask], value)
            touched |= mask
    for spans, value in fix.host_spans:
        spans = iv.union(spans)
        if not len(spans):
            continue
        # A node partly inside the spans changes in proportion to the part inside: its time,
        # or where the run was busy, its time weighed as on a quiet machine.
        share = _share_inside(graph, spans, host)
        partial = 1.0 - (1.0 - value) * share
        factor = np.minimum(factor, partial)
        touched |= share > 0
    if fix.gpu_rows:
        rows = np.fromiter(fix.gpu_rows.keys(), dtype=np.int64, count=len(fix.gpu_rows))
        values = np.fromiter(fix.gpu_rows.values(), dtype=np.float64, count=len(fix.gpu_rows))
        nodes = graph.gpu_nodes_of(rows)
        found = nodes >= 0
        # np.minimum.at: a node named twice keeps the stronger change.
        np.minimum.at(factor, nodes[found], values[found])
    if fix.rest_factor != 1.0:
        rest = host & ~touched & ~graph.host_nodes("wait", "unrecorded")
        factor[rest] *= fix.rest_factor
    keep = np.ones(n, dtype=bool)
    if fix.drop_waits:
        keep[:] = False
    elif fix.wait_rows:
        keep = ~np.isin(graph.wait_rows, np.fromiter(fix.wait_rows, dtype=np.int64))
    return factor, keep


def what_if(graph: StepGraph, fix: Fix, *, base: Fix | None = None) -> WhatIf:
    """The step before and after ``fix`` (see the module docstring). ``base`` changes the
    graph before the fix too: the step as the job runs it where that differs from the
    recorded one (steps run without the profiler); the fix's factors then apply on top of
    the base's."""
    steps = max(graph.steps, 1)
    base = base if base is not None else fix.base
    # Every replay runs at the job's own pace: the profiler's cost off the host.
    pace = graph.pace
    if base is None or base.empty:
        before, base_factor, base_keep = graph.baseline, pace, np.ones(len(graph), dtype=bool)
    else:
        base_factor, base_keep = scales(graph, base)
        base_factor = base_factor * pace
        _, ends, _ = graph.replay(base_factor, keep_waits=base_keep)
        before = graph.step_time(ends)
    beside = fix.beside_ns * (1.0 - fix.beside_factor)
    if not len(graph):
        return WhatIf(before + fix.beside_ns, before + fix.beside_ns - beside, beside, False)
    factor, keep = scales(graph, fix)
    factor, keep = factor * base_factor, keep & base_keep
    _, ends, _ = graph.replay(factor, keep_waits=keep, free_gpu=fix.free_gpu)
    after = graph.step_time(ends)
    duration = graph.duration.astype(np.float64) * base_factor
    shortened = float(np.maximum(duration * (1.0 - factor / np.maximum(base_factor, 1e-12)), 0.0).sum())
    waited = graph.waited_ns(keep | ~base_keep) + (graph.held_ns() if fix.free_gpu else 0.0)
    changed = (shortened + waited) / steps
    changed = changed if math.isfinite(changed) else 0.0
    # A fix saves at most the time it takes off the nodes it changes, per step. The replay's
    # step is the pace from the first step's completion to the last's: where the steps
    # differ (a loader read in some steps only), that pace can move by more than the
    # per-step average of what changed, and the average is the bound. A slower rest of the
    # host or a floor only add to the step.
    after = max(after, before - changed)
    reach = reachable_idle(graph, fix)
    if reach is not None:
        after = max(after, before - reach)
    floor_bound = fix.floor_ns > after
    after = max(after, fix.floor_ns)
    # The time beside the steady steps is the job's too: before, and what the fix leaves of it.
    return WhatIf(before + fix.beside_ns, after + fix.beside_ns - beside, changed + beside, floor_bound)


def reachable_idle(graph: StepGraph, fix: Fix) -> float | None:
    """Per step, the GPU idle time ``fix`` can take away: the idle of the partition's causes
    under the host states it shortens and in the host spans it shortens and, where it frees
    the GPU, of work that waited queued; all of the idle time where it speeds the rest of the
    host up too or drops waits (what a wait held back is the whole step's to reach). None where no such bound holds: a CPU run (its
    partition is of the step, not of idle time), or a fix that changes the GPU's own work."""
    part = graph.partition
    if part is None or not part.on_gpu or fix.gpu_rows:
        return None
    # The host sped up anywhere, or its waits dropped: the time a wait held back can be any
    # of the step's idle time (the work the host would have launched meanwhile), not only
    # the idle booked under "blocking sync" while it waited.
    if fix.rest_factor < 1.0 or fix.drop_waits or fix.wait_rows:
        return part.idle_ns / max(part.steps, 1)
    causes = {_STATE_CAUSE[state] for state, factor in fix.host_states.items() if factor < 1.0}
    if fix.drop_waits or fix.wait_rows:
        causes.add("blocking sync")
    if fix.free_gpu:
        causes.add("work queued")
    reach = _union([part.causes[c] for c in causes if c in part.causes])
    spans = [spans for spans, factor in fix.host_spans if factor < 1.0]
    if spans:
        idle = _union(list(part.causes.values()))
        reach = _union([reach, iv.intersect(idle, _union(spans))])
    return reach.length / max(part.steps, 1)


def _share_inside(graph: StepGraph, spans: iv.Intervals, host: np.ndarray) -> np.ndarray:
    """Per node, the share of it inside ``spans`` (0 for GPU nodes)."""
    density = graph.density
    if density is None:
        inside = (iv.covered_before(spans, graph.end) - iv.covered_before(spans, graph.start)).astype(np.float64)
        whole = np.maximum(graph.end - graph.start, 1).astype(np.float64)
    else:
        inside = density.within(spans, graph.end) - density.within(spans, graph.start)
        whole = density.before(graph.end) - density.before(graph.start)
    ok = host & (graph.end > graph.start) & (whole > 0)
    return np.where(ok, np.clip(inside / np.where(ok, whole, 1.0), 0.0, 1.0), 0.0)


def _union(sets: list[iv.Intervals]) -> iv.Intervals:
    if not sets:
        return iv.EMPTY
    return iv.union((np.concatenate([s.starts for s in sets]), np.concatenate([s.ends for s in sets])))
