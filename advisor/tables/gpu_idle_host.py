"""GPU Idle, Host Outside Operators: what the host ran while the GPU idled and no
operator, CUDA call, data loading or blocking call explains it.

The gpu_idle table's "other" row is GPU idle time with the host in none of the states a
trace names by itself. This table breaks that time down by the innermost range the main
thread was in: a Python function where the trace has Python events (torch.profiler's
with_stack=True), else a user range (record_function, an nn.Module range), else nothing
recorded. Each row splits its time into the part inside the model's phases (forward,
backward, optimizer: eager Python between operators, the price of dispatching op by op)
and the part outside them (the script's own work between phases, which the step waits
for). The rules read that split: the first is launch overhead, the second host-bound.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, one_of, text
from advisor.session import intervals as iv
from advisor.session.attribute import parents_of_sorted
from advisor.tables._facts import MODEL_PHASES, Facts, user_frame
from advisor.tables._registry import table, with_notes
from advisor.tables.device import HOST_BUSY_KINDS
from advisor.tables.host_sync import blocking_calls

NOTHING = "(no recorded range)"
# Rows past this many are summed into one, so that a trace with a hundred thousand
# Python functions still gives a table a reader can take in.
MAX_ROWS = 40
REST = "(other ranges)"


# A kernel starts a few microseconds after its launch call returns even on an idle GPU:
# waiting longer than this with the launch done is waiting on the device, not the host.
LAUNCH_LATENCY_NS = 10_000
IDLE_STATES = ("work queued", "data loading", "blocking sync", "launching", "other")


def queued_work(f: Facts) -> iv.Intervals:
    """When GPU work had been launched (its call returned, plus the launch latency) but had
    not started: the device held work it did not run (waiting on an event, another stream
    or a peer), whatever the host did meanwhile."""
    gpu = f.gpu
    launch = gpu["launch"].to_numpy()
    known = launch >= 0
    if not known.any():
        return iv.EMPTY
    returned = f.events["end_ns"].to_numpy()[launch[known]] + LAUNCH_LATENCY_NS
    return iv.union((returned, gpu["start_ns"].to_numpy()[known]))


def idle_by_host_state(f: Facts) -> dict[str, iv.Intervals]:
    """The GPU's idle time in the window, split by the first state that covers it: work
    queued on the device, then the host's data loading, blocking sync, launching, and
    what is left ("other"). Worked out once for gpu_idle, gpu_timeline and this table."""

    def compute() -> dict[str, iv.Intervals]:
        lo, hi = f.window
        remaining = iv.subtract(([lo], [hi]), f.busy(*GPU_KINDS))
        phases = f.phases
        states = (
            ("work queued", queued_work(f)),
            ("data loading", phases[phases["phase_name"].to_numpy() == "Dataloader"]),
            ("blocking sync", blocking_calls(f)),
            ("launching", f.busy(*HOST_BUSY_KINDS)),
        )
        out = {"idle": remaining}
        for name, spans in states:
            busy = iv.as_intervals(spans)
            out[name] = iv.intersect(remaining, busy)
            remaining = iv.subtract(remaining, busy)
        out["other"] = remaining
        return out

    return f.memo("idle_by_host_state", compute)


def _main_thread_ranges(f: Facts) -> pd.DataFrame:
    """Python events and user ranges on the thread that runs the steps, sorted by start
    (outer first), with their parent positions."""
    ev = f.events
    main = f.main_thread
    if main is None:
        return ev.iloc[0:0].assign(parent=np.zeros(0, dtype=np.int64))
    pid, tid = main
    mine = (ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid) & one_of(ev["kind"], ("python", "annotation"))
    ranges = ev.loc[mine, ["name", "kind", "start_ns", "end_ns"]]
    ranges = ranges.assign(neg_end=-ranges["end_ns"]).sort_values(["start_ns", "neg_end"], kind="stable")
    ranges = ranges.drop(columns="neg_end").reset_index(drop=True)
    return ranges.assign(parent=parents_of_sorted(ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()))


def _self_time(ranges: pd.DataFrame, within: iv.Intervals) -> np.ndarray:
    """Each range's time inside ``within`` that none of its children covers."""
    inclusive = (iv.covered_before(within, ranges["end_ns"].to_numpy())
                 - iv.covered_before(within, ranges["start_ns"].to_numpy())).astype(np.int64)
    parents = ranges["parent"].to_numpy()
    children = np.zeros(len(ranges), dtype=np.int64)
    has_parent = parents >= 0
    np.add.at(children, parents[has_parent], inclusive[has_parent])
    return np.maximum(inclusive - children, 0), inclusive


def _user_lines(ranges: pd.DataFrame) -> np.ndarray:
    """Each range's innermost enclosing Python frame (itself included) that is the
    user's code, as "file:line"; "" where every enclosing frame is a library's."""
    names = ranges["name"].to_numpy()
    python = (ranges["kind"] == "python").to_numpy()
    parents = ranges["parent"].to_numpy()
    own = np.array([user_frame(n) if p else "" for n, p in zip(names, python)], dtype=object)
    # A frame's own line is where it was called from its parent, not a line inside it:
    # "file(line): function" names the function's first line; that is what is shown.
    out = own.copy()
    for i in range(len(out)):  # parents come before children in start order
        if not out[i] and parents[i] >= 0:
            out[i] = out[parents[i]]
    return out


@table(
    "gpu_idle_host",
    title="GPU Idle, Host Outside Operators",
    description=(
        "The gpu_idle table's \"other\" time (the GPU idle, the host in no operator, CUDA call, "
        "data loading or blocking call) by the innermost range the main thread was in: a Python "
        "function where the trace has Python events, else a user range, else "
        f"{NOTHING!r}. Split into the part inside the model's phases (Forward, Backward, "
        "Optimization: Python between operators) and the part outside them. Rows past "
        f"{MAX_ROWS} are summed into {REST!r}. Empty when the GPU was not measured."
    ),
    key="the range's name (a Python frame \"file(line): function\" or a range name), or the two rows above",
    columns={
        "source": "python (a Python function), range (a user or module range), none (nothing recorded).",
        "idle_ns": "GPU idle time, host in this range and no deeper one, outside every operator, ns.",
        "in_model_ns": "the part of idle_ns inside a Forward, Backward or Optimization phase, ns.",
        "outside_model_ns": "the part of idle_ns outside those phases, ns.",
        "per_step_ns": "idle_ns per step, ns (NaN without steps).",
        "share_of_other": "idle_ns / the gpu_idle table's other time (0..1).",
        "share_of_step": "per_step_ns / the mean step (0..1; NaN without steps).",
        "user_line": "the innermost enclosing frame of the user's own code, \"file:line\" (\"\" if none).",
    },
)
def gpu_idle_host_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    if f.window_ns <= 0:
        return None
    other = idle_by_host_state(f)["other"]
    phases = f.phases
    model = iv.union(iv.as_intervals(phases[np.isin(phases["phase_name"].to_numpy(), MODEL_PHASES)]))
    inside, outside = iv.intersect(other, model), iv.subtract(other, model)
    ranges = _main_thread_ranges(f)
    in_self, in_incl = _self_time(ranges, inside)
    out_self, out_incl = _self_time(ranges, outside)
    top = ranges["parent"].to_numpy() < 0
    rows = pd.DataFrame({
        "name": text(ranges["name"]),
        "source": np.where(ranges["kind"].to_numpy() == "python", "python", "range"),
        "in_model_ns": in_self, "outside_model_ns": out_self,
        "user_line": _user_lines(ranges),
    })
    rows = rows[(rows["in_model_ns"] + rows["outside_model_ns"]) > 0]
    out = rows.groupby("name", sort=False).agg(
        source=("source", "first"), in_model_ns=("in_model_ns", "sum"), outside_model_ns=("outside_model_ns", "sum"))
    # One function runs under several callers: name the user's line that holds most of its time.
    by_line = rows.assign(ns=rows["in_model_ns"] + rows["outside_model_ns"]).groupby(
        ["name", "user_line"], sort=False)["ns"].sum().reset_index()
    busiest = by_line.sort_values("ns", ascending=False, kind="stable").drop_duplicates("name")
    out["user_line"] = busiest.set_index("name")["user_line"].reindex(out.index).fillna("")
    uncovered_in = inside.length - int(in_incl[top].sum())
    uncovered_out = outside.length - int(out_incl[top].sum())
    if uncovered_in + uncovered_out > 0:
        out.loc[NOTHING] = ["none", uncovered_in, uncovered_out, ""]
    out["idle_ns"] = out["in_model_ns"] + out["outside_model_ns"]
    out = out.sort_values("idle_ns", ascending=False, kind="stable")
    if len(out) > MAX_ROWS:
        kept, rest = out.iloc[:MAX_ROWS - 1], out.iloc[MAX_ROWS - 1:]
        out = pd.concat([kept, pd.DataFrame({
            "source": ["range"], "in_model_ns": [int(rest["in_model_ns"].sum())],
            "outside_model_ns": [int(rest["outside_model_ns"].sum())], "user_line": [""],
            "idle_ns": [int(rest["idle_ns"].sum())]}, index=[REST])])
    out = out.astype({"in_model_ns": "int64", "outside_model_ns": "int64", "idle_ns": "int64"})
    steps = len(f.steps) if f.has_steps else 0
    out["per_step_ns"] = out["idle_ns"] / steps if steps else np.nan
    out["share_of_other"] = f.ratio(out["idle_ns"], other.length)
    mean_step = f.step_total_ns / steps if steps else 0
    out["share_of_step"] = f.ratio(out["per_step_ns"], mean_step) if steps else np.nan
    out.index.name = "key"
    return out[["source", "idle_ns", "in_model_ns", "outside_model_ns", "per_step_ns", "share_of_other",
                "share_of_step", "user_line"]]
