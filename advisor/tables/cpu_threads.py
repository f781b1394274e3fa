"""CPU Threads: what torch's operator threads cost where they outnumber the cores.

A script that sets ``torch.set_num_threads(16)`` on a machine that gives it 2 cores splits
every parallel operator into 16 parts that take turns on 2 cores; the operator ends when
its last part does, and a part waits for a core as long as the scheduler keeps the others
on it. The cost is mostly a wait per parallel call, not a share of its work: a short
operator can take ten times as long, a long matrix product a tenth longer.

The collector measured it on this machine after the run (advisor.collect.cores
``probe_threads``): an add and a matmul at a few sizes, each timed at the script's thread
count and at the cores' count. Each probe call gives a point (its time at the script's
threads, the time fewer threads save); each operator of the recorded steps that spends
most of its time in itself, not in the operators it calls (aten::addmm, not aten::linear
around it), saves the share the points around its own length say, read off the curve in
log time, never more than the probe's largest share. Operators shorter than half the
probe's quickest call at the script's threads did not go parallel (below torch's grain a
call runs on its own thread) and save nothing.

``thread_spans(facts)`` gives the rule cpu-threads-oversubscribed the operators' time by
the share of it fewer threads would keep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts, coded
from advisor.tables._registry import table

COLUMNS = ["calls_per_step", "ns_per_step", "kept_share", "saved_ns_per_step"]
SHARE_BANDS = 20
OWN_SHARE = 0.5  # an operator that spends at least this share of its time in itself, not in the ops it calls  # the operators' kept shares, rounded to this many bands for the replay


def probe_points(f: Facts) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """The thread probe as (threads, cores, time at threads, time saved at cores), its points
    sorted by time, seconds; None where the collector did not probe."""
    cpu = next((d for d in f.meta.devices if d.kind == "cpu"), None)
    probe = (cpu.properties if cpu is not None else {}).get("threads_probe")
    if not isinstance(probe, dict):
        return None
    threads, cores = probe.get("threads"), probe.get("cores")
    if not isinstance(threads, int) or not isinstance(cores, int) or threads <= cores:
        return None
    points = []
    for kind in ("add", "matmul"):
        for pair in (probe.get(kind) or {}).values():
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, (int, float)) and t > 0
                                                                            for t in pair):
                points.append((float(pair[0]), max(float(pair[0]) - float(pair[1]), 0.0)))
    if len(points) < 2:
        return None
    points.sort()
    return threads, cores, np.array([p[0] for p in points]), np.array([p[1] for p in points])


def kept_shares(durations_ns: np.ndarray, points: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The share of each operator's time fewer threads keep, from its time at the script's
    threads and the probe's points (see the module docstring)."""
    at, saved = points
    share = saved / at
    # Interpolated in log time over the probe's points (a share, so a long operator's
    # saving grows with it); a call shorter than half the quickest probe call stayed on its thread.
    seconds = np.maximum(durations_ns.astype(np.float64), 1.0) / 1e9
    read = np.interp(np.log(seconds), np.log(at), share)
    read = np.clip(read, 0.0, float(share.max()))
    read[seconds < at[0] / 2] = 0.0
    return 1.0 - read


@table(
    "cpu_threads",
    title="CPU Threads",
    description=(
        "Where torch's operator threads outnumbered the cores the job may use: each operator of the recorded "
        "steps that spends most of its time in itself, most time first, with the share of its time fewer threads (as many as the cores) would keep, read "
        "off a probe of parallel adds and matmuls timed at both counts on this machine after the run. Empty where "
        "the threads did not outnumber the cores, or nothing was probed (a trace from another profiler)."
    ),
    key="The operator's name",
    columns={
        "calls_per_step": "Calls per step.",
        "ns_per_step": "Their host time per step, as recorded, ns.",
        "kept_share": "The share of that time left with as many threads as cores (1: no saving, the call ran on one "
                      "thread).",
        "saved_ns_per_step": "ns_per_step * (1 - kept_share).",
    },
)
def cpu_threads_table(f: Facts) -> pd.DataFrame | None:
    leaves = _leaves(f)
    steps = len(f.steps) if f.has_steps else 0
    if leaves is None or not steps:
        return None
    names, took, kept, _starts, _ends = leaves
    codes, labels = coded(pd.Series(names))
    slots = len(labels) + 1
    codes = np.where(codes < 0, len(labels), codes)
    calls = np.bincount(codes, minlength=slots)
    ns = np.bincount(codes, weights=took, minlength=slots)
    saved = np.bincount(codes, weights=took * (1.0 - kept), minlength=slots)
    rows = {str(labels[i]): {"calls_per_step": calls[i] / steps, "ns_per_step": ns[i] / steps,
                             "kept_share": 1.0 - saved[i] / ns[i] if ns[i] else 1.0,
                             "saved_ns_per_step": saved[i] / steps}
            for i in range(len(labels)) if calls[i]}
    frame = pd.DataFrame.from_dict(rows, orient="index")[COLUMNS]
    return frame.sort_values(["saved_ns_per_step", "ns_per_step"], ascending=False).rename_axis("key")


def thread_spans(f: Facts) -> tuple[tuple[iv.Intervals, float], ...]:
    """The time of the operators fewer threads would speed up, and the share of it they
    would keep (their time-weighted mean), for a Fix's host_spans; empty where nothing was
    probed. One set of spans, one share: a replay takes the strongest of several spans over
    one stretch of host time, where their savings add up."""
    leaves = _leaves(f)
    if leaves is None:
        return ()
    _names, took, kept, starts, ends = leaves
    faster = kept < 1.0
    if not faster.any() or not took[faster].sum():
        return ()
    share = float((took[faster] * kept[faster]).sum() / took[faster].sum())
    return ((iv.union((starts[faster], ends[faster])), share),)


def _leaves(f: Facts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The main process's working operators in the window (names, host time, kept share,
    starts, ends), or None without a probe."""
    probe = probe_points(f)
    if probe is None or f.main_thread is None:
        return None

    def compute():
        ops = f.ops
        ids = ops["id"].to_numpy()
        pid = f.events["pid"].to_numpy()[ids]
        parents = ops["parent_op"].to_numpy()
        took_all = (ops["end_ns"] - ops["start_ns"]).to_numpy().astype(np.float64)
        # An operator's own time: its length less its direct children's.
        children = np.bincount(parents[parents >= 0], weights=took_all[parents >= 0], minlength=len(f.events))
        own = took_all - children[ids]
        working = (own >= OWN_SHARE * took_all) & (took_all > 0) & (pid == f.main_thread[0])
        mine = ops[working]
        starts, ends = mine["start_ns"].to_numpy().astype(np.int64), mine["end_ns"].to_numpy().astype(np.int64)
        took = (ends - starts).astype(np.float64)
        kept = kept_shares(took, (probe[2], probe[3]))
        return mine["name"].astype(str).to_numpy(), took, kept, starts, ends

    return f.memo("cpu_threads_leaves", compute)
