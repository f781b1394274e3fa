"""Distributed Summary: communication against computation on the GPU, and their overlap."""

from __future__ import annotations

import pandas as pd

from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step.facts import COMM_HOST, Facts
from advisor.tables._registry import table, with_notes


@table(
    "distributed",
    title="Distributed Summary",
    description=(
        "For jobs that communicate (NCCL kernels, c10d, nccl: or gloo: ranges, or distributed "
        "metadata): communication is the union of the NCCL kernels, computation the union of "
        "every other kernel, both inside the window; overlap is the time both ran. On a CPU "
        "job (gloo) communication is the union of gloo's gloo:* ranges on its own threads and "
        "computation the main thread's top-level operators. "
        "Communication not overlapped is the time collectives ran with no computation beside "
        "them, the part that overlap could still hide. Empty when there is no communication."
    ),
    key="ProfileStep, Communication, Computation, Overlap, Communication (not overlapped), "
    "Computation (not overlapped)",
    columns={
        "total_ns": "Time, ns (ProfileStep: the total step time, or the window without steps).",
        "ratio": "total_ns / the ProfileStep row (0..1).",
    },
)
def distributed_table(f: Facts) -> pd.DataFrame | None:
    gpu = f.gpu
    comm_kernels = gpu[f.comm_kernels]
    distributed = f.meta.distributed is not None and f.meta.distributed.world_size > 1
    if not (len(comm_kernels) or len(f.comm_host) or distributed):
        return None
    if f.gpu_measured and (len(comm_kernels) or not len(f.comm_work_host)):
        computation_kernels = gpu[(gpu["kind"] == "kernel").to_numpy() & ~f.comm_kernels]
        comm = f.union_in_window(comm_kernels)
        comp = f.union_in_window(computation_kernels)
    elif len(f.comm_work_host):
        # A CPU job: gloo works on its own threads while the main thread computes (or waits).
        ops = f.main_ops
        computation = ops[~name_matches(ops["name"], COMM_HOST)]
        comm = f.union_in_window(f.comm_work_host)
        comp = f.union_in_window(computation)
    else:
        return with_notes(None, f.gpu_not_measured_note + " (communication and overlap need GPU kernels)")
    totals = {
        "ProfileStep": f.step_total_ns,
        "Communication": comm.length,
        "Computation": comp.length,
        "Overlap": iv.intersection_length(comm, comp),
        "Communication (not overlapped)": iv.subtract(comm, comp).length,
        "Computation (not overlapped)": iv.subtract(comp, comm).length,
    }
    out = pd.DataFrame({"total_ns": pd.Series(totals, dtype="int64")})
    out["ratio"] = f.ratio(out["total_ns"], f.step_total_ns)
    return out
