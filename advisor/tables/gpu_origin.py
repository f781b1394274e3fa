"""GPU Work by Origin: which share of the GPU's time came from eager launches, CUDA graph
replays and compiled (Triton) kernels.

A kernel replayed from a CUDA graph carries the correlation id of the graph launch
(``cudaGraphLaunch``) that started it, so it is tied to that call like any other launch
and counted here, not left unattributed. torch.compile's kernels are Triton kernels,
named ``triton_...`` by Inductor (their names are kept as recorded). What launched the
rest tells eager work from copies and sets; GPU work whose launching call the profile
does not hold is "unattributed".
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.session.calls import GRAPH_LAUNCH
from advisor.step.facts import Facts
from advisor.tables._registry import table, with_notes

TRITON = re.compile(r"^triton_|^triton\.")
ROWS = ("eager kernels", "CUDA graph replays", "compiled (Triton) kernels", "copies and sets", "unattributed")


@table(
    "gpu_origin",
    title="GPU Work by Origin",
    description=(
        "GPU time in the window by what started it: kernels launched one by one (eager), "
        "kernels replayed from a CUDA graph (their launch is a cudaGraphLaunch), Triton "
        "kernels launched outside a graph (torch.compile without graphs), copies and sets, "
        "and work whose launching call is not in the profile. triton_ns counts the Triton "
        "kernels in each row (compiled code replayed from graphs included). Empty when the "
        "GPU was not measured."
    ),
    key=", ".join(ROWS),
    columns={
        "gpu_ns": "GPU time of this origin in the window (overlaps between streams counted once), ns.",
        "share_of_gpu": "gpu_ns / all GPU time (0..1).",
        "kernels": "kernels, copies or sets of this origin.",
        "triton_ns": "the part of gpu_ns in Triton kernels, ns.",
    },
)
def gpu_origin_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    gpu = f.gpu
    lo, hi = f.window
    inside = (gpu["end_ns"].to_numpy() > lo) & (gpu["start_ns"].to_numpy() < hi)
    starts, ends = gpu["start_ns"].to_numpy()[inside], gpu["end_ns"].to_numpy()[inside]
    names = f.events["name"]
    launch = gpu["launch"].to_numpy()[inside]
    launched = launch >= 0
    by_graph = np.zeros(len(launch), dtype=bool)
    if launched.any():
        by_graph[launched] = name_matches(names.iloc[launch[launched]].reset_index(drop=True), GRAPH_LAUNCH)
    kernel = (gpu["kind"] == "kernel").to_numpy()[inside]
    triton = kernel & name_matches(gpu["name"], TRITON)[inside]
    # Each event's origin as its position in ROWS (the first condition that holds wins).
    origin = np.select([by_graph, ~kernel & launched, ~launched, triton], [1, 3, 4, 2], default=0)
    rows = {}
    for code, name in enumerate(ROWS):
        mine = origin == code
        rows[name] = {"gpu_ns": iv.total_length(f.in_window_intervals((starts[mine], ends[mine]))),
                      "kernels": int(mine.sum()),
                      "triton_ns": iv.total_length(f.in_window_intervals((starts[mine & triton],
                                                                          ends[mine & triton])))}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["share_of_gpu"] = f.ratio(out["gpu_ns"], out["gpu_ns"].sum())
    out.index.name = "key"
    return out[["gpu_ns", "share_of_gpu", "kernels", "triton_ns"]]
