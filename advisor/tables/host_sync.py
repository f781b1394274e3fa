"""Host Sync Summary: host calls that wait for the GPU, with the user's source line.

A call blocks the host when it copies synchronously (cudaMemcpy without Async), copies
asynchronously from or to pageable memory (the driver stages it synchronously), waits on a
stream, device or event, or pulls a tensor to the host (.item(), .cpu(), .tolist()). Where a
blocking CUDA call happens inside such an operator, the operator is the row (it is what the
user wrote) and the call is not counted again on its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.step.facts import Facts
from advisor.step.waits import DEVICE_SYNC, EVENT_SYNC, PAGEABLE_COPY, STREAM_SYNC, SYNC_COPY, TO_HOST, blocking_calls
from advisor.tables._registry import table

EXAMPLES = 5


@table(
    "host_sync",
    title="Host Sync Summary",
    description=(
        "Host calls that block until the GPU catches up: synchronous copies, async copies "
        "from/to pageable memory, stream/device/event synchronisation and tensor-to-host "
        "operators (.item(), .cpu(), .tolist()). A blocking CUDA call inside such an operator "
        "is counted under the operator only. Rows are per call and source line, the source "
        "being the innermost frame of the call stack outside torch and site-packages."
    ),
    key="'call @ file:line', or the call's name where no stack was recorded",
    columns={
        "name": "The blocking call or operator.",
        "reason": "Why it blocks: " + ", ".join(repr(r) for r in (SYNC_COPY, PAGEABLE_COPY, STREAM_SYNC, DEVICE_SYNC, EVENT_SYNC, TO_HOST)) + ".",
        "calls": "Calls in the window.",
        "host_total_ns": "Host time spent in them, ns.",
        "per_step_ns": "host_total_ns per step, ns (NaN without steps).",
        "share_of_step": "host_total_ns / total step time (the window without steps).",
        "source": "Innermost user frame 'file:line'; '' where no stack was recorded.",
        "example_event_ids": f"Up to {EXAMPLES} event ids of the longest calls, for the timeline.",
    },
)
def host_sync_table(f: Facts) -> pd.DataFrame | None:
    calls = blocking_calls(f)
    if not len(calls):
        return None
    calls = calls.assign(duration=calls["end_ns"] - calls["start_ns"])
    grouped = calls.groupby(["name", "reason", "source"], sort=True)
    out = grouped.agg(calls=("row", "size"), host_total_ns=("duration", "sum")).reset_index()
    longest = calls.sort_values(["duration", "row"], ascending=[False, True], kind="stable")
    examples = longest.groupby(["name", "reason", "source"], sort=True)["row"].agg(lambda r: [int(x) for x in r[:EXAMPLES]])
    out["example_event_ids"] = examples.to_numpy()
    n_steps = len(f.steps)
    out["per_step_ns"] = out["host_total_ns"] / n_steps if n_steps else np.nan
    out["share_of_step"] = f.ratio(out["host_total_ns"], f.step_total_ns)
    keys = np.where(out["source"] != "", out["name"] + " @ " + out["source"], out["name"])
    repeated = pd.Series(keys).duplicated(keep=False).to_numpy()
    keys = np.where(repeated, keys + " [" + out["reason"] + "]", keys)
    out.index = keys
    return out.sort_values("host_total_ns", ascending=False, kind="stable")
