"""The dependency graph of the steady steps, and its replay.

A step's time is set by what waits on what. The graph holds, over the steady window:

- **host nodes**: the loop's process on the host as one timeline (the main thread, and
  the autograd thread while backward runs there), cut into segments where its state
  changes (the partition's causes: data loading, a blocking wait, a launch call, host work
  in or outside the model, nothing recorded) and at every launch and wait; each segment
  follows the one before it;
- **GPU nodes**: every kernel, copy and set the window's host launched (and work already
  queued when it began), each after its launch (plus the launch latency), after the
  node before it on its stream, and after the node on another stream it was seen to wait
  for (a node that starts later than its launch and stream allow, right as another
  stream's node ends, waited for that one);
- **waits**: a blocking call's last segment ends only once the GPU work it waits on has
  (a synchronize: all work launched before it; a copy or ``.item()``: its own copy).

``StepGraph.replay(change)`` runs the graph forward with some nodes' durations changed
(advisor.step.whatif) and returns the new window length: Daydream's what-if (USENIX ATC
2020). The unchanged graph replays the measured window; a node that started later than its
dependencies explain keeps that delay. The graph is a networkx DiGraph (``digraph``), and
``critical_path`` walks back from the last node along the dependency that set each start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, one_of
from advisor.session import intervals as iv
from advisor.step.facts import Facts
from advisor.step.idle import Partition, _host_recorded, launch_calls, model_ranges
from advisor.step.waits import blocking_calls

if TYPE_CHECKING:
    import networkx as nx

    from advisor.step.load import Density

__all__ = ["HOST_STATES", "LAUNCH_LATENCY_CAP_NS", "StepGraph"]

# The host's states, first that covers a moment wins (as the idle partition's causes).
HOST_STATES = ("wait", "loading", "comm", "launch", "model", "outside", "unrecorded")
# A kernel reaches the GPU at most this long after its launch returns when nothing holds
# it; a longer delay is a dependency (its stream, another stream, something unseen).
LAUNCH_LATENCY_CAP_NS = 20_000
# A node that starts within this long of another stream's node's end, later than its own
# stream and launch allow, waited for that node.
CROSS_STREAM_SLACK_NS = 10_000
# What ending a wait costs the host after the awaited work ends (wake-up), at least.
WAKE_NS = 1_000

HOST, GPU = 0, 1


class _Plan(NamedTuple):
    """What every replay reads and no replay changes (``StepGraph._plan``). The host nodes
    are one chain (nodes 0..n_host-1, each after the one before: ``build`` cuts the host's
    timeline into segments in time order), so between two waits the host's time is a
    running sum; the GPU nodes go one at a time in topological order, their dependencies
    as lists (list items are read several times faster than array items)."""

    n_host: int
    has_wait: np.ndarray  # per host node: it waits on GPU work
    awaits: dict[int, list[int]]  # the waiting host nodes' awaited GPU nodes
    host_position: np.ndarray  # each host node's place in ``order``
    gpu_order: list[int]  # the GPU nodes in ``order``
    gpu_index: np.ndarray  # the same, as an array
    gpu_position: np.ndarray  # their places in ``order``
    # Per GPU node, in that order: fixed start, launching host node, launch latency, node
    # before it on its stream, node on another stream it waited for, unexplained delay,
    # ready time where launched before the window (relative to the window's start).
    gpu: tuple[list[int], ...]


@dataclass
class StepGraph:
    """The graph as flat arrays (node i), plus its networkx form on demand."""

    lo: int  # the window's start: the replay's time zero
    hi: int
    steps: int
    kind: np.ndarray  # HOST or GPU
    start: np.ndarray  # measured start, ns
    end: np.ndarray  # measured end, ns
    state: np.ndarray  # host nodes: index into HOST_STATES; GPU nodes: -1
    row: np.ndarray  # the event row behind the node (GPU: its event; host: the launch or wait call), -1 if none
    stream: np.ndarray  # GPU nodes: (device, stream) key; host: -1
    host_prev: np.ndarray  # host nodes: the previous host node (-1: the first)
    launch_src: np.ndarray  # GPU nodes: the host node it waits on to be launched (-1: none)
    latency: np.ndarray  # GPU nodes: the launch latency to keep
    stream_prev: np.ndarray  # GPU nodes: the node before it on its stream (-1: none)
    cross_prev: np.ndarray  # GPU nodes: the node on another stream it waited for (-1: none)
    extra_delay: np.ndarray  # GPU nodes: the start delay no dependency explains
    fixed_start: np.ndarray  # GPU nodes never launched in the profile: start as measured (-1: free)
    ready_before: np.ndarray  # GPU nodes launched before the window: when they were ready (0: not so)
    awaits: list[np.ndarray] = field(default_factory=list)  # host nodes: GPU nodes a wait ends after
    base: np.ndarray = field(default_factory=lambda: np.zeros(0))  # host wait nodes: time after the awaited end
    wait_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # host wait nodes: the call
    node_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # each node's step (0-based)
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # a topological order
    partition: Partition | None = None  # the window's time by cause the graph was built on
    # Per node: the share of its recorded duration the job spends unprofiled (advisor.step.pace:
    # the profiler's cost taken off the host). 1 where nothing is known or nothing changes.
    pace_scale: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Where the run was busy, the host's time weighed as on a quiet machine (advisor.step.load):
    # what share of a node a span holds.
    density: Density | None = None

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def build(cls, f: Facts, part: Partition) -> StepGraph:
        lo, hi = f.window
        ev = f.events
        cuts, states, seg_rows = _host_segments(f, lo, hi)
        n_host = len(states)
        gpu = _gpu_nodes(f, lo, hi)
        n = n_host + len(gpu)
        kind = np.concatenate([np.full(n_host, HOST), np.full(len(gpu), GPU)]).astype(np.int8)
        start = np.concatenate([cuts[:-1], gpu["start_ns"].to_numpy()]).astype(np.int64)
        end = np.concatenate([cuts[1:], gpu["end_ns"].to_numpy()]).astype(np.int64)
        state = np.concatenate([states, np.full(len(gpu), -1)]).astype(np.int8)
        row = np.concatenate([seg_rows, gpu["id"].to_numpy()]).astype(np.int64)
        stream_key = np.concatenate([np.full(n_host, -1), gpu["device"].to_numpy() * 1_000_003
                                     + gpu["stream"].to_numpy()]).astype(np.int64)
        host_prev = np.full(n, -1, dtype=np.int64)
        host_prev[1:n_host] = np.arange(n_host - 1)

        # Launch: the host node holding the end of the launch call (for a blocking call,
        # one that runs its copy itself, the node before the call: the copy starts in it).
        launch_src = np.full(n, -1, dtype=np.int64)
        latency = np.zeros(n, dtype=np.int64)
        fixed_start = np.full(n, -1, dtype=np.int64)
        g_launch = gpu["launch"].to_numpy()
        known = g_launch >= 0
        call_start = np.where(known, ev["start_ns"].to_numpy()[np.maximum(g_launch, 0)], 0)
        call_end = np.where(known, ev["end_ns"].to_numpy()[np.maximum(g_launch, 0)], 0)
        # Work that started before its call returned ran under a call that blocks (a
        # synchronous or pageable copy): it was ready when the call began.
        by_blocking = known & (gpu["start_ns"].to_numpy() < call_end)
        at = np.where(by_blocking, call_start, call_end)
        inside = known & (at > lo) & (at <= hi)
        host_node = np.clip(np.searchsorted(cuts, at, side="left") - 1, 0, max(n_host - 1, 0))
        g_idx = np.arange(n_host, n)
        ok = inside & (host_node >= 0) & (n_host > 0)
        launch_src[g_idx[ok]] = host_node[ok]
        ready = np.where(by_blocking, call_start, call_end)
        latency[g_idx[known]] = np.clip(gpu["start_ns"].to_numpy()[known] - ready[known], 0, LAUNCH_LATENCY_CAP_NS)
        # Launched before the window: ready then, whatever the window's host does. Never
        # launched in the profile: it starts where it started.
        before = known & ~ok
        fixed_start[g_idx[before]] = -2
        ready_before = np.full(n, 0, dtype=np.int64)
        ready_before[g_idx[before]] = ready[before] + latency[g_idx[before]]
        fixed_start[g_idx[~known]] = gpu["start_ns"].to_numpy()[~known]

        # Streams, and what a node waited for on another stream.
        stream_prev = np.full(n, -1, dtype=np.int64)
        cross_prev = np.full(n, -1, dtype=np.int64)
        extra = np.zeros(n, dtype=np.int64)
        g_start, g_end = start[n_host:], end[n_host:]
        order = np.lexsort((g_start, stream_key[n_host:]))
        same = stream_key[n_host:][order][1:] == stream_key[n_host:][order][:-1]
        stream_prev[n_host + order[1:][same]] = n_host + order[:-1][same]
        ready_at = np.where(known, ready + latency[n_host:], np.iinfo(np.int64).min)
        prev_end = np.where(stream_prev[n_host:] >= 0, end[np.maximum(stream_prev[n_host:], 0)], np.iinfo(np.int64).min)
        explained = np.maximum(ready_at, prev_end)
        late = (fixed_start[n_host:] < 0) & (g_start - explained > CROSS_STREAM_SLACK_NS // 2)
        fixed_start[g_idx[before]] = -1
        by_end = np.argsort(g_end, kind="stable")
        ends_sorted = g_end[by_end]
        for i in np.flatnonzero(late):
            # The latest-ending node on another stream that ended at most the slack before.
            j = np.searchsorted(ends_sorted, g_start[i], side="right") - 1
            while j >= 0 and ends_sorted[j] >= g_start[i] - CROSS_STREAM_SLACK_NS:
                other = by_end[j]
                if stream_key[n_host + other] != stream_key[n_host + i]:
                    cross_prev[n_host + i] = n_host + other
                    break
                j -= 1
        explained = np.maximum(explained, np.where(cross_prev[n_host:] >= 0, end[np.maximum(cross_prev[n_host:], 0)],
                                                   np.iinfo(np.int64).min))
        free = fixed_start[n_host:] < 0
        extra[n_host:][free] = np.maximum(g_start[free] - explained[free], 0)

        # Waits: the last segment of each blocking call ends after the GPU work it waits on.
        awaits: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
        base = np.zeros(n, dtype=np.int64)
        wait_rows = np.full(n, -1, dtype=np.int64)
        calls = blocking_calls(f)
        if len(calls) and n_host and len(gpu):
            launches = _Launches(ev, g_launch[known].astype(np.int64), g_idx[known].astype(np.int64))
            # When each node was launched: work whose launch the profile lacks was launched
            # before it began.
            launched_at = np.where(known, call_end, np.iinfo(np.int64).min)
            launched_before = np.sort(launched_at)
            by_launch = np.argsort(launched_at, kind="stable")
            for c_row, c_start, c_end in zip(calls["row"].to_numpy(), calls["start_ns"].to_numpy(),
                                             calls["end_ns"].to_numpy()):
                if c_end <= lo or c_end > hi:
                    continue
                last = int(np.searchsorted(cuts, c_end, side="left")) - 1
                if last < 0 or last >= n_host:
                    continue
                # What it waited for ended before it returned.
                mine = _launched_within(launches, c_row)
                mine = mine[end[mine] <= c_end + WAKE_NS] if len(mine) else mine
                if not len(mine):
                    # A synchronize: the work launched before it, the latest-ending of it
                    # that ended before the call returned.
                    k = int(np.searchsorted(launched_before, c_start, side="right"))
                    before = n_host + by_launch[:k]
                    before = before[end[before] <= c_end + WAKE_NS]
                    if not len(before):
                        continue
                    mine = before[[int(np.argmax(end[before]))]]
                awaited_end = int(end[mine].max())
                awaits[last] = np.union1d(awaits[last], mine)
                wait_rows[last] = c_row
                base[last] = max(int(end[last]) - max(int(start[last]), awaited_end), 0)
        node_step = _node_steps(f, kind, start, launch_src, row)
        graph = cls(lo=lo, hi=hi, steps=max(part.steps, 1), kind=kind, start=start, end=end, state=state, row=row,
                    stream=stream_key, host_prev=host_prev, launch_src=launch_src, latency=latency,
                    stream_prev=stream_prev, cross_prev=cross_prev, extra_delay=extra, fixed_start=fixed_start,
                    ready_before=ready_before, awaits=awaits, base=base, wait_rows=wait_rows, node_step=node_step,
                    partition=part)
        graph.order = graph._topological()
        return graph

    def _topological(self) -> np.ndarray:
        """Nodes by measured end (host before GPU on ties): every dependency ends no later
        than what depends on it, so this order runs each node after its dependencies.
        Dependencies that point forward in it (clock skew between host and device) are
        dropped."""
        order = np.lexsort((self.kind, self.start, self.end))
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        for deps in (self.launch_src, self.stream_prev, self.cross_prev):
            bad = (deps >= 0) & (position[np.maximum(deps, 0)] > position)
            deps[bad] = -1
        for i, waited in enumerate(self.awaits):
            if len(waited):
                self.awaits[i] = waited[position[waited] < position[i]]
        return order

    # -- replay --------------------------------------------------------------------------------

    @cached_property
    def _plan(self) -> _Plan:
        n = len(self)
        position = np.empty(n, dtype=np.int64)
        position[self.order] = np.arange(n)
        on_host = self.kind == HOST
        n_host = int(on_host.sum())
        if not (on_host[:n_host].all() and np.array_equal(self.host_prev[:n_host], np.arange(n_host) - 1)
                and (np.diff(position[:n_host]) > 0).all()):
            raise RuntimeError("the step graph's host nodes are not one chain in time order")
        # Few nodes wait: look only at those with a wait's call (a wait the topological
        # order emptied has no call left to wait on).
        waiting = [int(i) for i in np.flatnonzero(self.wait_rows >= 0) if len(self.awaits[i])]
        has_wait = np.zeros(n_host, dtype=bool)
        has_wait[waiting] = True
        gpu = self.order[~on_host[self.order]]
        # Times relative to the window's start: as floats, nanoseconds since 1970 keep only
        # 256 ns of resolution.
        lo = self.lo
        fixed = np.where(self.fixed_start >= 0, self.fixed_start - lo, -1)
        ready = np.where(self.ready_before != 0, self.ready_before - lo, 0)
        return _Plan(n_host=n_host, has_wait=has_wait, awaits={i: self.awaits[i].tolist() for i in waiting},
                     host_position=position[:n_host], gpu_order=gpu.tolist(), gpu_index=gpu,
                     gpu_position=position[gpu],
                     gpu=tuple(a[gpu].tolist() for a in (fixed, self.launch_src, self.latency, self.stream_prev,
                                                          self.cross_prev, self.extra_delay, ready)))

    def replay(self, host_scale: np.ndarray | None = None, gpu_scale: np.ndarray | None = None,
               keep_waits: np.ndarray | None = None, free_gpu: bool = False,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start and end of every node with durations scaled (``host_scale``,
        ``gpu_scale``: one factor per node, 1 keeps it) and the waits of the host nodes
        where ``keep_waits`` is False dropped; with ``free_gpu``, GPU work waits on no other
        stream and keeps no delay the profile does not explain; and each node's binding
        dependency."""
        n = len(self)
        plan = self._plan
        scale = np.ones(n) if host_scale is None else np.asarray(host_scale, dtype=np.float64)
        if gpu_scale is not None:
            scale = scale * np.asarray(gpu_scale, dtype=np.float64)
        # Between two waits that hold, each host node starts where the one before it
        # ended: their ends are a running sum (np.cumsum adds in order, as one node at a
        # time would: the same floats). The GPU nodes and the waits go one at a time.
        n_host = plan.n_host
        dur_all = self.duration * scale
        base_all = self.base * scale
        base = base_all.tolist()
        has_wait = plan.has_wait
        held = has_wait if keep_waits is None else has_wait & np.asarray(keep_waits[:n_host], dtype=bool)
        # A host node's own time: a wait (held or dropped) costs its base, any other node its duration.
        cost = np.where(has_wait, base_all[:n_host], dur_all[:n_host])
        # The GPU nodes' dependencies, in their order (``_Plan.gpu``): one pass of zip reads them.
        gpu_order, awaits = plan.gpu_order, plan.awaits
        fixed, launch_src, latency, stream_prev, cross_prev, extra, ready = plan.gpu
        if free_gpu:
            cross_prev, extra = [-1] * len(gpu_order), [0] * len(gpu_order)
        gpu_dur = dur_all[plan.gpu_index].tolist()
        s = [0.0] * n
        e = [0.0] * n
        why = list(range(-1, n_host - 1)) + [-1] * (n - n_host)
        waits = np.flatnonzero(held)
        # The GPU nodes to run before each wait: those before it in the order.
        gpu_until = np.searchsorted(plan.gpu_position, plan.host_position[waits]).tolist() + [len(gpu_order)]
        end = 0.0  # the host's end so far
        h = g = 0
        for w, g_end in zip([*waits.tolist(), n_host], gpu_until):
            if w > h:
                run = np.cumsum(np.concatenate(([end], cost[h:w])))
                s[h:w] = run[:-1].tolist()
                e[h:w] = run[1:].tolist()
                end = e[w - 1]
            for i, at, src, lag, dep, other, more, early, d in zip(
                    gpu_order[g:g_end], fixed[g:g_end], launch_src[g:g_end], latency[g:g_end],
                    stream_prev[g:g_end], cross_prev[g:g_end], extra[g:g_end], ready[g:g_end], gpu_dur[g:g_end]):
                if at >= 0:
                    t, b = float(at), -1
                elif src >= 0:
                    t, b = e[src] + lag, src
                else:
                    t, b = float(early), -1
                if dep >= 0 and e[dep] > t:
                    t, b = e[dep], dep
                if other >= 0 and e[other] > t:
                    t, b = e[other], other
                t += more
                s[i], e[i], why[i] = t, t + d, b
            g = g_end
            if w < n_host:
                t = end
                s[w] = t
                a = awaits[w]
                ends = [e[j] for j in a]
                last = max(ends)
                if last > t:
                    why[w] = a[ends.index(last)]
                    t = last
                e[w] = end = t + base[w]
                h = w + 1
        lo = self.lo
        return np.asarray(s) + lo, np.asarray(e) + lo, np.asarray(why)

    def span(self, ends: np.ndarray) -> float:
        """The window's length in a replay: to the end of its last node."""
        return float(ends.max() - self.lo) if len(ends) else float(self.hi - self.lo)

    def step_time(self, ends: np.ndarray) -> float:
        """A step's time in a replay, ns: with several steps, the pace at which they complete
        (a step completes when its host work and the GPU work it launched have ended, and
        the steps before it have completed), from the first step's completion to the
        last's; so the first step's start and the last one's GPU tail count once, not in
        every step. Never faster than the host's own pace, since the host issues every
        step: work of the first step held far past the others' (queued behind work the
        trace does not hold) completes them all at once, and the time between their
        completions says nothing of the step (taken out of their order, it was negative).
        With one step, the window to its last node."""
        if not len(ends):
            return float(self.hi - self.lo)
        if self.steps < 2 or not len(self.node_step):
            return self.span(ends) / max(self.steps, 1)
        done = np.full(self.steps, -np.inf)
        np.maximum.at(done, self.node_step, ends)
        host = np.full(self.steps, -np.inf)
        on_host = self.kind == HOST
        np.maximum.at(host, self.node_step[on_host], ends[on_host])
        # Steps with no node of the graph (another process's steps in a merged trace)
        # complete nowhere: the pace is that of the steps that do.
        some = np.isfinite(done)
        done, host = np.maximum.accumulate(done[some]), host[some]
        if len(done) < 2:
            return self.span(ends) / max(self.steps, 1)
        host = np.maximum.accumulate(host[np.isfinite(host)])
        host_pace = float(host[-1] - host[0]) if len(host) >= 2 else 0.0
        return max(float(done[-1] - done[0]), host_pace) / (len(done) - 1)

    @property
    def pace(self) -> np.ndarray:
        """Each node's factor to the job's own pace (all ones where none was set)."""
        return self.pace_scale if len(self.pace_scale) == len(self) else np.ones(len(self))

    @property
    def paced_duration(self) -> np.ndarray:
        """Each node's duration at the job's own pace, ns."""
        return self.duration * self.pace

    @cached_property
    def baseline(self) -> float:
        """The unchanged graph's replayed step at the job's own pace, ns: the profiler's cost
        off the host (advisor.step.pace); the measured step where none is known."""
        _, ends, _ = self.replay(self.pace)
        return self.step_time(ends)

    @cached_property
    def recorded_baseline(self) -> float:
        """The unchanged graph replayed as recorded, ns: the measured step up to dropped
        dependencies, the profiler's cost included."""
        _, ends, _ = self.replay()
        return self.step_time(ends)

    def held_ns(self) -> float:
        """The time GPU work was held past its launch and its stream by other streams and by
        what the profile does not explain, as measured, summed: the most freeing the GPU's
        work can take off the window."""
        gpu = np.flatnonzero((self.kind == GPU) & (self.fixed_start < 0))
        if not len(gpu):
            return 0.0
        src = self.launch_src[gpu]
        ready = np.where(src >= 0, self.end[np.maximum(src, 0)] + self.latency[gpu],
                         np.where(self.ready_before[gpu] != 0, self.ready_before[gpu], self.lo))
        prev = self.stream_prev[gpu]
        prev_end = np.where(prev >= 0, self.end[np.maximum(prev, 0)], np.iinfo(np.int64).min)
        return float(np.maximum(self.start[gpu] - np.maximum(ready, prev_end), 0).sum())

    def waited_ns(self, keep: np.ndarray) -> float:
        """The time the host spent waiting in the waits ``keep`` drops, as measured."""
        n_host = self._plan.n_host
        dropped = np.zeros(len(self), dtype=bool)
        dropped[:n_host] = self._plan.has_wait & ~np.asarray(keep[:n_host], dtype=bool)
        return float(np.maximum(self.duration[dropped] - self.base[dropped], 0).sum())

    # -- reading it ----------------------------------------------------------------------------

    @cached_property
    def _gpu_by_row(self) -> tuple[np.ndarray, np.ndarray]:
        """The GPU nodes' event rows, sorted, and the node of each."""
        gpu = np.flatnonzero(self.kind != HOST)
        order = np.argsort(self.row[gpu], kind="stable")
        return self.row[gpu][order], gpu[order]

    def gpu_nodes_of(self, rows: np.ndarray) -> np.ndarray:
        """The GPU node of each event row id in ``rows`` (-1 where no GPU node holds it)."""
        sorted_rows, nodes = self._gpu_by_row
        if not len(nodes):
            return np.full(len(rows), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(sorted_rows, rows), len(nodes) - 1)
        return np.where(sorted_rows[at] == rows, nodes[at], -1)

    def host_nodes(self, *states: str) -> np.ndarray:
        """Mask of the host nodes in the given states."""
        codes = [HOST_STATES.index(s) for s in states]
        return (self.kind == HOST) & np.isin(self.state, codes)

    def critical_path(self) -> np.ndarray:
        """The nodes on the replayed window's critical path at the job's pace, last first:
        from the node that ends last, back along the dependency that set each one's start."""
        _, ends, why = self.replay(self.pace)
        if not len(ends):
            return np.zeros(0, dtype=np.int64)
        path = []
        i = int(np.argmax(ends))
        seen = set()
        while i >= 0 and i not in seen:
            seen.add(i)
            path.append(i)
            i = int(why[i])
        return np.asarray(path, dtype=np.int64)

    def ready_at(self) -> np.ndarray:
        """When each GPU node could have started as far as its launch goes, ns (host nodes
        and work never launched in the profile: their measured start)."""
        src = self.launch_src
        return np.where(src >= 0, self.end[np.maximum(src, 0)] + self.latency,
                        np.where(self.ready_before != 0, self.ready_before, self.start))

    def held_by(self, spans: iv.Intervals, names: np.ndarray) -> pd.DataFrame:
        """What the work queued through each idle span of ``spans`` waited for (``names``:
        the event names by row id). The queued work is the GPU node launched before the span
        that starts first after it; it waited for the node on another stream it followed
        (and that one, where it was queued too, for what it followed), or, where nothing in
        the profile explains its delay, for work the profile does not hold. One row per kind
        of wait: ``waits_on`` (another stream, unseen), ``node`` (the node waited for, -1 if
        unseen), ``name``, ``stream``, ``launched_late`` (that node was launched by the host
        only after the span began), ``ns`` (the idle time it held)."""
        columns = ["waits_on", "node", "name", "stream", "launched_late", "ns"]
        gpu = np.flatnonzero(self.kind == GPU)
        if not len(spans) or not len(gpu):
            return pd.DataFrame(columns=columns)
        ready = self.ready_at()
        rows = []
        for lo, hi in zip(spans.starts, spans.ends):
            # Queued through the span: ready by its start (a launch's latency aside) and
            # started after it.
            queued = gpu[(ready[gpu] <= lo + LAUNCH_LATENCY_CAP_NS) & (self.start[gpu] >= hi)]
            if not len(queued):
                continue
            node = int(queued[np.argmin(self.start[queued])])
            other, depth = int(self.cross_prev[node]), 0
            # Follow the chain while what it waited for was queued itself.
            while other >= 0 and depth < 8 and ready[other] <= lo + LAUNCH_LATENCY_CAP_NS and self.cross_prev[other] >= 0:
                other, depth = int(self.cross_prev[other]), depth + 1
            if other >= 0:
                row = int(self.row[other])
                rows.append(("another stream", other, str(names[row]) if row >= 0 else "", int(self.stream[other]),
                             bool(ready[other] > lo), int(hi - lo)))
            else:
                rows.append(("unseen", -1, "", int(self.stream[node]), False, int(hi - lo)))
        frame = pd.DataFrame(rows, columns=columns)
        return frame.groupby(["waits_on", "name", "stream"], as_index=False, sort=False).agg(
            node=("node", "first"), launched_late=("launched_late", "max"), ns=("ns", "sum")).sort_values(
            "ns", ascending=False, kind="stable")

    @cached_property
    def digraph(self) -> nx.DiGraph:
        """The graph in networkx form: nodes with kind, state, row and duration; edges
        host -> host (order), host -> GPU (launch), GPU -> GPU (stream, cross-stream),
        GPU -> host (wait), each with its ``dependency``."""
        import networkx as nx  # for this export only: every command would wait for its import

        g = nx.DiGraph()
        for i in range(len(self)):
            g.add_node(i, kind="host" if self.kind[i] == HOST else "gpu",
                       state=HOST_STATES[self.state[i]] if self.state[i] >= 0 else "", row=int(self.row[i]),
                       duration=int(self.end[i] - self.start[i]))
        for deps, label in ((self.host_prev, "order"), (self.launch_src, "launch"), (self.stream_prev, "stream"),
                            (self.cross_prev, "cross-stream")):
            for i in np.flatnonzero(deps >= 0):
                g.add_edge(int(deps[i]), int(i), dependency=label)
        for i, waited in enumerate(self.awaits):
            for j in waited:
                g.add_edge(int(j), i, dependency="wait")
        return g


def _node_steps(f: Facts, kind: np.ndarray, start: np.ndarray, launch_src: np.ndarray,
                row: np.ndarray) -> np.ndarray:
    """Each node's step, as a position among the window's steps: a host node's is the step
    its start falls in (between steps, the one before); a GPU node's that of the host node
    that launched it, else the step its start falls in. Where a node's event was given a
    step of the window (steps on the device's clock keep their host calls, run ahead, as
    their own: advisor.step.iterations), that step."""
    steps = f.steps
    if not len(steps):
        return np.zeros(len(kind), dtype=np.int64)
    starts = steps["start_ns"].to_numpy()
    position = np.clip(np.searchsorted(starts, start, side="right") - 1, 0, len(starts) - 1).astype(np.int64)
    launched = (kind == GPU) & (launch_src >= 0)
    position[launched] = position[launch_src[launched]]
    numbers = steps["step"].to_numpy()
    order = np.argsort(numbers, kind="stable")
    known = row >= 0
    given = np.full(len(kind), -1, dtype=np.int64)
    given[known] = f.events["step"].to_numpy()[row[known]]
    at = np.searchsorted(numbers[order], given)
    mine = known & (given >= 0) & (at < len(numbers)) & (numbers[order][np.minimum(at, len(numbers) - 1)] == given)
    position[mine] = order[at[mine]]
    # A host call of no step that began before the window (the host ran ahead and waits
    # for the queued work at the end): the last step's, whose work it waits for.
    began = np.where(known, f.events["start_ns"].to_numpy()[np.maximum(row, 0)], np.iinfo(np.int64).max)
    ahead = (kind == HOST) & known & (given < 0) & (began < starts[0])
    position[ahead] = len(starts) - 1
    return position


class _Launches:
    """The GPU nodes by the event row of the call that launched them, and those calls by
    start time: for ``_launched_within``, asked once per blocking call."""

    def __init__(self, ev: pd.DataFrame, calls: np.ndarray, nodes: np.ndarray):
        self.start, self.end, self.pid = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy(), ev["pid"].to_numpy()
        by_start = np.argsort(self.start[calls], kind="stable")
        self.calls, self.nodes = calls[by_start], nodes[by_start]
        self.call_start = self.start[self.calls]
        by_call = np.argsort(calls, kind="stable")
        self.sorted_calls, self.nodes_by_call = calls[by_call], nodes[by_call]


def _launched_within(launches: _Launches, call_row: int) -> np.ndarray:
    """The GPU nodes a blocking call (or the op that holds it) launched itself: its copy."""
    lo, hi = np.searchsorted(launches.sorted_calls, [call_row, call_row + 1])
    if hi > lo:
        return launches.nodes_by_call[lo:hi]
    # An operator (.item(), .cpu()): the copies launched by calls inside it.
    start, end = int(launches.start[call_row]), int(launches.end[call_row])
    first = np.searchsorted(launches.call_start, start, side="left")
    last = np.searchsorted(launches.call_start, end, side="right")
    calls = launches.calls[first:last]
    inside = (launches.end[calls] <= end) & (launches.pid[calls] == launches.pid[call_row])
    return launches.nodes[first:last][inside]


def _gpu_nodes(f: Facts, lo: int, hi: int) -> pd.DataFrame:
    """GPU work of the window: launched by a call inside it, or running in it."""
    ev = f.events
    gpu = one_of(ev["kind"], GPU_KINDS)
    launch = ev["launch"].to_numpy()
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    launched_in = (launch >= 0) & (end[np.maximum(launch, 0)] > lo) & (start[np.maximum(launch, 0)] < hi)
    running_in = (end > lo) & (start < hi)
    rows = np.flatnonzero(gpu & (launched_in | running_in))
    # The columns first: taking every row of every column (names, categoricals) costs more.
    return ev[["id", "start_ns", "end_ns", "device", "stream", "launch"]].iloc[rows]


def _host_segments(f: Facts, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The host timeline of the window cut into segments: the cut points, each segment's
    state (index into HOST_STATES) and the launch or wait call it ends (-1 if none)."""
    if hi <= lo:
        return np.array([lo], dtype=np.int64), np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64)
    ev = f.events
    whole = iv.Intervals(np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64))
    calls = blocking_calls(f)
    phases = f.phases
    launches = launch_calls(f)
    l_start, l_end = ev["start_ns"].to_numpy()[launches], ev["end_ns"].to_numpy()[launches]
    recorded = _host_recorded(f)
    model = model_ranges(f)
    sets = {
        "wait": iv.as_intervals(calls),
        "loading": iv.as_intervals(phases[phases["phase_name"].to_numpy() == "Dataloader"]),
        "comm": iv.as_intervals(f.comm_host),
        "launch": iv.as_intervals(l_start, l_end),
        "model": model,
        "outside": recorded,
    }
    remaining = whole
    owned: list[iv.Intervals] = []
    for name in HOST_STATES[:-1]:
        spans = iv.intersect(remaining, iv.union(sets[name]))
        owned.append(spans)
        remaining = iv.subtract(remaining, spans)
    owned.append(remaining)
    points = [np.array([lo, hi], dtype=np.int64)]
    points += [np.concatenate([s.starts, s.ends]) for s in owned]
    points += [l_start, l_end, calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()]
    cuts = iv.distinct(np.clip(np.concatenate(points).astype(np.int64), lo, hi))
    # A blocking call is one node from where its own copy becomes ready (the start of the
    # launch call inside it) to its end: the wait. Cuts strictly inside it go.
    waiting = iv.union((calls["start_ns"].to_numpy() + 1, calls["end_ns"].to_numpy()))
    if len(waiting):
        inside = iv.covers(waiting, cuts) & ~np.isin(cuts, l_start)
        cuts = cuts[~inside]
    mids = (cuts[:-1] + cuts[1:]) // 2
    state = np.full(len(mids), len(HOST_STATES) - 1, dtype=np.int8)
    for code, spans in enumerate(owned):
        hit = iv.covers(spans, mids) if len(spans) else np.zeros(len(mids), dtype=bool)
        state[hit & (state == len(HOST_STATES) - 1)] = code
    rows = np.full(len(mids), -1, dtype=np.int64)
    ends_at = pd.Series(np.asarray(launches), index=l_end)
    ends_at = ends_at[~ends_at.index.duplicated()]
    hit = np.isin(cuts[1:], l_end)
    rows[hit] = ends_at.reindex(cuts[1:][hit]).to_numpy()
    return cuts, state, rows
