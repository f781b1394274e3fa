"""The job's cross-rank tables: pure functions of its ranks' summaries.

A job (many ranks) is summarised rank by rank where each rank's data is; what comes back
per rank is its figures (``rank_figures``, read from its own tables) and its collective
calls (``collective_calls``), both pure functions of that rank's Session. From those:

``ranks``        one row per rank: its steps and pace, GPU use, computation and
                 communication, the time it waits in collectives for the others, the
                 collectives it arrives at last, its data loading and host syncs.
``collectives``  one row per collective and process group: calls per step, time, the
                 skew of arrival across ranks and the rank that arrives last most often.

Arrival is read from durations, not from clocks: a collective ends on every rank at
about the same moment (none can finish before the last one arrives), so the rank that
arrives last has the shortest call, and each other rank's call is longer by the time it
waited for it. That holds whatever the ranks' clocks say, across hosts too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from advisor.session import Session
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step import build_step_model
from advisor.step.facts import COMM_HOST, Facts
from advisor.tables._registry import TableDoc

__all__ = [
    "CALL_COLUMNS",
    "JOB_TABLE_DOCS",
    "RankRow",
    "collective_calls",
    "collectives_table",
    "job_tables",
    "matched_calls",
    "rank_figures",
    "ranks_table",
]

# One row per collective call in a step: which collective, in which process group, the
# step number and the call's position among the same collective's calls in that step
# (the same call on every rank, since ranks issue a group's collectives in one order).
CALL_COLUMNS = ("collective", "group", "step", "seq", "start_ns", "duration_ns", "bytes")

# Element sizes of the dtypes record_param_comms names, in bytes.
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1,
                "Float8_e5m2": 1, "UInt32": 4, "UInt64": 8, "UInt16": 2}

# NCCL kernel names, old and new: ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_AllGather_RING_LL, ncclDevKernel_SendRecv.
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")




@dataclass
class RankRow:
    """What the job's tables read of one rank."""

    rank: int
    rank_from: str
    source: str
    figures: dict[str, float | None] = field(default_factory=dict)
    calls: pd.DataFrame | None = None
    top_finding: str | None = None


def collective_calls(session: Session, facts: Facts | None = None) -> pd.DataFrame:
    """The session's collective calls inside its steps (CALL_COLUMNS), in time order: the
    NCCL kernels where the GPU was measured, else gloo's gloo:* ranges (a CPU job)."""
    f = facts or Facts(session)
    steps = f.steps
    if f.gpu_measured and f.comm_kernels.any():
        rows = f.gpu[f.comm_kernels]
        names = [_kernel_collective(n) for n in rows["name"].astype(str)]
        # The kernel's launching op is the collective's record_param_comms where the trace
        # has one: its process group and message size.
        parent = rows["parent_op"].to_numpy()
        comm = np.where(parent >= 0, f.events["comm"].to_numpy()[np.clip(parent, 0, None)], "")
    else:
        rows = f.comm_work_host
        names = [str(n).split(":", 1)[1].strip() or "collective" for n in rows["name"].astype(str)]
        comm = np.full(len(rows), "", dtype=object)
    groups, sizes = _groups_and_bytes(comm)
    if not len(rows) or not len(steps):
        return pd.DataFrame({c: [] for c in CALL_COLUMNS})
    start = rows["start_ns"].to_numpy()
    s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    pos = np.searchsorted(s_start, start, side="right") - 1
    inside = (pos >= 0) & (start < s_end[np.clip(pos, 0, None)])
    calls = pd.DataFrame({
        "collective": np.asarray(names, dtype=object)[inside],
        "group": groups[inside],
        "step": steps["step"].to_numpy()[pos[inside]],
        "start_ns": start[inside],
        "duration_ns": (rows["end_ns"].to_numpy() - start)[inside],
        "bytes": sizes[inside],
    }).sort_values("start_ns", kind="stable")
    calls["seq"] = calls.groupby(["step", "collective", "group"]).cumcount()
    return calls[list(CALL_COLUMNS)].reset_index(drop=True)


def _groups_and_bytes(comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each call's process group ("default" where the trace names none) and message bytes
    (NaN where unknown), from the comm column's JSON, parsed once per distinct text."""
    parsed: dict[str, tuple[str, float]] = {}
    groups = np.empty(len(comm), dtype=object)
    sizes = np.full(len(comm), np.nan)
    for i, text in enumerate(comm):
        text = str(text)
        if text not in parsed:
            parsed[text] = _parse_comm(text)
        groups[i], sizes[i] = parsed[text]
    return groups, sizes


def _parse_comm(text: str) -> tuple[str, float]:
    try:
        name, description, elements, dtype = json.loads(text) if text else (None, None, None, None)
    except (ValueError, TypeError):
        return "default", np.nan
    group = str(description or name or "default")
    size = _DTYPE_BYTES.get(str(dtype))
    return group, float(elements) * size if isinstance(elements, (int, float)) and size else np.nan


def _kernel_collective(name: str) -> str:
    match = _NCCL_KERNEL.search(name)
    if not match:
        return "collective"
    return _CAMEL.sub("_", match.group(1)).lower()


def rank_figures(session: Session, tables: dict[str, pd.DataFrame],
                 facts: Facts | None = None) -> dict[str, float | str | None]:
    """The per-step figures of one rank for the job's `ranks` table, read from its tables
    and its step model (the step times are its facts, advisor.step.timing; ``mean_step_ns``,
    the rank's mean step, is what the job's rules take the job's step from)."""
    model = facts.model if facts is not None and facts.model is not None else build_step_model(session)
    facts = model.facts
    steps = session.steps()
    durations = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype="float64")
    count = len(steps)
    out: dict[str, float | None] = {
        "steps": float(count),
        "step_mean_ns": model.recorded_step_ns if count else None,
        "step_max_ns": float(durations.max()) if count else None,
        "mean_step_ns": model.mean_step_ns,
    }

    def cell(table: str, row: str, column: str) -> float | None:
        frame = tables.get(table)
        if frame is None or row not in frame.index or column not in frame.columns:
            return None
        value = frame.at[row, column]
        return float(value) if pd.notna(value) else None

    per = max(count, 1)
    step_total = cell("model", "ProfileStep", "cpu_total_ns")
    for phase in ("Dataloader", "Forward", "Backward", "Optimization", "Others"):
        total = cell("model", phase, "cpu_total_ns")
        out[f"{phase.lower()}_ns"] = total / per if total is not None else None
    host_other, host_other_top = _host_outside_phases(facts)
    host_other = host_other / per if count else None
    # Python that runs no operator (torch.save, logging, metrics in Python) shows only in
    # the stack samples: the main thread's sampled time outside the phases, not waiting.
    python_other, python_top = _python_outside_phases(tables.get("python_hotspots"))
    if python_other is not None and (host_other is None or python_other > host_other):
        host_other, host_other_top = python_other, python_top
    out["host_other_ns"] = host_other
    out["host_other_top"] = host_other_top
    forward_calls = cell("model", "Forward", "calls")
    out["forward_calls"] = forward_calls / per if forward_calls is not None and count else None
    out["pace_ns"] = model.unrecorded_step_ns
    loader = cell("model", "Dataloader", "cpu_total_ns")
    out["dataloader_share"] = loader / step_total if loader is not None and step_total else None
    device = tables.get("device")
    gpu_rows = [k for k in device.index if str(k).startswith("gpu")] if device is not None else []
    out["gpu_utilization"] = (float(device.loc[gpu_rows, "utilization"].mean())
                              if gpu_rows and "utilization" in device.columns else None)
    for row, name in (("Computation", "compute_ns"), ("Communication", "comm_ns"),
                      ("Communication (not overlapped)", "comm_alone_ns")):
        total = cell("distributed", row, "total_ns")
        out[name] = total / per if total is not None else None
    sync = tables.get("host_sync")
    out["host_sync_ns"] = (float(sync["host_total_ns"].sum()) / per
                           if sync is not None and "host_total_ns" in sync.columns else None)
    return out


_DOCS = {
    "ranks": {
        "title": "Ranks",
        "description": "One row per rank of the job, figures per step (mean over the rank's steady steps). "
                       "wait_ns is the time the rank's collectives lasted longer than the same call on the rank "
                       "that arrived last; last_arrivals counts the calls this rank arrived at last.",
        "key": "rank N",
        "columns": {
            "rank": "The rank number.",
            "rank_from": "How the rank number was found: distributedInfo, file name, launcher or order given.",
            "source": "The rank's trace or saved session.",
            "steps": "Steps in the rank's window.",
            "step_mean_ns": "Mean step time, ns.",
            "step_max_ns": "Longest step, ns.",
            "pace_ns": "Mean step time of the steps that ran without recording, ns: the job's own pace "
                       "(empty where every step was recorded).",
            "gpu_utilization": "GPU busy share of the window (0..1); empty where the GPU was not measured.",
            "compute_ns": "Computation per step, ns (GPU kernels, or the main thread's ops on a CPU job).",
            "comm_ns": "Communication per step, ns (NCCL kernels, or gloo's ranges).",
            "comm_alone_ns": "Communication per step with no computation beside it, ns.",
            "wait_ns": "Time per step the rank waited in collectives for the last rank to arrive, ns (collectives "
                       "that wait at once counted once).",
            "last_arrivals": "Collective calls at which this rank arrived last.",
            "last_share": "last_arrivals over the calls matched across ranks (0..1).",
            "dataloader_ns": "Host time per step in the data loader, ns.",
            "dataloader_share": "Data loader time over step time (0..1).",
            "forward_ns": "Host time per step in forward, ns.",
            "forward_calls": "The model's forward calls per step (more than the other ranks': an extra pass, "
                             "such as evaluation, on this rank).",
            "backward_ns": "Host time per step in backward, ns.",
            "optimization_ns": "Host time per step in the optimizer, ns.",
            "others_ns": "Step time per step outside the phases, ns (waits included).",
            "host_other_ns": "The main thread's busy time per step outside the phases, ns: its operators and "
                             "ranges there, collectives left out.",
            "host_other_top": "The operator or range that takes most of that time.",
            "host_sync_ns": "Host time per step blocked in synchronisations, ns.",
            "top_finding": "The rank's top finding (rule id), if any.",
        },
    },
    "collectives": {
        "title": "Collectives",
        "description": "One row per collective and process group, from the calls matched across ranks (same "
                       "step, same collective, same position in the step). Skew is how much longer the "
                       "slowest-to-finish rank's call lasted than the last arriver's, the others' wait.",
        "key": "collective|process group",
        "columns": {
            "calls_per_step": "Calls per step (mean over ranks).",
            "bytes_per_call": "Median message size of a call, bytes (from record_param_comms; empty where the "
                              "trace does not record it).",
            "time_ns": "Time in the collective per step, ns (mean over ranks).",
            "matched_calls": "Calls found on two ranks or more, which the skew figures cover.",
            "skew_mean_ns": "Mean over matched calls of the longest minus the shortest call, ns.",
            "skew_max_ns": "The largest such difference, ns.",
            "last_rank": "The rank that arrived last most often.",
            "last_rank_share": "The share of matched calls it arrived at last (0..1).",
        },
    },
}
JOB_TABLE_DOCS: dict[str, TableDoc] = {
    name: TableDoc(title=d["title"], description=d["description"], columns=d["columns"], key=d["key"])
    for name, d in _DOCS.items()
}


def matched_calls(ranks: list[RankRow]) -> pd.DataFrame:
    """Every rank's collective calls with their rank, limited to the calls two ranks or more
    made (the same step, collective, group and position), each with the shortest duration
    of its match (``min_ns``: the last arriver's) and whether this rank was that one."""
    frames = [r.calls.assign(rank=r.rank) for r in ranks if r.calls is not None and len(r.calls)]
    if not frames:
        return pd.DataFrame({c: [] for c in (*CALL_COLUMNS, "rank", "min_ns", "is_last", "wait_ns")})
    calls = pd.concat(frames, ignore_index=True)
    key = ["step", "collective", "group", "seq"]
    grouped = calls.groupby(key, sort=False)["duration_ns"]
    calls["ranks_in_call"] = grouped.transform("size")
    calls = calls[calls["ranks_in_call"] >= 2].copy()
    grouped = calls.groupby(key, sort=False)["duration_ns"]
    calls["min_ns"] = grouped.transform("min")
    calls["wait_ns"] = calls["duration_ns"] - calls["min_ns"]
    # The last arriver: the shortest call (the lowest rank where two tie).
    ordered = calls.sort_values([*key, "duration_ns", "rank"], kind="stable")
    calls["is_last"] = False
    calls.loc[ordered.index[~ordered.duplicated(key).to_numpy()], "is_last"] = True
    return calls.drop(columns="ranks_in_call")


def _waited(matched: pd.DataFrame) -> pd.Series:
    """Each rank's time spent waiting in collectives: the union, on its own clock, of the
    first ``wait_ns`` of each of its calls (a call waits before the last rank arrives, then
    runs). Collectives that run at once (DDP's buckets on gloo's threads) wait through the
    same time, which a sum of their waits would count twice."""
    if not len(matched):
        return pd.Series(dtype="float64")
    out = {}
    for rank, calls in matched.groupby("rank"):
        start = calls["start_ns"].to_numpy(dtype="int64")
        out[rank] = float(iv.union(iv.as_intervals(start, start + calls["wait_ns"].to_numpy(dtype="int64"))).length)
    return pd.Series(out, dtype="float64")


def ranks_table(ranks: list[RankRow], matched: pd.DataFrame) -> pd.DataFrame:
    rows = []
    waits = _waited(matched)
    lasts = matched.groupby("rank")["is_last"].sum() if len(matched) else pd.Series(dtype="float64")
    counted = matched.groupby("rank").size() if len(matched) else pd.Series(dtype="float64")
    for entry in ranks:
        fig = entry.figures
        steps = fig.get("steps") or 0
        n_matched = int(counted.get(entry.rank, 0))
        rows.append({
            "key": f"rank {entry.rank}",
            "rank": entry.rank,
            "rank_from": entry.rank_from,
            "source": entry.source,
            "steps": int(steps),
            "step_mean_ns": fig.get("step_mean_ns"),
            "step_max_ns": fig.get("step_max_ns"),
            "pace_ns": fig.get("pace_ns"),
            "gpu_utilization": fig.get("gpu_utilization"),
            "compute_ns": fig.get("compute_ns"),
            "comm_ns": fig.get("comm_ns"),
            "comm_alone_ns": fig.get("comm_alone_ns"),
            "wait_ns": float(waits.get(entry.rank, 0.0)) / steps if steps and n_matched else None,
            "last_arrivals": int(lasts.get(entry.rank, 0)) if n_matched else None,
            "last_share": float(lasts.get(entry.rank, 0)) / n_matched if n_matched else None,
            "dataloader_ns": fig.get("dataloader_ns"),
            "dataloader_share": fig.get("dataloader_share"),
            "forward_ns": fig.get("forward_ns"),
            "forward_calls": fig.get("forward_calls"),
            "backward_ns": fig.get("backward_ns"),
            "optimization_ns": fig.get("optimization_ns"),
            "others_ns": fig.get("others_ns"),
            "host_other_ns": fig.get("host_other_ns"),
            "host_other_top": fig.get("host_other_top"),
            "host_sync_ns": fig.get("host_sync_ns"),
            "top_finding": entry.top_finding,
        })
    return pd.DataFrame(rows).set_index("key")


def collectives_table(ranks: list[RankRow], matched: pd.DataFrame) -> pd.DataFrame | None:
    frames = [r.calls.assign(rank=r.rank) for r in ranks if r.calls is not None and len(r.calls)]
    if not frames:
        return None
    calls = pd.concat(frames, ignore_index=True)
    steps = {r.rank: max(r.figures.get("steps") or 0, 1) for r in ranks}
    calls["per_step"] = 1.0 / calls["rank"].map(steps)
    calls["time_per_step"] = calls["duration_ns"] * calls["per_step"]
    n_ranks = calls["rank"].nunique()
    by = calls.groupby(["collective", "group"], sort=True)
    out = pd.DataFrame({
        "calls_per_step": by["per_step"].sum() / n_ranks,
        "bytes_per_call": by["bytes"].median(),
        "time_ns": by["time_per_step"].sum() / n_ranks,
    })
    out["matched_calls"] = 0
    out["skew_mean_ns"] = np.nan
    out["skew_max_ns"] = np.nan
    out["last_rank"] = pd.array([pd.NA] * len(out), dtype="Int64")
    out["last_rank_share"] = np.nan
    if len(matched):
        key = ["collective", "group", "step", "seq"]
        per_call = matched.groupby(key, sort=False).agg(max_ns=("duration_ns", "max"), min_ns=("min_ns", "first"))
        per_call["skew"] = per_call["max_ns"] - per_call["min_ns"]
        skew = per_call.groupby(["collective", "group"])["skew"]
        lasts = matched[matched["is_last"]].groupby(["collective", "group"])["rank"]
        for index in out.index:
            if index not in skew.groups:
                continue
            values = skew.get_group(index)
            out.at[index, "matched_calls"] = len(values)
            out.at[index, "skew_mean_ns"] = float(values.mean())
            out.at[index, "skew_max_ns"] = float(values.max())
            if index in lasts.groups:
                counts = lasts.get_group(index).value_counts()
                out.at[index, "last_rank"] = int(counts.index[0])
                out.at[index, "last_rank_share"] = float(counts.iloc[0]) / len(values)
    out.index = [f"{c}|{g}" for c, g in out.index]
    out.index.name = "key"
    return out.sort_values("time_ns", ascending=False)


def _python_outside_phases(hotspots: pd.DataFrame | None) -> tuple[float | None, str | None]:
    """Per step: the main thread's sampled Python time outside the phases, waits left out,
    and the line that takes most of it."""
    if hotspots is None or not len(hotspots) or "other_ns" not in hotspots.columns:
        return None, None
    main = hotspots[hotspots["role"].astype(str) == "main"]
    if not len(main):
        return None, None
    busy = main["other_ns"].astype(float) * (1.0 - main["waiting_share"].astype(float).fillna(0.0))
    if not busy.sum():
        return 0.0, None
    top = main.loc[busy.idxmax()]
    return float(busy.sum()), f"{top['function']} ({top['file']}:{top['line']})"


def _host_outside_phases(f: Facts) -> tuple[float, str | None]:
    """The main thread's busy time in the steps outside the model's phases: its operators
    and ranges there, less the collectives (a rank waiting at a collective is not busy).
    Unlike the model table's Others row, which is whatever the phases leave of the step,
    waiting included, this is work the rank does."""
    if f.main_thread is None or not f.has_steps:
        return 0.0, None
    pid, tid = f.main_thread
    ev = f.events
    mine = (ev["pid"].to_numpy() == pid) & (ev["tid"].to_numpy() == tid) & \
        ev["kind"].isin(["op", "annotation", "python"]).to_numpy() & (ev["step"].to_numpy() >= 0)
    rows = ev[mine]
    rows = rows[~name_matches(rows["name"], COMM_HOST)]
    busy = f.union_in_window(rows)
    phases = f.phases
    model = phases[phases["phase_name"].isin(["Dataloader", "Forward", "Backward", "Optimization"]).to_numpy()]
    in_model = f.union_in_window(model)
    outside = rows[~iv.covers(in_model, rows["start_ns"].to_numpy())]
    top = None
    if len(outside):
        # The outermost rows outside the phases, by name: what that time was spent in.
        outer = outside[outside["parent_op"].to_numpy() < 0] if (outside["parent_op"] < 0).any() else outside
        by_name = (outer["end_ns"] - outer["start_ns"]).groupby(outer["name"].astype(str)).sum()
        top = str(by_name.idxmax())
    return float(iv.subtract(busy, in_model).length), top


def job_tables(ranks: list[RankRow]) -> dict[str, pd.DataFrame]:
    """The job's tables by name (``collectives`` only where the ranks communicate)."""
    matched = matched_calls(ranks)
    tables = {"ranks": ranks_table(ranks, matched)}
    collectives = collectives_table(ranks, matched)
    if collectives is not None:
        tables["collectives"] = collectives
    return tables
