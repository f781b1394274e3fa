"""Fresh host tensors copied to the GPU: a tensor made on the host (torch.randn, torch.zeros,
torch.arange, torch.tensor(list) ...) by the operator right before a copy to the device.

``torch.randn(n).cuda()`` is two operators on the main thread, one after the other: the
generator (``aten::randn``) fills a tensor in host memory, then ``aten::to`` copies it,
from pageable memory, host to device. Made with ``device=`` the same tensor costs one
kernel and no copy. ``torch.tensor(values).to(device)`` shows as ``aten::lift_fresh``
(and ``aten::detach_``) before the copy: data from Python, which must cross once, but
not every step if the values do not change. Copies inside the Dataloader phase (the
batch) are left out. The rule cpu-tensor-copied-each-step reads this table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.session import text
from advisor.step.facts import Facts
from advisor.step.waits import source_lines
from advisor.tables._registry import table, with_notes

# Operators that make a new tensor from nothing but their arguments: on the device they
# would be one kernel (or none) and no copy. Not aten::empty: batches rebuilt from a
# loader worker's shared memory start with one.
GENERATORS = frozenset({
    "aten::randn", "aten::rand", "aten::randint", "aten::randperm", "aten::normal", "aten::bernoulli",
    "aten::zeros", "aten::ones", "aten::full", "aten::arange", "aten::linspace", "aten::logspace", "aten::eye",
    "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::rand_like",
    "aten::randn_like", "aten::scalar_tensor", "aten::tril", "aten::triu",
})
# torch.tensor(values) / torch.as_tensor(values): data from Python.
FROM_PYTHON = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy"})
# The copy follows the making operator directly: at most this much host time between them.
MAX_GAP_NS = 2_000_000
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::cuda"})


@table(
    "fresh_copies",
    title="Fresh Host Tensors Copied to the GPU",
    description=(
        "Copies to the device (aten::to and friends that launched a host-to-device copy) whose "
        "operand the main thread made on the host by the operator right before: a generator "
        "(randn, zeros, arange, full ...: made_from generated) or Python data (torch.tensor, "
        "torch.as_tensor: made_from python). Outside the Dataloader phase; grouped by the "
        "making operator, the copy operator and the user's source line. Empty when the GPU "
        "was not measured."
    ),
    key="made_by -> copy_op @ file:line (without the line where no stack was recorded)",
    columns={
        "made_by": "the operator that made the host tensor.",
        "made_from": "generated (could be made on the device) or python (data from Python values).",
        "copy_op": "the operator that copied it to the device.",
        "calls": "how many such copies in the window.",
        "calls_per_step": "calls per step (NaN without steps).",
        "bytes_per_step": "bytes copied per step (NaN without steps).",
        "host_per_step_ns": "host time of the making and the copying operators per step, ns.",
        "copy_per_step_ns": "GPU time of the copies per step, ns.",
        "pageable": "whether any of the copies read pageable host memory (the host then waits).",
        "source": "the user's line that made the copy, file:line ('' where no stack was recorded).",
        "example_event": "the row id of one copying operator.",
    },
)
def fresh_copies_table(f: Facts) -> pd.DataFrame | None:
    if not f.gpu_measured:
        return with_notes(None, f.gpu_not_measured_note)
    columns = ["made_by", "made_from", "copy_op", "calls", "calls_per_step", "bytes_per_step", "host_per_step_ns",
               "copy_per_step_ns", "pageable", "source", "example_event"]
    empty = pd.DataFrame({c: pd.Series(dtype="object") for c in columns}).rename_axis("key")
    ev = f.events
    gpu = f.gpu
    uploads = gpu[(gpu["kind"] == "memcpy").to_numpy() & (gpu["copy_kind"] == "HtoD").to_numpy()
                  & (gpu["top_op"].to_numpy() >= 0)]
    if f.main_thread is None or not len(uploads) or f.window_ns <= 0:
        return empty
    lo, hi = f.window
    top = f.main_ops
    names = text(top["name"])
    ids = top.index.to_numpy()
    starts_top, ends_top = top["start_ns"].to_numpy(), top["end_ns"].to_numpy()
    copying = np.isin(ids, uploads["top_op"].to_numpy()) & np.isin(names, list(COPY_OPS))
    copying &= (top["start_ns"].to_numpy() >= lo) & (top["start_ns"].to_numpy() < hi)
    copying &= (text(top["phase"]) != "Dataloader")
    rows = []
    for i in np.flatnonzero(copying):
        j = i - 1
        # torch.tensor(values) ends in aten::detach_ after its aten::lift_fresh.
        if j >= 1 and names[j] == "aten::detach_" and names[j - 1] in FROM_PYTHON:
            j -= 1
        if j < 0 or (names[j] not in GENERATORS and names[j] not in FROM_PYTHON):
            continue
        if starts_top[i] - ends_top[j] > MAX_GAP_NS:  # made elsewhere, not for this copy
            continue
        rows.append((ids[j], ids[i], names[j], "generated" if names[j] in GENERATORS else "python", names[i]))
    if not rows:
        return empty
    found = pd.DataFrame(rows, columns=["maker", "copy", "made_by", "made_from", "copy_op"])
    starts, ends = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    found["host_ns"] = (ends[found["maker"]] - starts[found["maker"]]) + (ends[found["copy"]] - starts[found["copy"]])
    mine = uploads[uploads["top_op"].isin(found["copy"])]
    per_copy = pd.DataFrame({
        "copy": mine["top_op"].to_numpy(),
        "bytes": pd.to_numeric(mine["bytes"], errors="coerce").fillna(0).to_numpy(),
        "gpu_ns": (mine["end_ns"] - mine["start_ns"]).to_numpy(),
        "pageable": (mine["src_memory"] == "Pageable").to_numpy(),
    }).groupby("copy").agg(bytes=("bytes", "sum"), gpu_ns=("gpu_ns", "sum"), pageable=("pageable", "any"))
    found = found.join(per_copy, on="copy")
    found["source"] = source_lines(f, found["copy"].to_numpy())
    found["key"] = (found["made_by"] + " -> " + found["copy_op"]
                    + np.where(found["source"] != "", " @ " + found["source"], ""))
    steps = len(f.steps) if f.has_steps else 0
    out = found.groupby("key", sort=False).agg(
        made_by=("made_by", "first"), made_from=("made_from", "first"), copy_op=("copy_op", "first"),
        calls=("copy", "size"), bytes=("bytes", "sum"), host_ns=("host_ns", "sum"), gpu_ns=("gpu_ns", "sum"),
        pageable=("pageable", "any"), source=("source", "first"), example_event=("copy", "first"))
    per = (lambda column: out[column] / steps) if steps else (lambda column: np.nan)
    out["calls_per_step"] = per("calls")
    out["bytes_per_step"] = per("bytes")
    out["host_per_step_ns"] = per("host_ns")
    out["copy_per_step_ns"] = per("gpu_ns")
    out = out.sort_values("host_ns", ascending=False, kind="stable")
    out.index.name = "key"
    return out[columns]
