"""The steady window: which steps a diagnosis judges, where they came from, and what is
set apart from them.

A profile often holds more than the loop the user wants judged: the CUDA context being
made and kernel modules loaded, torch.compile compiling, a serving engine capturing its
graphs, GPU work still running from before the trace began, a first step that pays for all
of that, a validation pass every N steps. Judged as part of the steady state, each of these
reads as a problem (launch overhead, a starved GPU, step-to-step variation). So the window
is chosen first, and everything set apart is named:

- **Steps**: the trace's ProfilerStep ranges (or the steps advisor's hooks marked), else
  iterations found from what repeats on the thread that runs the loop (advisor.step.
  iterations: a DataLoader's reads, optimizer steps, the model's calls, a repeated user
  range, graph replays, per-iteration syncs, the same calls or kernels recurring); else no
  steps, and the window is the stretch of the profile where the work runs.
- **Set apart**: start-up (context creation, module loading, a first launch that loads
  kernels lazily), compilation (Dynamo, Inductor, Triton), graph capture, GPU work in flight
  from before the trace began, a start-up step (far slower than the steady ones, or holding
  start-up work), and steps that run extra work periodically.
- **Steady**: whether any steady work is left. A trace that is all warm-up or capture is
  not steady: the rules say so instead of judging it.

``find_window`` is a pure function of an attributed Session's events and metadata.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, Session, calls, one_of, text
from advisor.session import intervals as iv
from advisor.session.attribute import main_thread, name_matches
from advisor.session.meta import FORWARD_NO_GRAD
from advisor.step.iterations import Level, find_iterations, loop_level, outermost, regularity
from advisor.units import format_ns

__all__ = [
    "IN_FLIGHT_MIN_NS",
    "IN_FLIGHT_SHARE",
    "Periodic",
    "SetApart",
    "SteadyWindow",
    "find_window",
    "periodic_steps",
]

# A first step this many times the median of the others (with at least MIN_STEPS steps)
# is start-up, whatever it holds; one holding start-up work is from STARTUP_SLOWER.
STARTUP_FACTOR = 3.0
STARTUP_SLOWER = 1.5
MIN_STEPS = 3
# A context call this long is start-up; so is a launch this long (a launch costs
# microseconds; one that loads its kernel's module lazily, milliseconds to seconds).
LONG_START_CALL_NS = 1_000_000
LONG_LAUNCH_NS = 5_000_000
# GPU work that starts this long after its launch returned, with nothing else on the GPU
# before it, was queued behind work the trace does not hold.
IN_FLIGHT_MIN_NS = 1_000_000
# ... and, without steps, waits at least this share of the work after it.
IN_FLIGHT_SHARE = 0.5
# Where no steps are found: the stretch between set-apart spans that holds at least this
# share of the work is the steady window; where none does, the profile is not steady.
STEADY_MIN_SHARE = 0.5
# Periodic steps: at least this many times the steps around them (the median of the
# PERIODIC_NEIGHBOURS steps centred on each: a loop whose first steps run slower while it
# warms up still shows its validation steps against their own neighbours).
PERIODIC_FACTOR = 1.5
PERIODIC_MIN_STEPS = 6
PERIODIC_NEIGHBOURS = 9
PERIODIC_SHARE = 0.75
PERIODIC_MIN_HITS = 3
PERIODIC_CLEAR = 3.0

# Host work seen once before a pass's first call that runs GPU work, this long or longer, is
# set apart as its set-up.
SET_UP_MIN_NS = 1_000_000
# A first or second call this many times its later calls' median, and this long, is warm-up.
WARMUP_FACTOR = 10.0
WARMUP_MIN_NS = 20_000_000
# Ranges that are not calls of a function: steps, phases, advisor's own marks.
_NOT_A_CALL = re.compile(r"^(ProfilerStep#|advisor::|Iteration Start|PyTorch Profiler|enumerate\(DataLoader\))")



@dataclass(frozen=True)
class SetApart:
    """A stretch of the profile judged apart from the steady steps."""

    kind: str  # start-up, compilation, capture, in flight, start-up step, periodic step
    start_ns: int
    end_ns: int
    what: str  # in words, with what shows it
    events: tuple[int, ...] = ()  # row ids of the events that show it (evidence)

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)


@dataclass(frozen=True)
class Periodic:
    """Steps that run extra work every N steps (validation, checkpointing, logging)."""

    every: int  # the period, in steps
    steps: tuple[int, ...]  # the slow steps' numbers
    extra_ns: float  # a slow step's time over a steady one's (mean)
    steady_ns: float  # a steady step (median)
    share_of_run: float  # the extra time over all the timed steps' time
    phase: str  # where the extra time is (a phase name, "Others": outside every phase)
    source: str  # "timed steps" (the collector's clock, recorded or not) or "recorded steps"
    timed: int  # how many steps the figures cover
    signal: str = "wall time"  # what found them: "forward calls", "CPU time" or "wall time"
    no_grad: bool | None = None  # their extra forwards ran with autograd off (None: not known)


@dataclass(frozen=True)
class SteadyWindow:
    """What ``find_window`` decided: the window, its steps and what it set apart."""

    start_ns: int
    end_ns: int
    source: str  # recorded, dataloader, optimizer, module calls, graph replays, work span, empty
    how: str  # the source in words
    steps: pd.DataFrame  # the steady steps: step, start_ns, end_ns, name (may be empty)
    inferred: bool  # the steps were inferred, not recorded
    set_apart: tuple[SetApart, ...] = ()
    steady: bool = True
    not_steady: str = ""  # why not, where not steady
    periodic: Periodic | None = None
    all_steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # every step found, steady or not
    # Whether the window shows its work recur: two steady steps or more, or one step the
    # profiler numbered after others ran (a schedule's one active step of a loop). One pass
    # (no steps found), or a first step alone, shows the work once: a cost seen there may
    # not recur.
    recurs: bool = True
    span_ns: int = 0  # the whole profile, first event to last
    # Inferred steps on the device's clock (the host ran ahead): each step's host calls, by
    # when they ran (advisor.step.iterations); None where the steps' own times hold them.
    host_spans: pd.DataFrame | None = None

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)

    @property
    def set_apart_ns(self) -> int:
        return iv.total_length((np.array([s.start_ns for s in self.set_apart], dtype=np.int64),
                                np.array([s.end_ns for s in self.set_apart], dtype=np.int64)))


# -- start-up, compilation and capture ---------------------------------------------------------


def startup_spans(ev: pd.DataFrame) -> list[SetApart]:
    """The host calls and frames that set the device up, compile or capture, each as a
    SetApart (not merged), in time order."""
    names = ev["name"]
    host_call = one_of(ev["kind"], ("runtime", "driver"))
    frames = one_of(ev["kind"], ("python", "annotation", "op"))
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    took = end - start
    found: list[SetApart] = []

    def add(mask: np.ndarray, kind: str, what: str) -> None:
        rows = np.flatnonzero(mask)
        if not len(rows):
            return
        # Calls of one kind that follow each other closely make one stretch.
        spans = iv.union((start[rows], end[rows] + LONG_START_CALL_NS))
        for lo, hi in zip(spans.starts, spans.ends):
            inside = rows[(start[rows] >= lo) & (start[rows] < hi)]
            hi = int(end[inside].max())
            named = _top_names(names, inside, took)
            found.append(SetApart(kind, int(lo), hi, f"{what} ({named})", tuple(int(r) for r in inside[:20])))

    context = host_call & name_matches(names, calls.CONTEXT_CALLS) & (took >= LONG_START_CALL_NS)
    modules = host_call & name_matches(names, calls.MODULE_CALLS)
    capture = host_call & name_matches(names, calls.CAPTURE_CALLS)
    first_launches = host_call & name_matches(names, calls.LAUNCH_CALLS) & (took >= LONG_LAUNCH_NS) \
        & ~name_matches(names, calls.GRAPH_LAUNCH)
    add(context | modules | first_launches, "start-up", "the device being set up: context creation and kernel "
        "modules loaded on first use")
    add(capture | (frames & name_matches(names, calls.CAPTURE_FRAMES)), "capture",
        "graph capture and instantiation: work recorded into graphs, not run")
    add(frames & name_matches(names, calls.COMPILE_FRAMES), "compilation", "compilation (torch.compile, Triton)")
    found += first_calls(ev)
    found.sort(key=lambda s: s.start_ns)
    return found


def first_calls(ev: pd.DataFrame) -> list[SetApart]:
    """Warm-up inside the user's code: a function, op or range whose first or second call
    takes far longer than its later calls (``WARMUP_FACTOR`` times their median, and at
    least ``WARMUP_MIN_NS``): compiled on first use (TorchScript's profiling executor on its
    second call, Dynamo and Inductor, cuDNN's autotuning under cudnn.benchmark, a module
    loaded lazily). It runs once; the steps must not pay for it. Only the main thread's
    outermost such calls are named (a slow call's parents are slow with it)."""
    main = main_thread(ev)
    if main is None or not len(ev):
        return []
    # Ops and ranges, named by what they call; not Python frames, whose names are shared by
    # every call of a generic function (module.py: _call_impl is every module's call).
    kinds = one_of(ev["kind"], ("op", "annotation"))
    on_main = kinds & (ev["pid"].to_numpy() == main[0]) & (ev["tid"].to_numpy() == main[1])
    skip = name_matches(ev["name"], _NOT_A_CALL)
    rows = np.flatnonzero(on_main & ~skip)
    if len(rows) < 3:
        return []
    start, end = ev["start_ns"].to_numpy()[rows], ev["end_ns"].to_numpy()[rows]
    took = end - start
    codes = ev["name"].iloc[rows].cat.codes.to_numpy() if isinstance(ev["name"].dtype, pd.CategoricalDtype) \
        else pd.factorize(ev["name"].iloc[rows])[0]
    frame = pd.DataFrame({"code": codes, "start": start, "took": took, "row": rows}).sort_values(["code", "start"])
    frame["nth"] = frame.groupby("code").cumcount()
    counts = frame.groupby("code")["code"].transform("size")
    later = frame[frame["nth"] >= 2].groupby("code")["took"].median()
    second = frame[frame["nth"] == 1].set_index("code")["took"]
    # Where a function ran twice only, its second call is the one to compare with.
    typical = later.reindex(frame["code"].unique()).fillna(second.reindex(frame["code"].unique()))
    frame["typical"] = frame["code"].map(typical)
    slow = frame[(frame["nth"] <= 1) & (counts >= 2) & (frame["took"] >= WARMUP_MIN_NS)
                 & (frame["took"] >= WARMUP_FACTOR * frame["typical"].fillna(np.inf))
                 & ~((counts == 2) & (frame["nth"] == 1))]
    if not len(slow):
        return []
    # A call that spends its time waiting for the device (a copy back, a synchronize) waits
    # for work queued before it: that is the device's time, not a warm-up of the call.
    blocking = np.zeros(len(ev), dtype=bool)
    for pattern in calls.BLOCKING_CALLS:
        blocking |= name_matches(ev["name"], pattern)
    blocking &= one_of(ev["kind"], ("runtime", "driver"))
    waits = iv.union((ev["start_ns"].to_numpy()[blocking], ev["end_ns"].to_numpy()[blocking]))
    waited = np.array([iv.intersection_length(waits, ([a], [a + b])) for a, b in
                       zip(slow["start"].to_numpy(), slow["took"].to_numpy())], dtype=np.float64)
    slow = slow[waited < 0.5 * slow["took"].to_numpy()]
    if not len(slow):
        return []
    slow_rows = slow["row"].to_numpy()
    outer = outermost(slow_rows, ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy())
    by_row = slow.set_index("row")
    found = []
    for row in outer:
        call = by_row.loc[row]
        name = text(ev["name"].iloc[[row]])[0]
        which = "first" if int(call["nth"]) == 0 else "second"
        found.append(SetApart("warm-up", int(call["start"]), int(call["start"] + call["took"]),
                              f"the {which} call of {name} took {format_ns(int(call['took']))}, "
                              f"{call['took'] / max(call['typical'], 1):.0f} times its later calls: compiled, "
                              "autotuned or loaded on first use, once", (int(row),)))
    return found


def _top_names(names: pd.Series, rows: np.ndarray, took: np.ndarray, limit: int = 3) -> str:
    """The names holding most time among ``rows``, with their time: "cudaFree 8.0 s, ..."."""
    labels = text(names.iloc[rows])
    totals: dict[str, int] = {}
    for label, ns in zip(labels, took[rows]):
        short = label.split("(")[0] if label.startswith("/") else label
        totals[short] = totals.get(short, 0) + int(ns)
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:limit]
    return ", ".join(f"{name} {format_ns(ns)}" for name, ns in top)


# -- steps --------------------------------------------------------------------------------------


def _recorded_steps(ev: pd.DataFrame) -> pd.DataFrame:
    steps = ev[one_of(ev["kind"], ("step",))]
    out = steps[["step", "start_ns", "end_ns", "name"]].sort_values("start_ns", kind="stable")
    out = out.assign(name=text(out["name"])) if len(out) else out.assign(name=np.zeros(0, dtype=object))
    return out.reset_index(drop=True)


# -- the window ---------------------------------------------------------------------------------


def _work(ev: pd.DataFrame) -> tuple[iv.Intervals, bool]:
    """When the work ran: the GPU's busy time where the GPU was measured, else the host's
    operators; and whether it is the GPU's."""
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    gpu = one_of(ev["kind"], GPU_KINDS)
    if gpu.any():
        return iv.union((start[gpu], end[gpu])), True
    ops = one_of(ev["kind"], ("op",))
    return iv.union((start[ops], end[ops])), False


def _span(ev: pd.DataFrame) -> tuple[int, int]:
    """First to last event, host samples and stacks left out where there is anything else."""
    if not len(ev):
        return 0, 0
    measured = ~one_of(ev["kind"], ("sample", "stack"))
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    if measured.any():
        start, end = start[measured], end[measured]
    return int(start.min()), int(end.max())


def _in_flight(ev: pd.DataFrame, lo: int, hi: int) -> tuple[SetApart, int] | None:
    """GPU work queued at the window's start behind work the trace does not hold: GPU work
    with a known launch in [lo, hi) that started long after its launch call began, with the
    GPU running next to nothing meanwhile. The time up to its start is in flight: the
    device was busy with, or waiting behind, what the trace does not show. (From the call's
    start, not its return: a blocking copy returns only once its copy ran; a launch's from
    its return.) Returns the span and how long the work waited."""
    gpu = one_of(ev["kind"], GPU_KINDS)
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    launch = ev["launch"].to_numpy()
    rows = np.flatnonzero(gpu & (start >= lo) & (start < hi))
    if not len(rows):
        return None
    rows = rows[np.argsort(start[rows], kind="stable")]
    known = rows[launch[rows] >= 0]
    # A launch call returns before its work runs: a long one loaded a module (start-up),
    # and its work waited only from its return.
    issued = np.where(name_matches(ev["name"], calls.LAUNCH_CALLS)[launch[known]], end[launch[known]],
                      start[launch[known]])
    waited = start[known] - np.maximum(issued, lo)
    late = np.flatnonzero(waited >= IN_FLIGHT_MIN_NS)
    if not len(late):
        return None
    first = known[late[0]]
    since = max(int(issued[late[0]]), lo)
    wait = int(start[first]) - since
    # Work the GPU ran while it waited must be a small part of the wait: else the device
    # was busy with the trace's own work (a queue of its own kernels), which is no artifact.
    during = np.flatnonzero(gpu & (end > since) & (start < start[first]))
    if len(during) and iv.total_length(iv.clip(iv.union((start[during], end[during])), since,
                                               int(start[first]))) > 0.05 * wait:
        return None
    what = (f"GPU work launched before the trace began: work the trace launches waits {format_ns(wait)} to start, "
            "the GPU showing next to nothing else meanwhile")
    blocked = _blocking_during(ev, lo, int(start[first]))
    if blocked:
        what += f"; the host waits in {blocked}"
    return SetApart("in flight", lo, int(start[first]), what, (int(first), int(launch[first]))), wait


def _blocking_during(ev: pd.DataFrame, lo: int, hi: int) -> str:
    """The longest blocking call the host made in [lo, hi), in words ("" if none)."""
    host = one_of(ev["kind"], ("runtime", "driver"))
    blocking = np.zeros(len(ev), dtype=bool)
    for pattern in calls.BLOCKING_CALLS:
        blocking |= name_matches(ev["name"], pattern)
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    rows = np.flatnonzero(host & blocking & (start < hi) & (end > lo))
    if not len(rows):
        return ""
    longest = rows[np.argmax(end[rows] - start[rows])]
    return f"{text(ev['name'].iloc[[longest]])[0]} for {format_ns(int(end[longest] - start[longest]))}"


def _stretches(lo: int, hi: int, apart: list[SetApart]) -> iv.Intervals:
    """[lo, hi) less the set-apart spans."""
    if not apart:
        return iv.Intervals(np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64))
    taken = iv.union((np.array([s.start_ns for s in apart]), np.array([s.end_ns for s in apart])))
    return iv.subtract(([lo], [hi]), taken)


def _startup_steps(steps: pd.DataFrame, apart: list[SetApart]) -> tuple[pd.DataFrame, list[SetApart]]:
    """Steps that are start-up rather than steady: leading steps far slower than the median
    of the rest (the first of at least MIN_STEPS, STARTUP_FACTOR times it), or slower than
    STARTUP_SLOWER times it and holding start-up, compilation or capture; and any step that
    is mostly start-up, compilation or capture. Returns the steps left and those set apart."""
    took = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.float64)
    spans = iv.union((np.array([s.start_ns for s in apart], dtype=np.int64),
                      np.array([s.end_ns for s in apart], dtype=np.int64)))
    held = np.array([iv.intersection_length(spans, ([a], [b]))
                     for a, b in zip(steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy())], dtype=np.float64)
    out: list[SetApart] = []
    keep = np.ones(len(steps), dtype=bool)
    first = 0
    while first < len(steps) - 1:
        rest = took[first + 1:]
        steady = float(np.median(rest)) if len(rest) else 0.0
        slow_alone = len(steps) - first >= MIN_STEPS and steady > 0 and took[first] >= STARTUP_FACTOR * steady
        slow_with_startup = (steady > 0 and took[first] >= STARTUP_SLOWER * steady
                             and held[first] > 0.1 * (took[first] - steady))
        if not (slow_alone or slow_with_startup):
            break
        why = (f"it took {format_ns(took[first])}, {took[first] / steady:.1f} times the median of the steps after it"
               + (f", {format_ns(held[first])} of it start-up, compilation or capture" if held[first] else
                  " (start-up: initialisation, autotuning, compilation, state made on first use)"))
        out.append(_step_apart(steps, first, why))
        keep[first] = False
        first += 1
    for i in np.flatnonzero(keep & (held >= 0.5 * np.maximum(took, 1))):
        out.append(_step_apart(steps, int(i), f"{format_ns(held[i])} of its {format_ns(took[i])} is start-up, "
                                              "compilation or graph capture"))
        keep[i] = False
    return steps[keep].reset_index(drop=True), out


def _step_apart(steps: pd.DataFrame, i: int, why: str) -> SetApart:
    return SetApart("start-up step", int(steps["start_ns"].iat[i]), int(steps["end_ns"].iat[i]),
                    f"step #{int(steps['step'].iat[i])}: {why}")


def periodic_steps(numbers: np.ndarray, durations: np.ndarray, phases: list[dict[str, int]] | None = None,
                   *, source: str, cpu: np.ndarray | None = None,
                   calls: list[dict[str, int]] | None = None) -> Periodic | None:
    """Steps that run extra work every N steps. Three signals, the steadiest first: the
    step's shape (more forward calls than backward ones than a steady step has: an
    evaluation pass), the main thread's CPU time, and wall time against the steps around.
    The first two do not swing with the machine's load, so a validation every N steps is
    found on a busy machine too; wall time finds what neither sees (a checkpoint written
    to a slow disk). For each, the period is the commonest gap between slow steps and its
    phase the commonest remainder, so a slow step of another kind (start-up, the step
    after a validation paying for its own warm-up) does not hide the pattern; at least
    PERIODIC_SHARE of the steps on that period must be slow, and PERIODIC_MIN_HITS of them
    (two where each is PERIODIC_CLEAR times its neighbours, or is shaped apart: a long run
    validating twice). What the periodic steps cost is always measured in wall time."""
    numbers = np.asarray(numbers, dtype=np.int64)
    took = np.asarray(durations, dtype=np.float64)
    if len(took) < PERIODIC_MIN_STEPS or float(np.median(took)) <= 0:
        return None
    around = _around(took)
    signals: list[tuple[str, np.ndarray, np.ndarray]] = []
    if calls is not None and len(calls) == len(took) and any(calls):
        forwards = np.array([c.get("Forward", 0) + c.get(FORWARD_NO_GRAD, 0) - c.get("Backward", 0)
                             for c in calls], dtype=np.float64)
        shaped = forwards > float(np.median(forwards))
        signals.append(("forward calls", shaped, shaped))
    if cpu is not None and len(cpu) == len(took) and float(np.median(cpu)) > 0:
        cpu = np.asarray(cpu, dtype=np.float64)
        cpu_around = _around(cpu)
        signals.append(("CPU time", cpu >= PERIODIC_FACTOR * cpu_around, cpu >= PERIODIC_CLEAR * cpu_around))
    signals.append(("wall time", took >= PERIODIC_FACTOR * around, took >= PERIODIC_CLEAR * around))
    for signal, slow, clear in signals:
        found = _on_period(numbers, slow, clear)
        if found is None:
            continue
        periodic = found[1]
        extra = float((took[periodic] - around[periodic]).mean())
        if extra <= 0:  # the shape recurs but costs nothing
            continue
        return _periodic_found(numbers, took, phases, calls, slow, periodic, every=found[0], extra=extra,
                               source=source, signal=signal)
    return None


def _around(values: np.ndarray) -> np.ndarray:
    """Each step's neighbours' median: what a step around it takes."""
    return pd.Series(values).rolling(PERIODIC_NEIGHBOURS, center=True, min_periods=1).median().to_numpy()


def _on_period(numbers: np.ndarray, slow: np.ndarray, clear: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The period of the slow steps and which steps on it are slow, or None where they keep
    no period."""
    if slow.sum() < 2 or slow.sum() > len(slow) // 2:
        return None
    gaps = np.diff(numbers[slow])
    gaps = gaps[gaps >= 2]
    if not len(gaps):
        return None
    values, counts = np.unique(gaps, return_counts=True)
    every = int(values[np.argmax(counts)])
    residues, counts = np.unique(numbers[slow] % every, return_counts=True)
    on_period = numbers % every == int(residues[np.argmax(counts)])
    periodic = on_period & slow
    hits = int(periodic.sum())
    if hits < PERIODIC_SHARE * on_period.sum() or hits < (2 if bool(np.all(clear[periodic])) else PERIODIC_MIN_HITS):
        return None
    return every, periodic


def _periodic_found(numbers: np.ndarray, took: np.ndarray, phases: list[dict[str, int]] | None,
                    calls: list[dict[str, int]] | None, slow: np.ndarray, periodic: np.ndarray, *, every: int,
                    extra: float, source: str, signal: str) -> Periodic:
    """The Periodic for steps found slow on ``signal``: where their extra time is, and
    whether their extra forwards ran with autograd off."""
    steady = float(np.median(took[~slow]))
    phase = "Others"
    if phases:
        steady_rows = [phases[i] for i in np.flatnonzero(~slow)]
        slow_rows = [phases[i] for i in np.flatnonzero(periodic)]
        excess = {}
        for name in {k for row in slow_rows for k in row}:
            excess[name] = float(np.mean([r.get(name, 0) for r in slow_rows])) - \
                float(np.median([r.get(name, 0) for r in steady_rows]))
        # What no phase covers is Others: the slow step's time not in its phases.
        covered = float(np.mean([sum(r.values()) for r in slow_rows])) - \
            float(np.median([sum(r.values()) for r in steady_rows]))
        excess["Others"] = extra - covered
        phase = max(excess, key=excess.__getitem__)
    no_grad = None
    if calls is not None and len(calls) == len(took) and any(calls):
        off = np.array([c.get(FORWARD_NO_GRAD, 0) for c in calls], dtype=np.float64)
        on = np.array([c.get("Forward", 0) for c in calls], dtype=np.float64)
        extra_off = float(off[periodic].mean() - np.median(off[~slow]))
        extra_on = float(on[periodic].mean() - np.median(on[~slow]))
        if extra_off > 0 or extra_on > 0:
            no_grad = extra_off > 0 and extra_on <= 0
    total = float(took.sum())
    return Periodic(every=every, steps=tuple(int(n) for n in numbers[periodic]), extra_ns=extra, steady_ns=steady,
                    share_of_run=float(extra * periodic.sum() / total) if total else 0.0, phase=phase, source=source,
                    timed=len(took), signal=signal, no_grad=no_grad)


def find_window(session: Session) -> SteadyWindow:
    """The steady window of ``session`` (see the module docstring)."""
    ev = session.events
    lo, hi = _span(ev)
    if not len(ev) or hi <= lo:
        # Nothing to judge, and nothing set apart: the rules find nothing on their own.
        return SteadyWindow(lo, hi, "empty", "the profile holds no events", _recorded_steps(ev), False)
    apart = startup_spans(ev)
    main = main_thread(ev)
    steps = _recorded_steps(ev)
    source, how, inferred, host_spans = "recorded", "the profile's own step ranges (ProfilerStep#N)", False, None
    if len(steps) and session.meta.collector.name != "kineto-import":
        how = "the steps advisor's hooks marked"
    if not len(steps):
        found = find_iterations(ev, main)
        if found is not None:
            steps, source, how, host_spans = found.steps, found.source, found.how, found.host_spans
            inferred = True
    periodic = _periodic(session, steps)
    if len(steps):
        all_steps = steps
        steady_steps, leading = _startup_steps(steps, apart)
        # A first step that spends a real part of itself waiting behind work launched
        # before the trace (the GPU showing none of it) is that work's, not the loop's.
        if len(steady_steps) >= 2:
            first = steady_steps.iloc[0]
            found = _in_flight(ev, int(first["start_ns"]), int(first["end_ns"]))
            flight, wait = found if found is not None else (None, 0)
            if flight is not None and wait >= 0.1 * int(first["end_ns"] - first["start_ns"]):
                leading.append(SetApart("in flight", int(first["start_ns"]), int(first["end_ns"]),
                                        f"step #{int(first['step'])}: {flight.what}", flight.events))
                steady_steps = steady_steps.iloc[1:].reset_index(drop=True)
        w_lo = int(steady_steps["start_ns"].min()) if len(steady_steps) else lo
        w_hi = int(steady_steps["end_ns"].max()) if len(steady_steps) else hi
        set_apart = leading + [s for s in apart if s.end_ns <= w_lo or s.start_ns >= w_hi]
        if inferred and len(steady_steps) and not any(s.kind == "in flight" for s in leading):
            # Steps inferred from what repeats start where the repetition does: a wait behind
            # work launched before the trace, before the first of them, is named too.
            before = _in_flight(ev, lo, w_lo)
            if before is not None and before[1] >= IN_FLIGHT_MIN_NS:
                set_apart.append(before[0])
        if inferred:
            # What the loop does before its first iteration and after its last, seen once.
            set_apart += _outside_iterations(ev, loop_level(ev, main) if main is not None else None, lo, hi,
                                             all_steps, set_apart)
        if periodic is not None and periodic.source == "recorded steps":
            slow = set(periodic.steps)
            marked = steady_steps["step"].isin(slow).to_numpy()
            set_apart += [SetApart("periodic step", int(r.start_ns), int(r.end_ns),
                                   f"step #{int(r.step)}: {format_ns(int(r.end_ns - r.start_ns))}, with the work that "
                                   f"runs every {periodic.every} steps")
                          for r in steady_steps[marked].itertuples()]
        steady = bool(len(steady_steps))
        why = "" if steady else ("every step is start-up, compilation or graph capture: the profile holds no steady "
                                 "step")
        recurs = len(steady_steps) >= 2 or (len(steady_steps) == 1 and not inferred
                                             and int(steady_steps["step"].iat[0]) >= 1)
        if inferred and len(steady_steps):
            how += f" ({regularity(steady_steps)})"
        return SteadyWindow(w_lo, w_hi, source, how, steady_steps, inferred, tuple(_dedupe(set_apart)), steady,
                            why, periodic, all_steps, recurs=recurs, span_ns=hi - lo, host_spans=host_spans)
    # No steps: the stretch between set-apart spans where the work runs.
    work, on_gpu = _work(ev)
    total_work = work.length
    stretches = _stretches(lo, hi, apart)
    best, best_work = None, -1
    for s_lo, s_hi in zip(stretches.starts, stretches.ends):
        held = iv.intersection_length(work, ([s_lo], [s_hi]))
        if held > best_work:
            best, best_work = (int(s_lo), int(s_hi)), held
    what = "GPU work" if on_gpu else "host operators"
    if best is None or (total_work and best_work < STEADY_MIN_SHARE * total_work):
        why = ("most of the profile is start-up, compilation or graph capture: no stretch between them holds "
               f"half of the {what}")
        return SteadyWindow(lo, hi, "work span", f"the whole profile ({why})", steps, False, tuple(apart),
                            steady=False, not_steady=why, recurs=False, span_ns=hi - lo)
    w_lo, w_hi = best
    # Where the stretch begins: its work (a GPU window runs from its first to its last GPU work).
    inside = iv.clip(work, w_lo, w_hi)
    found = _in_flight(ev, w_lo, w_hi) if on_gpu else None
    # Without steps, only a wait as long as half of the work after it says so: a few
    # milliseconds of queue before a short trace's work may be the trace's own.
    flight = found[0] if found is not None and found[1] >= IN_FLIGHT_SHARE * (w_hi - found[0].end_ns) else None
    set_apart = [s for s in apart if s.end_ns <= w_lo or s.start_ns >= w_hi]
    if flight is not None:
        set_apart.append(flight)
        w_lo = flight.end_ns
    elif on_gpu and len(inside):
        begins = max(w_lo, min(int(inside.starts[0]), _first_host_work(ev, w_lo, w_hi)))
        level = loop_level(ev, main) if main is not None else None
        first_call = _pass_start(ev, level, int(inside.starts[0]))
        if first_call is not None and first_call - begins >= SET_UP_MIN_NS:
            set_apart.append(SetApart("set-up", begins, first_call, "before the pass's first call that runs work on "
                                      "the GPU, host work seen once (inputs made, a model built or loaded): "
                                      + _top_names_between(ev, level, begins, first_call)))
            begins = first_call
        w_lo = begins
    how = ("no steps were found: the stretch of the profile where the work runs"
           + (", start-up and capture set apart" if set_apart else ""))
    # No steps: nothing repeats that shows a step (no loader reads, optimizer steps, model
    # calls or graph replays to count), so the window shows its work once.
    return SteadyWindow(w_lo, w_hi, "work span", how, steps, False, tuple(_dedupe(sorted(set_apart,
                        key=lambda s: s.start_ns))), True, "", periodic, steps, recurs=False, span_ns=hi - lo)


def _outside_iterations(ev: pd.DataFrame, level: Level | None, lo: int, hi: int, steps: pd.DataFrame,
                        named: list[SetApart]) -> list[SetApart]:
    """The set-up before the first iteration found and the teardown after the last, where
    they hold SET_UP_MIN_NS or more that nothing set apart already names."""
    first, last = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    out = []
    for kind, a, b, where in (("set-up", lo, first, "before the first iteration"),
                              ("teardown", last, hi, "after the last iteration")):
        left = _stretches(a, b, [s for s in named if s.end_ns > a and s.start_ns < b]) if b > a else iv.EMPTY
        if left.length >= SET_UP_MIN_NS:
            a, b = _calls_between(level, int(left.starts[0]), int(left.ends[-1]))
            out.append(SetApart(kind, a, b, f"{where}, seen once: {_top_names_between(ev, level, a, b)}"))
    return out


def _pass_start(ev: pd.DataFrame, level: Level | None, first_gpu_ns: int) -> int | None:
    """Where one pass begins: the start of the loop's call (advisor.step.iterations) that
    launched the GPU's first work; None where that call is not known."""
    gpu = np.flatnonzero(one_of(ev["kind"], GPU_KINDS) & (ev["start_ns"].to_numpy() == first_gpu_ns))
    launch = ev["launch"].to_numpy()[gpu]
    launch = launch[launch >= 0]
    if not len(launch) or level is None or not len(level):
        return None
    at = int(level.at(np.array([int(ev["start_ns"].to_numpy()[launch].min())]))[0])
    return int(level.start[at]) if at < len(level) else None


def _calls_between(level: Level | None, lo: int, hi: int) -> tuple[int, int]:
    """[lo, hi) narrowed to the loop's calls inside it (from the first one's start to the
    last one's end); as it is where it holds none."""
    if level is None or not len(level):
        return lo, hi
    inside = (level.end > lo) & (level.start < hi)
    if not inside.any():
        return lo, hi
    return max(lo, int(level.start[inside].min())), min(hi, int(level.end[inside].max()))


def _top_names_between(ev: pd.DataFrame, level: Level | None, lo: int, hi: int) -> str:
    """The loop's calls holding most time in [lo, hi), with their time."""
    if level is None or not len(level):
        return format_ns(hi - lo)
    inside = (level.end > lo) & (level.start < hi)
    took = np.zeros(len(ev), dtype=np.int64)  # _top_names reads each row's time by row id
    took[level.rows[inside]] = (np.minimum(level.end, hi) - np.maximum(level.start, lo))[inside]
    return _top_names(ev["name"], level.rows[inside], took)


def _first_host_work(ev: pd.DataFrame, lo: int, hi: int) -> int:
    """The start of the first host operator or range in [lo, hi) on the loop's thread's
    process: host work before the GPU's first kernel (preprocessing) belongs to the window."""
    host = one_of(ev["kind"], ("op", "annotation"))
    start = ev["start_ns"].to_numpy()
    rows = np.flatnonzero(host & (start >= lo) & (start < hi))
    return int(start[rows].min()) if len(rows) else hi


def _periodic(session: Session, steps: pd.DataFrame) -> Periodic | None:
    """Periodic steps from the collector's clock (every step, recorded or not) where it
    timed enough of them, else from the recorded steps."""
    timed = [t for t in session.meta.timed_steps if not t.partial]
    if len(timed) >= PERIODIC_MIN_STEPS:
        found = periodic_steps(np.array([t.step for t in timed]), np.array([t.duration_ns for t in timed]),
                               [dict(t.phases) for t in timed], source="timed steps",
                               cpu=np.array([t.cpu_ns for t in timed]), calls=[dict(t.calls) for t in timed])
        if found is not None:
            return found
    if len(steps) >= PERIODIC_MIN_STEPS:
        return periodic_steps(steps["step"].to_numpy(), (steps["end_ns"] - steps["start_ns"]).to_numpy(),
                              source="recorded steps")
    return None


def _dedupe(spans: list[SetApart]) -> list[SetApart]:
    seen, out = set(), []
    for s in spans:
        key = (s.kind, s.start_ns, s.end_ns)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
