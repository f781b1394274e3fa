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

from advisor.step.facts import Facts, Groups
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
    duration = (calls["end_ns"] - calls["start_ns"]).to_numpy()
    row = calls["row"].to_numpy()
    # Grouped by (name, reason, source), sorted: each text's sorted code, combined.
    group = np.zeros(len(calls), dtype=np.int64)
    for column in ("name", "reason", "source"):
        codes, labels = pd.factorize(calls[column].to_numpy(), sort=True)
        group = group * len(labels) + codes
    groups = Groups(group)
    first = groups.first(np.arange(len(calls)))
    out = pd.DataFrame({column: calls[column].to_numpy()[first] for column in ("name", "reason", "source")})
    out["calls"] = groups.size()
    out["host_total_ns"] = groups.sum(duration)
    # Each group's longest calls (ties: the earlier event), up to EXAMPLES.
    at = np.searchsorted(groups.keys, group)
    longest = np.lexsort((row, -duration, at))  # by group, then longest first
    starts = np.searchsorted(at[longest], np.arange(len(out)))
    out["example_event_ids"] = pd.Series(
        [[int(r) for r in row[longest[a:b]][:EXAMPLES]] for a, b in zip(starts, [*starts[1:], len(longest)])],
        dtype=object)
    n_steps = len(f.steps)
    out["per_step_ns"] = out["host_total_ns"] / n_steps if n_steps else np.nan
    out["share_of_step"] = f.ratio(out["host_total_ns"], f.step_total_ns)
    keys = np.where(out["source"] != "", out["name"] + " @ " + out["source"], out["name"])
    repeated = pd.Series(keys).duplicated(keep=False).to_numpy()
    keys = np.where(repeated, keys + " [" + out["reason"] + "]", keys)
    out.index = keys
    return out.sort_values("host_total_ns", ascending=False, kind="stable")
