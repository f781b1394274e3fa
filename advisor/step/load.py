"""The step's mix as on a quiet machine, for a run recorded while other processes held the cores.

A busy machine does not slow every part of a step alike. Plain Python (a loader's items,
autograd's bookkeeping, a loop over samples) runs on one thread, and the collector measures
how long that thread waited for a core: the part it ran is the work (``1 - waited`` of its
time). An operator torch splits across its threads waits, at the end of each parallel
region, for its slowest thread to get a core: a round of the scheduler whatever the
operator's size, so on a loaded two-core machine a 0.5 ms matrix multiply took 20 to 40 ms
and the operators' share of the recorded step swelled many times over the Python's. A fix
of the Python work then looked small though it saves as much of a quiet step as ever.

So where the run was busy and the collector timed the job's operators again at one thread
(advisor.collect.retime), each host node of a CPU run's step graph is weighed as the work
it holds: the re-timed operator calls it covers (their one-thread time divided by the
square root of the threads they ran on, where long enough to split: between the one-thread
time and a perfect split, a factor of at most that root off either way), and the rest of
its time as Python at the share it ran. The nodes are then scaled together so that the
step keeps the job's own length at this run's load (the steps timed without the profiler,
advisor.step.timing; else the graph's at the job's own pace, advisor.step.pace): a saving
is a share of the step as a quiet machine would divide it, its milliseconds this run's.

A GPU run keeps the recorded mix: its device work is not slowed by the host's load, and
what the host's load changes there is another question. So does a rank of a distributed
job: its wait on the other ranks is no work, and a straggler's extra work is what the
ranks' comparison reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.session.busy import busy_share

__all__ = ["PARALLEL_NS", "STACK_CAPTURE_FRAMES", "Density", "QuietMix", "capture_frames", "forward_autograd_ns",
           "own_frames", "quiet_mix", "weighed_per_step"]

# An operator call shorter than this at one thread is taken to run on one thread in the job
# too: torch splits only work larger than its grain, and a short region gains nothing.
PARALLEL_NS = 100_000
MIN_BASE = 0.02
# Frames of the stack autograd's anomaly detection stores for each node it creates (torch
# formats it with the standard library's traceback module, which reads source lines
# through linecache): a sampled stack inside them is the capture's, not the job's.
STACK_CAPTURE_FRAMES = ("/traceback.py(", "/linecache.py(")
_KEYS = ("name", "input_dims", "input_types", "concrete_inputs")


@dataclass(frozen=True)
class Density:
    """The host's time weighed as the work it holds on a quiet machine: inside each counted
    re-timed call (``starts``/``ends``, sorted and disjoint) its quiet time spread evenly
    over its recorded span (``rates``, per ns), elsewhere ``base`` (the share of its time a
    single thread ran). A fix that removes some spans of a node removes their weighed share
    of it (advisor.step.whatif), not their share of the recorded time."""

    starts: np.ndarray
    ends: np.ndarray
    rates: np.ndarray
    base: float

    def before(self, at: np.ndarray) -> np.ndarray:
        """The weighed time up to each of ``at`` (from time 0)."""
        at = np.asarray(at, dtype=np.int64)
        return self.base * at.astype(np.float64) + _integral(self.starts, self.ends, self.rates - self.base, at)

    def within(self, spans: iv.Intervals, at: np.ndarray) -> np.ndarray:
        """The weighed time inside ``spans`` (normalised: sorted, disjoint) up to each of
        ``at``: each span's weighed time, from ``before``, summed up to the span ``at`` is in."""
        at = np.asarray(at, dtype=np.int64)
        if not len(spans):
            return np.zeros(len(at))
        starts, ends = spans.starts.astype(np.int64), spans.ends.astype(np.int64)
        full = np.concatenate([[0.0], np.cumsum(self.before(ends) - self.before(starts))])
        i = np.searchsorted(starts, at, side="right") - 1
        j = np.maximum(i, 0)
        part = self.before(np.minimum(ends[j], at)) - self.before(starts[j])
        return np.where(i >= 0, full[j] + part, 0.0)


@dataclass(frozen=True)
class QuietMix:
    """Per graph node, the factor that weighs it as on a quiet machine (1 for GPU nodes),
    the weighing itself, and what was used."""

    scale: np.ndarray
    density: Density
    waited: float  # the share of its run the main thread waited for a core
    retimed_share: float  # of the main thread's operator time in the window, the share re-timed
    kinds: int  # kinds of operator call re-timed
    # Per step, what recording autograd's graph costs the re-timed calls of the Forward
    # phase (each timed with and without it: a node per call, and where anomaly detection
    # is on, the Python stack it stores), ns; None where no such call was re-timed.
    forward_autograd_ns: float | None = None
    # The Python frames above the job's own operator calls in its Forward phase (from the
    # stack samples; advisor's launcher left out), which the autograd time is taken at.
    job_frames: float | None = None

    @property
    def says(self) -> str:
        return (f"the machine was busy (the main thread waited for a core {self.waited:.0%} of its run), which slows "
                f"torch's multi-threaded operators far more than plain Python: the step's parts are weighed as on a "
                f"quiet machine, its Python time by the share that ran and {self.retimed_share:.0%} of its operator "
                f"time by {self.kinds} kinds of operator call timed again at one thread after the run")


def quiet_mix(model: Any, graph: Any, pace: np.ndarray) -> QuietMix | None:
    """The quiet machine's weights for ``graph``'s nodes on top of ``pace`` (the job's own
    pace per node), or None where the run was not busy, is a GPU run, or has no re-timed
    operators."""
    meta = model.session.meta
    waited = busy_share(meta.trace_metadata)
    facts = meta.trace_metadata.get("advisor") if isinstance(meta.trace_metadata, dict) else None
    retimed = facts.get("retimed_ops") if isinstance(facts, dict) else None
    part = graph.partition
    if (waited is None or not isinstance(retimed, dict) or not isinstance(retimed.get("ops"), list)
            or not retimed["ops"] or part is None or part.on_gpu
            or meta.collector.gpu_measured or not len(graph) or graph.host_nodes("comm").any()):
        # A rank's wait on the others is no work the load swelled: a job keeps its recorded mix.
        return None
    ops = _window_ops(model)
    if not len(ops):
        return None
    frames = _job_frames(model)
    quiet_ns, counted, autograd_ns = _quiet_calls(ops, retimed, frames)
    if not counted.any():
        return None
    host = graph.kind == 0
    start, end = graph.start[host].astype(np.int64), graph.end[host].astype(np.int64)
    # A thread that waited all of a run still ran some of it: the floor keeps Python weighing.
    density = _density(ops, quiet_ns, counted, max(1.0 - float(waited), MIN_BASE))
    duration = (end - start).astype(np.float64)
    weighed = np.maximum(density.before(end) - density.before(start), 0.0)
    # The step keeps the job's own length at this run's load: the steps timed without the
    # profiler where some ran (under load the recorded ones differ from them by more than
    # recording costs), else the graph's at the job's pace.
    target = float((duration * pace[host]).sum())
    mean = _number(getattr(model.times, "mean_step_ns", None))
    if mean is not None and graph.steps:
        target = mean * graph.steps
    if weighed.sum() <= 0 or target <= 0:
        return None
    scale = np.ones(len(graph))
    factor = np.where(duration > 0, weighed * (target / weighed.sum()) / np.maximum(duration, 1.0), pace[host])
    scale[host] = factor
    spans = iv.union((ops["start_ns"].to_numpy()[ops["top"].to_numpy()], ops["end_ns"].to_numpy()[ops["top"].to_numpy()]))
    counted_spans = iv.union((ops["start_ns"].to_numpy()[counted], ops["end_ns"].to_numpy()[counted]))
    share = iv.intersect(counted_spans, spans).length / spans.length if spans.length else 0.0
    forward = counted & ops["graded"].to_numpy() & np.isfinite(autograd_ns)
    per_step = float(autograd_ns[forward].sum()) / graph.steps if forward.any() and graph.steps else None
    return QuietMix(scale, density, float(waited), min(share, 1.0), len(retimed["ops"]), per_step, frames)


def weighed_per_step(model: Any, spans: iv.Intervals | None = None) -> float | None:
    """Per step, the host's time in the window inside ``spans`` (all of it where None),
    weighed as on a quiet machine, ns; None where the model does not weigh its run (the run
    was quiet, or nothing was re-timed). A rule that sizes a fix from a part's time divides
    it by this, not by the part's time as the load stretched it."""
    mix = getattr(getattr(model, "pace", None), "mix", None)
    if mix is None or not model.steps:
        return None
    lo, hi = int(model.window.start_ns), int(model.window.end_ns)
    window = iv.Intervals(np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64))
    inside = iv.intersect(iv.union(spans), window) if spans is not None else window
    edges = np.array([lo, hi], dtype=np.int64)
    weighed = mix.density.within(inside, edges)
    return float(weighed[1] - weighed[0]) / model.steps


def _density(ops: pd.DataFrame, quiet_ns: np.ndarray, counted: np.ndarray, base: float) -> Density:
    """The weighing: each counted call's quiet time over its span; the rest of the
    operators' time (calls not re-timed, and the time of calls around counted ones outside
    them) at the rate the counted calls had as a whole, or ``base`` where that is higher (a
    call not re-timed may have been a parallel one, whose time the load swelled many times
    over); the time outside every operator, Python, at ``base``."""
    # A call of no length weighs nothing, and would sit inside the rest's pieces.
    counted = counted & (ops["end_ns"].to_numpy() > ops["start_ns"].to_numpy())
    c_start, c_end = ops["start_ns"].to_numpy()[counted], ops["end_ns"].to_numpy()[counted]
    order = np.argsort(c_start, kind="stable")
    c_start, c_end, quiet = c_start[order], c_end[order], quiet_ns[counted][order]
    wall = np.maximum(c_end - c_start, 1).astype(np.float64)
    rate = min(float(quiet.sum() / wall.sum()), base) if wall.sum() > 0 else base
    top = ops["top"].to_numpy()
    rest = iv.subtract(iv.union((ops["start_ns"].to_numpy()[top], ops["end_ns"].to_numpy()[top])),
                       iv.union((c_start, c_end)))
    starts = np.concatenate([c_start, rest.starts]).astype(np.int64)
    ends = np.concatenate([c_end, rest.ends]).astype(np.int64)
    rates = np.concatenate([quiet / wall, np.full(len(rest), rate)])
    order = np.argsort(starts, kind="stable")
    starts, ends, rates = starts[order], ends[order], rates[order]
    # Disjoint, as the integrals need: a call whose link to the call around it was lost
    # ends where the next begins.
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    return Density(starts, ends, rates, base)


def _window_ops(model: Any) -> pd.DataFrame:
    """The main thread's operator calls in the window, with ``top`` (no operator around it)."""
    f = model.facts
    thread = f.main_thread
    ev = f.events
    if thread is None:
        return ev.iloc[0:0]
    lo, hi = model.window.start_ns, model.window.end_ns
    mine = ((ev["kind"].to_numpy() == "op") & (ev["pid"].to_numpy() == thread[0]) & (ev["tid"].to_numpy() == thread[1])
            & (ev["end_ns"].to_numpy() > lo) & (ev["start_ns"].to_numpy() < hi))
    columns = ["id", "parent_op", "start_ns", "end_ns", "phase", *(k for k in (*_KEYS, "sequence") if k in ev.columns)]
    ops = ev.loc[mine, columns].copy()
    for key in (*_KEYS, "phase"):
        ops[key] = ops[key].astype(str) if key in ops else ""
    # A call made with autograd on: the Forward phase's, with a sequence number where the
    # trace records them (a forward under no_grad records none).
    sequence = ops["sequence"].to_numpy() if "sequence" in ops else np.full(len(ops), -1)
    ops["graded"] = (ops["phase"].to_numpy() == "Forward") & ((sequence >= 0) | ~(sequence >= 0).any())
    ops["top"] = ~ops["parent_op"].isin(ops["id"]).to_numpy()
    return ops


def _quiet_calls(ops: pd.DataFrame, retimed: dict[str, Any],
                 job_frames: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call, its quiet time (NaN where not re-timed), whether it counts (re-timed, and
    no call around it was), and what autograd added to it (NaN where not timed without;
    with the parameters' gradient accumulators the calls make), taken at ``job_frames``
    where the calls were timed at two depths of the stack."""
    table = pd.DataFrame([{**{k: str(o.get(k, "")) for k in _KEYS}, "one_thread_ns": float(o["one_thread_ns"]),
                           "no_grad_ns": _number(o.get("no_grad_ns")) or np.nan,
                           "deeper_ns": _number(o.get("deeper_ns")) or np.nan}
                          for o in retimed["ops"] if isinstance(o, dict) and _number(o.get("one_thread_ns"))])
    if not len(table):
        nothing = np.full(len(ops), np.nan)
        return nothing, np.zeros(len(ops), dtype=bool), nothing
    table = table.drop_duplicates(list(_KEYS))
    joined = ops[list(_KEYS)].merge(table, on=list(_KEYS), how="left")
    one = joined["one_thread_ns"].to_numpy(dtype=np.float64)
    autograd = np.maximum(one - joined["no_grad_ns"].to_numpy(dtype=np.float64), 0.0)
    at_job = _at_frames(autograd, one, joined["deeper_ns"].to_numpy(dtype=np.float64), retimed, job_frames)
    autograd = np.where(np.isfinite(autograd), at_job, autograd)
    threads = max(_number(retimed.get("threads")) or 1.0, 1.0)
    cores = _number(retimed.get("cores")) or threads
    split = math.sqrt(max(min(threads, cores), 1.0))
    # Autograd's recording is one thread's work, and only the graded calls': the operator's
    # own may be split.
    work = np.where(np.isfinite(autograd), np.minimum(joined["no_grad_ns"].to_numpy(dtype=np.float64), one), one)
    autograd = np.where(ops["graded"].to_numpy(), autograd, np.nan)
    quiet = np.where(work >= PARALLEL_NS, work / split, work) + np.nan_to_num(autograd)
    hit = np.isfinite(quiet)
    # A call inside a counted call is in its time already.
    position = pd.Index(ops["id"].to_numpy())
    parent = position.get_indexer(ops["parent_op"].to_numpy())
    above = np.zeros(len(ops), dtype=bool)
    for _ in range(32):
        has = parent >= 0
        nxt = np.zeros(len(ops), dtype=bool)
        nxt[has] = hit[parent[has]] | above[parent[has]]
        if (nxt == above).all():
            break
        above = nxt
    counted = hit & ~above
    # The parameters' gradient accumulators, made afresh each step (one AccumulateGrad that
    # backward runs for each), which the re-timed calls' inputs did not make: spread over
    # the counted calls made with autograd, by their autograd time.
    acc = retimed.get("accumulator") if isinstance(retimed.get("accumulator"), dict) else {}
    each = _number(acc.get("ns"))
    graded = counted & ops["graded"].to_numpy() & np.isfinite(autograd)
    made = int(np.count_nonzero(ops["name"].to_numpy() == "torch::autograd::AccumulateGrad"))
    if each is not None and made and graded.any():
        each = float(_at_frames(each, each, _number(acc.get("deeper_ns")) or each, retimed, job_frames))
        weights = autograd[graded] if autograd[graded].sum() > 0 else np.ones(int(graded.sum()))
        added = made * each * weights / weights.sum()
        quiet, autograd = quiet.copy(), autograd.copy()
        quiet[graded] += added
        autograd[graded] += added
    return quiet, counted, autograd


def _at_frames(value: Any, here: Any, deeper: Any, retimed: dict[str, Any], frames: float | None) -> Any:
    """``value`` (ns, timed at the re-timing's stack) taken at ``frames`` frames of stack:
    what each frame adds to a node (anomaly detection stores the stack) is the difference
    between the same call timed ``here`` and ``deeper`` (deeper_frames further down); the
    job's stacks are not the re-timing's. ``value`` as it is where ``frames`` is None."""
    timed_at, deeper_frames = _number(retimed.get("stack_frames")), _number(retimed.get("deeper_frames"))
    if not (frames and timed_at and deeper_frames):
        return value
    per_frame = np.nan_to_num(np.maximum(np.asarray(deeper, dtype=np.float64) - here, 0.0) / deeper_frames)
    return np.maximum(value + per_frame * (frames - timed_at), 0.0)


def forward_autograd_ns(model: Any) -> float | None:
    """Per step, what recording autograd's graph costs the Forward phase's re-timed calls
    (advisor.collect.retime: each timed with and without it; with anomaly detection on,
    mostly the stack each node stores), taken at the depth of the job's own stacks (from
    its stack samples), ns. None where no such call was re-timed. A quiet run reads it as
    it is; a busy one through its QuietMix."""
    meta = model.session.meta
    facts = meta.trace_metadata.get("advisor") if isinstance(meta.trace_metadata, dict) else None
    retimed = facts.get("retimed_ops") if isinstance(facts, dict) else None
    if not isinstance(retimed, dict) or not isinstance(retimed.get("ops"), list) or not model.steps:
        return None
    ops = _window_ops(model)
    if not len(ops):
        return None
    _, counted, autograd = _quiet_calls(ops, retimed, _job_frames(model))
    forward = counted & ops["graded"].to_numpy() & np.isfinite(autograd)
    return float(autograd[forward].sum()) / model.steps if forward.any() else None


def capture_frames(model: Any) -> tuple[float, float] | None:
    """The median count of Python frames above the job's calls in its Forward phase, from
    the main thread's stack samples there: the job's own (to the script's <module> frame),
    and all of them (the launcher's too, which a stack capture under advisor also formats).
    None where no sample was taken."""
    stacks = _forward_stacks(model)
    if not stacks:
        return None
    return float(np.median([own_frames(s) for s in stacks])), float(np.median([_all_frames(s) for s in stacks]))


def _job_frames(model: Any) -> float | None:
    """The median count of Python frames above the job's own operator calls in its Forward
    phase (capture_frames)."""
    frames = capture_frames(model)
    return frames[0] if frames else None


def _forward_stacks(model: Any) -> list[str]:
    """The main thread's stack samples in the window's Forward phase (at most 2000)."""
    f = model.facts
    ev = f.events
    if f.main_thread is None or "call_stack" not in ev:
        return []
    lo, hi = model.window.start_ns, model.window.end_ns
    mine = ((ev["kind"].to_numpy() == "stack") & (ev["pid"].to_numpy() == f.main_thread[0])
            & (ev["start_ns"].to_numpy() >= lo) & (ev["start_ns"].to_numpy() < hi)
            & (ev["phase"].astype(str).to_numpy() == "Forward"))
    return [str(stack) for stack in ev["call_stack"].to_numpy()[mine][:2000] if stack]


def _all_frames(stack: str) -> float:
    """Of a sampled stack, the frames from the first one outside a stack capture to its end."""
    frames = stack.split(";")
    first = next((i for i, frame in enumerate(frames) if not any(c in frame for c in STACK_CAPTURE_FRAMES)), 0)
    return float(max(len(frames) - first, 1))


def own_frames(stack: str) -> float:
    """Of a sampled stack (innermost first, ';'-separated), the frames from the first one
    outside a stack capture to the script's <module> frame: those the job alone holds (the
    frames of whatever ran the script, advisor's launcher, lie beyond it)."""
    frames = stack.split(";")
    module = next((i for i, frame in enumerate(frames) if frame.endswith(": <module>")), len(frames) - 1)
    first = next((i for i, frame in enumerate(frames) if not any(c in frame for c in STACK_CAPTURE_FRAMES)), 0)
    return float(max(module - first + 1, 1))


def _integral(starts: np.ndarray, ends: np.ndarray, rate: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each time in ``at``, the integral up to it of the sum of ``rate`` over the spans
    (``starts``/``ends`` sorted and disjoint) that cover each moment."""
    if not len(starts):
        return np.zeros(len(at))
    full = np.concatenate([[0.0], np.cumsum(rate * (ends - starts))])
    i = np.searchsorted(starts, at, side="right")  # spans begun by then
    before = full[np.maximum(i - 1, 0)]
    last = np.maximum(i - 1, 0)
    part = np.clip(at - starts[last], 0, ends[last] - starts[last]) * rate[last]
    return np.where(i > 0, before + part, 0.0)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None
