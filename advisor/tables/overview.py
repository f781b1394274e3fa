"""Overview Summary: time per event type, overlaps of one type merged."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session.attribute import name_matches
from advisor.step.facts import MODEL_PHASES, Facts
from advisor.tables._registry import table, with_notes
from advisor.tables.userdefined import BOOKKEEPING, user_ranges


@table(
    "overview",
    title="Overview Summary",
    description=(
        "Time per event type inside the window. Events of one type that overlap (on several "
        "threads or streams) are merged before summing, so a type's time is the wall time "
        "during which at least one such event ran. Types nest (Operator contains CudaRuntime), "
        "so the ratios do not add up to 1. Host types have GPU time 0 and GPU types CPU time 0; "
        "GPU columns are NaN when the GPU was not measured."
    ),
    key="Event type: ProfileStep, Dataloader, Forward, Backward, Optimization, Operator, "
    "UserDefined, CudaRuntime, Kernel, Memcpy, Memset, Communication (those present)",
    columns={
        "calls": "Number of events of the type in the window.",
        "cpu_total_ns": "Merged host time of the type, ns.",
        "cpu_ratio": "cpu_total_ns / window (0..1).",
        "gpu_total_ns": "Merged GPU time of the type, ns (all devices together).",
        "gpu_ratio": "gpu_total_ns / window (0..1).",
    },
)
def overview_table(f: Facts) -> pd.DataFrame:
    phases = f.phases
    gpu_annotations = f.of_kind("gpu_annotation")
    gpu_annotations = gpu_annotations[~name_matches(gpu_annotations["name"], BOOKKEEPING)]

    def by_kind(*kinds: str) -> tuple[int, int]:
        return int(f.mask(*kinds).sum()), f.busy(*kinds).length

    def by_rows(frame: pd.DataFrame) -> tuple[int, int]:
        return len(frame), f.union_in_window(frame).length

    host_types = [("ProfileStep", by_kind("step"))]
    host_types += [(p, by_rows(phases[phases["phase_name"].to_numpy() == p])) for p in MODEL_PHASES]
    host_types += [("Operator", by_kind("op")), ("UserDefined", by_rows(user_ranges(f))),
                   ("CudaRuntime", by_kind("runtime", "driver"))]
    gpu_types = [("Kernel", by_kind("kernel")), ("Memcpy", by_kind("memcpy")), ("Memset", by_kind("memset"))]
    rows = {}
    for name, (calls, time) in host_types:
        if calls:
            gpu_ns = f.union_in_window(gpu_annotations).length if name == "UserDefined" else 0
            rows[name] = (calls, time, gpu_ns)
    for name, (calls, time) in gpu_types:
        if calls:
            rows[name] = (calls, 0, time)
    comm_gpu = f.gpu[f.comm_kernels]
    if len(f.comm_host) or len(comm_gpu):
        rows["Communication"] = (
            len(f.comm_host) + len(comm_gpu),
            f.union_in_window(f.comm_host).length,
            f.union_in_window(comm_gpu).length,
        )
    out = pd.DataFrame.from_dict(rows, orient="index", columns=["calls", "cpu_total_ns", "gpu_total_ns"])
    if not len(out):
        return out
    out["cpu_ratio"] = f.ratio(out["cpu_total_ns"], f.window_ns)
    if not f.gpu_measured:
        out["gpu_total_ns"] = np.nan
        with_notes(out, f.gpu_not_measured_note)
    out["gpu_ratio"] = f.ratio(out["gpu_total_ns"], f.window_ns)
    return out
