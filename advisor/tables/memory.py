"""Memory Manipulation Summary: GPU copies and sets, with the host calls that issued them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step.facts import Facts, coded, decode, most_common, stats
from advisor.step.waits import SYNC_COPY_CALL, pageable
from advisor.tables._registry import table


@table(
    "memory",
    title="Memory Manipulation Summary",
    description=(
        "One row per copy or set name (e.g. 'Memcpy HtoD (Pageable -> Device)'). Bandwidth is "
        "bytes over GPU time. A row is host-blocking when any of its copies was issued by a "
        "synchronous call (cudaMemcpy without Async) or touches pageable host memory, which "
        "makes the host wait for the copy. Empty when the GPU was not measured."
    ),
    key="The copy or set name as recorded",
    columns={
        "calls": "Copies or sets in the window.",
        "gpu_total_ns": "Sum of durations on the GPU, ns.",
        "gpu_avg_ns": "Mean duration, ns.",
        "gpu_max_ns": "Longest, ns.",
        "gpu_min_ns": "Shortest, ns.",
        "gpu_ratio": "gpu_total_ns / window.",
        "bytes_total": "Bytes moved or set, where recorded; NaN otherwise.",
        "bandwidth_gbps": "bytes_total / gpu_total_ns, GB/s.",
        "copy_kind": "HtoD, DtoH, DtoD, HtoH, PtoP; '' for sets.",
        "src_memory": "Pageable, Pinned, Device, Managed; '' where unknown.",
        "dst_memory": "As src_memory.",
        "launch_api": "Most common host call that issued them (cudaMemcpyAsync...).",
        "cpu_total_ns": "Host time of those issuing calls, ns.",
        "host_blocking": "True when the host waits for these copies (see the description).",
    },
)
def memory_table(f: Facts) -> pd.DataFrame | None:
    gpu = f.gpu
    moves = gpu[gpu["kind"].isin(("memcpy", "memset")).to_numpy()]
    if not len(moves):
        return None
    names, labels = coded(moves["name"])
    out = stats(names, (moves["end_ns"] - moves["start_ns"]).to_numpy(), prefix="gpu")
    out["gpu_ratio"] = f.ratio(out["gpu_total_ns"], f.window_ns)
    nbytes = moves["bytes"].to_numpy()
    known = nbytes >= 0
    out["bytes_total"] = pd.Series(nbytes[known]).groupby(names[known], sort=True).sum().reindex(out.index)
    out["bandwidth_gbps"] = f.ratio(out["bytes_total"], out["gpu_total_ns"])  # bytes/ns = GB/s
    for column in ("copy_kind", "src_memory", "dst_memory"):
        values, value_labels = coded(moves[column])
        out[column] = decode(most_common(names, values, missing=-1).reindex(out.index), value_labels)

    launch = moves["launch"].to_numpy()
    linked = launch >= 0
    name_codes, name_labels = f.name_codes
    api = most_common(names[linked], name_codes[launch[linked]], missing=-1)
    out["launch_api"] = decode(api.reindex(out.index), name_labels)
    # One call can issue several copies: count each call's time once.
    calls = pd.DataFrame({"name": names[linked], "call": launch[linked]}).drop_duplicates()
    ev = f.events
    call_time = (ev["end_ns"] - ev["start_ns"]).to_numpy()[calls["call"].to_numpy()]
    per_name = pd.Series(call_time).groupby(calls["name"].to_numpy(), sort=True).sum()
    out["cpu_total_ns"] = per_name.reindex(out.index).fillna(0).astype("int64")

    blocking = pageable(moves)
    sync_api = np.flatnonzero([bool(SYNC_COPY_CALL.search(str(n))) for n in name_labels])
    blocking[linked] |= np.isin(name_codes[launch[linked]], sync_api)
    out["host_blocking"] = pd.Series(blocking).groupby(names, sort=True).any().reindex(out.index).fillna(False).astype(bool)
    out.index = decode(out.index.to_numpy(), labels)
    return out.sort_values("gpu_total_ns", ascending=False, kind="stable")
