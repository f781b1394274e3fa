"""GPU Idle, Host Work by Function: the GPU's idle time with the host at work (inside the
model, outside it, or in nothing recorded), by the innermost Python function, range or
operator the loop's thread was in.

The gpu_idle table's host causes say how much of the idle time the host spent inside the
model (dispatching it op by op: eager Python, module calls) and outside it (the script's
own work between phases: preprocessing, logging, the loop's own code). This table names
where: each idle nanosecond goes to the innermost range the main thread was in (nested
ranges clipped to their parents, so each nanosecond counts once and the rows sum to the
causes' time), with the innermost and outermost frames of the user's own code around it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts, Groups
from advisor.step.idle import NOTHING, host_frames, model_ranges
from advisor.tables._registry import table, with_notes

__all__ = ["MAX_ROWS", "NOTHING", "REST"]

# Rows past this many are summed into one, so that a trace with a hundred thousand
# Python functions still gives a table a reader can take in.
MAX_ROWS = 40
REST = "(other ranges)"


@table(
    "gpu_idle_host",
    title="GPU Idle, Host Work by Function",
    description=(
        "The gpu_idle table's host in model, host outside model and unrecorded time, by the innermost range the "
        "loop's thread was in: a Python function (\"file(line): function\") where the trace has Python events, "
        "else a user range or an operator, else "
        f"{NOTHING!r}. Each nanosecond counts once: nested ranges are clipped to their parents. Rows past "
        f"{MAX_ROWS} are summed into {REST!r}. Empty when the GPU was not measured."
    ),
    key="the range's name (a Python frame \"file(line): function\", a range or an operator's name), or the two "
        "rows above",
    columns={
        "source": "python (a Python function), range (a user or module range), op (an operator), none.",
        "idle_ns": "GPU idle time, the host in this range and no deeper one, ns.",
        "in_model_ns": "the part of idle_ns inside the model (its phases, a module's call), ns.",
        "outside_model_ns": "the part of idle_ns outside the model, ns.",
        "per_step_ns": "idle_ns per steady step, ns.",
        "share_of_host": "idle_ns / the GPU idle time with the host at work (the host causes' sum, 0..1).",
        "share_of_step": "per_step_ns / the mean step (0..1).",
        "user_line": "the innermost enclosing frame of the user's own code, \"file:line\" (\"\" if none).",
        "user_function": "that frame's function (\"\" if none).",
        "outer_line": "the outermost frame of the user's own code around it, \"file:line\" (\"\" if none).",
        "outer_function": "that outermost frame's function (\"\" if none).",
    },
)
def gpu_idle_host_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    if f.window_ns <= 0 or f.model is None or not f.model.partition.on_gpu:
        return None
    part = f.model.partition
    model = model_ranges(f)
    host = iv.union(iv.as_intervals(
        np.concatenate([part.causes[c].starts for c in ("host in model", "host outside model", "unrecorded")]),
        np.concatenate([part.causes[c].ends for c in ("host in model", "host outside model", "unrecorded")])))
    if not host.length:
        return None
    inside = iv.intersect(host, model)
    outside = iv.subtract(host, model)
    frames = []
    for spans, column in ((inside, "in_model_ns"), (outside, "outside_model_ns")):
        rows = host_frames(f, spans)
        frames.append(rows.assign(**{column: rows["ns"], ("outside_model_ns" if column == "in_model_ns"
                                                            else "in_model_ns"): 0}))
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["name"].notna().to_numpy()]  # a row without a name is in no group
    kind = rows["kind"].to_numpy()
    source = np.select([kind == "python", kind == "op", kind == "none"], ["python", "op", "none"], default="range")
    by_name = Groups(rows["name"].to_numpy(), sort=False)  # names in the order they first come
    out = pd.DataFrame({"source": by_name.first(source),
                        **{c: by_name.sum(rows[c].to_numpy()) for c in ("in_model_ns", "outside_model_ns")}},
                       index=pd.Index(by_name.keys, dtype=object, name="name"))
    # One function runs under several callers: name the user's lines that hold most of its time.
    ns = rows["ns"].to_numpy()
    for column in ("user_line", "user_function", "outer_line", "outer_function"):
        value, values = pd.factorize(rows[column].fillna("").to_numpy())
        pairs = Groups(by_name.codes * len(values) + value, sort=False)  # (name, line) pairs as they first come
        order = np.argsort(-pairs.sum(ns), kind="stable")  # most time first, ties as they come
        name_of = pairs.keys[order] // len(values)
        best = order[np.unique(name_of, return_index=True)[1]]  # per name (in key order), its first pair
        out[column] = np.asarray(values, dtype=object)[pairs.keys[best] % len(values)]
    out["idle_ns"] = out["in_model_ns"] + out["outside_model_ns"]
    out = out[out["idle_ns"] > 0].sort_values("idle_ns", ascending=False, kind="stable")
    if len(out) > MAX_ROWS:
        kept, rest = out.iloc[:MAX_ROWS - 1], out.iloc[MAX_ROWS - 1:]
        out = pd.concat([kept, pd.DataFrame({
            "source": ["range"], "in_model_ns": [int(rest["in_model_ns"].sum())],
            "outside_model_ns": [int(rest["outside_model_ns"].sum())], "user_line": [""], "user_function": [""],
            "outer_line": [""], "outer_function": [""], "idle_ns": [int(rest["idle_ns"].sum())]}, index=[REST])])
    out = out.astype({"in_model_ns": "int64", "outside_model_ns": "int64", "idle_ns": "int64"})
    steps = max(part.steps, 1)
    out["per_step_ns"] = out["idle_ns"] / steps
    out["share_of_host"] = f.ratio(out["idle_ns"], host.length)
    out["share_of_step"] = f.ratio(out["per_step_ns"], f.window_ns / steps)
    out.index.name = "key"
    return out
