"""The host's waits on the device: every host call that blocks until the GPU catches up,
with the user's source line.

A call blocks the host when it copies synchronously (cudaMemcpy without Async), copies
asynchronously from or to pageable memory (the driver stages it synchronously), waits on a
stream, device or event, or pulls a tensor to the host (.item(), .cpu(), .tolist()). Where a
blocking CUDA call happens inside such an operator, the operator is the wait (it is what the
user wrote) and the call is not counted again on its own. The step model's idle partition
and dependency graph read these waits, and so does the host_sync table.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.session import calls, select_rows
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step.facts import Facts, Groups, ancestors, coded, user_frame

__all__ = ["CALL_REASONS", "DEVICE_SYNC", "EVENT_SYNC", "ITEM_OPS", "PAGEABLE_COPY", "REASON_ORDER", "STREAM_SYNC",
           "SYNC_COPY", "SYNC_COPY_CALL", "TO_HOST", "TO_HOST_OPS", "blocking_calls", "pageable", "source_lines"]

SYNC_COPY = "synchronous copy"
PAGEABLE_COPY = "pageable async copy"
STREAM_SYNC = "stream synchronize"
DEVICE_SYNC = "device synchronize"
EVENT_SYNC = "event synchronize"
TO_HOST = "tensor to host (.item()/.cpu()/.tolist(), or a tensor used as a Python bool or number)"

CALL_REASONS = (
    (calls.SYNC_COPY, SYNC_COPY),
    (calls.STREAM_SYNC, STREAM_SYNC),
    (calls.DEVICE_SYNC, DEVICE_SYNC),
    (calls.EVENT_SYNC, EVENT_SYNC),
)
SYNC_COPY_CALL = CALL_REASONS[0][0]
# When an operator absorbs several blocking calls, the first of these names it.
REASON_ORDER = (PAGEABLE_COPY, SYNC_COPY, STREAM_SYNC, EVENT_SYNC, DEVICE_SYNC)
# .item() always waits; the copies (.cpu(), .to("cpu"), .tolist()) wait when a blocking
# call happens inside them.
ITEM_OPS = ("aten::item", "aten::_local_scalar_dense")
# torch.cuda.synchronize(), and a stream's or an event's synchronize(), as the Python frames
# a trace with stacks records them: waits, also where the trace holds no runtime call inside
# them (a tracer may leave the call out; the frame alone then says the host waited).
SYNC_FRAMES = (
    (re.compile(r"^torch/cuda/__init__\.py\(\d+\): synchronize$|^<built-in method _cuda_synchronize "), DEVICE_SYNC),
    (re.compile(r"^<built-in method synchronize of .*Event|^torch/cuda/streams\.py\(\d+\): (synchronize|wait)$"),
     EVENT_SYNC),
    (re.compile(r"^<built-in method synchronize "), STREAM_SYNC),
)
TO_HOST_OPS = ITEM_OPS + ("aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::tolist", "aten::numpy")


def pageable(frame: pd.DataFrame) -> np.ndarray:
    """Copies whose source or destination is pageable host memory."""
    return ((frame["src_memory"] == "Pageable") | (frame["dst_memory"] == "Pageable")).to_numpy() & (
        frame["kind"] == "memcpy"
    ).to_numpy()


def source_lines(f: Facts, rows: np.ndarray) -> np.ndarray:
    """The user's source line "file:line" for each event row, from its own call stack or
    the nearest enclosing operator's; "" where none is recorded. (ancestors() is given the
    rows themselves, so the walk looks at each row before its parents.)"""
    codes, frames = f.memo("user_frames", lambda: _user_frames(f))
    found = np.full(len(rows), -1, dtype=np.int64)
    for where, anc in ancestors(f.parents, np.asarray(rows)):
        todo = found[where] < 0
        where, anc = where[todo], anc[todo]
        named = frames[codes[anc]] != ""
        found[where[named]] = codes[anc[named]]
        if not len(where):
            break
    return frames[found]


def _user_frames(f: Facts) -> tuple[np.ndarray, np.ndarray]:
    """Each event's call-stack code, and the user's frame of each distinct stack (the last
    slot, for code -1, blank): worked out once per session, not once per question."""
    codes, labels = coded(f.events["call_stack"])
    return codes, np.array([user_frame(c) for c in labels] + [""], dtype=object)


def blocking_calls(f: Facts) -> pd.DataFrame:
    """The blocking host events of the window: row id, name, reason, start_ns, end_ns, source."""
    return f.memo("blocking_calls", lambda: _blocking_calls(f))


def _blocking_calls(f: Facts) -> pd.DataFrame:
    ev = f.events
    # The calls' three columns this reads, not a frame of every column (of_kind), which
    # the facts would hold through the other tables.
    calls = select_rows(ev[["id", "name", "parent_op"]], f.mask("runtime", "driver"))
    reason = np.full(len(calls), "", dtype=object)
    for pattern, why in CALL_REASONS:
        reason[(reason == "") & name_matches(calls["name"], pattern)] = why
    gpu = f.gpu
    staged = gpu["launch"].to_numpy()[pageable(gpu) & (gpu["launch"].to_numpy() >= 0)]
    reason[(reason == "") & np.isin(calls["id"].to_numpy(), staged)] = PAGEABLE_COPY
    blocking = calls[reason != ""]
    reason = reason[reason != ""]

    # The outermost to-host operator around each blocking call absorbs it: the operator is
    # what the user wrote. It is a tensor-to-host wait when it is .item() or copies device
    # to host; otherwise (.to("cuda") from pageable memory) it keeps its calls' reason.
    is_to_host = np.zeros(len(ev), dtype=bool)
    ops = f.ops
    to_host_ops = ops[ops["name"].isin(TO_HOST_OPS).to_numpy()]
    is_to_host[to_host_ops["id"].to_numpy()] = True
    absorber = np.full(len(blocking), -1, dtype=np.int64)
    for where, anc in ancestors(f.parents, blocking["parent_op"].to_numpy()):
        hit = is_to_host[anc]
        absorber[where[hit]] = anc[hit]
    taken = absorber >= 0
    downloads = gpu["launch"].to_numpy()[(gpu["copy_kind"] == "DtoH").to_numpy()]
    by_op = Groups(absorber[taken])
    order = {r: i for i, r in enumerate(REASON_ORDER)}
    rank = pd.Series(reason[taken], dtype=object).map(order).to_numpy(dtype=np.int64)
    op_ids = by_op.keys.astype(np.int64)
    op_reason = np.asarray(REASON_ORDER, dtype=object)[by_op.min(rank)]
    to_host = by_op.any(np.isin(blocking["id"].to_numpy()[taken], downloads)) | np.isin(f.names_of(op_ids), ITEM_OPS)
    op_reason[to_host] = TO_HOST
    if not (ev["kind"].isin(("runtime", "driver"))).any():
        # No CUDA calls recorded: .item() is taken at its word (its inner
        # _local_scalar_dense is the same wait, so only the outer one counts).
        # Only calls made from the user's own code count: an optimizer reading its CPU step
        # counter with .item() is no wait the user can remove.
        # Nor do calls made while loading data: a Dataset reads CPU tensors, on a GPU run too
        # (where a GPU tensor's read would show its CUDA calls, and not come here).
        items = to_host_ops[to_host_ops["name"].isin(ITEM_OPS).to_numpy()]
        parent = items["parent_op"].to_numpy()
        inner = (parent >= 0) & is_to_host[np.maximum(parent, 0)]
        users = source_lines(f, items["id"].to_numpy()) != ""
        loading = iv.covers(f.phase_intervals("Dataloader"), items["start_ns"].to_numpy())
        keep = ~inner & users & ~loading
        op_ids = np.concatenate([op_ids, items["id"].to_numpy()[keep]])
        op_reason = np.concatenate([op_reason, np.full(int(keep.sum()), TO_HOST, dtype=object)])

    rows = np.concatenate([blocking["id"].to_numpy()[~taken], op_ids]).astype(np.int64)
    reasons = np.concatenate([reason[~taken], op_reason])
    frames, frame_reasons = _sync_frames(f, rows)
    rows = np.concatenate([rows, frames]).astype(np.int64)
    out = pd.DataFrame(
        {
            "row": rows,
            "name": f.names_of(rows),
            "reason": np.concatenate([reasons, frame_reasons]),
            "start_ns": ev["start_ns"].to_numpy()[rows],
            "end_ns": ev["end_ns"].to_numpy()[rows],
        }
    )
    out["source"] = source_lines(f, rows)
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _sync_frames(f: Facts, waits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The outermost synchronize frames (SYNC_FRAMES) that hold none of the ``waits``
    already found (a runtime call inside one is the same wait, counted once): their rows
    and reasons."""
    ev = f.events
    python = f.mask("python")
    reason = np.full(len(ev), "", dtype=object)
    for pattern, why in SYNC_FRAMES:
        reason[(reason == "") & python & name_matches(ev["name"], pattern)] = why
    rows = np.flatnonzero(reason != "")
    if not len(rows):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    order = np.lexsort((-(end[rows] - start[rows]), start[rows]))
    rows = rows[order]
    reach = np.maximum.accumulate(end[rows])
    inner = np.zeros(len(rows), dtype=bool)
    inner[1:] = start[rows][1:] < reach[:-1]
    rows = rows[~inner]
    known = iv.union((start[waits], end[waits])) if len(waits) else iv.EMPTY
    held = np.array([iv.intersection_length(known, ([start[r]], [end[r]])) > 0 for r in rows], dtype=bool)
    rows = rows[~held]
    return rows, reason[rows]
