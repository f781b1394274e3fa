"""Optimizer calls: what each optimizer's step and zero_grad cost per step, and how they
are implemented.

torch.optim wraps every ``step()`` in an ``Optimizer.step#<Class>.step`` range and every
``zero_grad()`` in ``Optimizer.zero_grad#<Class>.zero_grad``. Inside them, the operators
tell the implementation apart: a single-tensor step runs a handful of ops per parameter
(``aten::add_``, ``aten::mul_`` ...), a foreach step a handful per list
(``aten::_foreach_*``), a fused one a single op (``aten::_fused_*``); a zero_grad that
sets gradients to zero runs ``aten::zero_`` per parameter, one that sets them to None
runs nothing. The rules optimizer-not-fused and grad-zeroing-memsets read this table.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.knowledge.costs._model import Args, Uncostable
from advisor.session import GPU_KINDS, one_of
from advisor.session import intervals as iv
from advisor.session.attribute import name_matches
from advisor.step.facts import Facts
from advisor.tables._registry import table

OPTIMIZER_RANGE = re.compile(r"^Optimizer\.(?P<call>step|zero_grad)#(?P<owner>.+)$")
# A tensor of this size or more does not stay in a CPU's caches between an optimizer's
# passes over it (benchmarks/cpu_fused_optimizer.py's size sweep: Adam's fused step kept
# 0.31 of the default's time on a 16 MiB parameter, 0.16 on a 32 MiB one, on a 36 MB L3).
LARGE_TENSOR_BYTES = 32 << 20


def _implementation(call: str, names: pd.Series) -> str:
    if call == "zero_grad":
        return "zero_" if (names == "aten::zero_").any() else ("set_to_none" if not len(names) else "other")
    if names.str.startswith("aten::_fused_").any():
        return "fused"
    if names.str.startswith("aten::_foreach_").any():
        return "foreach"
    return "single-tensor" if len(names) else "none"


@table(
    "optimizer",
    title="Optimizer Calls",
    description=(
        "Each optimizer's step() and zero_grad() as torch.optim records them (Optimizer.step#... "
        "and Optimizer.zero_grad#... ranges on the main thread): host time, the operators run at "
        "their top level and the part of the host time they cover, the GPU work they launched "
        "and the GPU's idle time while they ran, and the implementation the operators show "
        "(single-tensor, foreach, fused; zero_ or set_to_none). Per step means over the "
        "profiled steps; empty when no such range was recorded."
    ),
    key="the range's name, e.g. Optimizer.step#SGD.step",
    columns={
        "call": "step or zero_grad.",
        "implementation": "step: single-tensor, foreach or fused; zero_grad: zero_ (gradients zeroed) or "
                          "set_to_none (no operator).",
        "calls_per_step": "calls of this range per step.",
        "host_per_step_ns": "the ranges' host time per step, ns.",
        "ops_per_step": "operators at the top level inside the ranges, per step.",
        "op_names": "the distinct top-level operator names, most frequent first (at most 6).",
        "distinct_ops": "how many distinct top-level operator names there are.",
        "op_host_per_step_ns": "host time the top-level operators cover, per step, ns.",
        "zero_ops_per_step": "aten::zero_ calls per step (not those inside aten::zeros).",
        "kernels_per_step": "GPU kernels, copies and sets the operators launched, per step (NaN if the GPU "
                            "was not measured).",
        "gpu_per_step_ns": "GPU time of that work per step, ns (NaN if the GPU was not measured).",
        "gpu_idle_per_step_ns": "GPU idle time while the ranges ran, per step, ns (NaN if the GPU was not "
                                "measured).",
        "large_op_share": "the share of the operators' host time spent on tensors of 32 MiB or more (their first "
                          "input; larger than a CPU's caches hold between passes), NaN where no shapes were "
                          "recorded.",
    },
)
def optimizer_table(f: Facts) -> pd.DataFrame:
    ev = f.events
    columns = ["call", "implementation", "calls_per_step", "host_per_step_ns", "ops_per_step", "op_names",
               "distinct_ops", "op_host_per_step_ns", "zero_ops_per_step", "kernels_per_step", "gpu_per_step_ns",
               "gpu_idle_per_step_ns", "large_op_share"]
    empty = pd.DataFrame({c: pd.Series(dtype="object" if c in ("call", "implementation", "op_names") else "float64")
                          for c in columns}).rename_axis("key")
    main = f.main_thread
    if main is None or f.window_ns <= 0:
        return empty
    lo, hi = f.window
    on_main = (ev["pid"].to_numpy() == main[0]) & (ev["tid"].to_numpy() == main[1])
    inside_window = (ev["start_ns"].to_numpy() >= lo) & (ev["start_ns"].to_numpy() < hi)
    # The pattern is anchored: searched once per distinct name, not once per row.
    named = name_matches(ev["name"], OPTIMIZER_RANGE)
    ranges = ev[on_main & inside_window & one_of(ev["kind"], ["annotation"]) & named]
    if not len(ranges):
        return empty
    steps = max(len(f.steps), 1)
    ops = f.main_ops
    op_starts = ops["start_ns"].to_numpy()
    # The GPU rows' launch and times only, not a frame of every GPU event (hundreds of MB
    # on a large trace).
    is_gpu = one_of(ev["kind"], GPU_KINDS)
    gpu_launch = ev["launch"].to_numpy()[is_gpu]
    gpu_took = (ev["end_ns"].to_numpy() - ev["start_ns"].to_numpy())[is_gpu]
    tops = ev["top_op"].to_numpy()
    idle = _gpu_idle(f) if f.gpu_measured else None
    rows = {}
    for name, group in ranges.groupby(ranges["name"].astype(str), sort=False):
        call = OPTIMIZER_RANGE.match(name)["call"]
        spans = iv.union(iv.as_intervals(group))
        # Top-level ops that start inside one of the ranges.
        inside = iv.covers(spans, op_starts)
        mine = ops[inside]
        op_names = mine["name"].astype(str)
        counts = op_names.value_counts()
        zero = op_names == "aten::zero_"
        row = {
            "call": call,
            "implementation": _implementation(call, op_names),
            "calls_per_step": len(group) / steps,
            "host_per_step_ns": spans.length / steps,
            "ops_per_step": len(mine) / steps,
            "op_names": ", ".join(counts.index[:6]),
            "distinct_ops": float(len(counts)),
            "op_host_per_step_ns": iv.total_length(iv.as_intervals(mine)) / steps,
            "zero_ops_per_step": float(zero.sum()) / steps,
            "kernels_per_step": np.nan, "gpu_per_step_ns": np.nan, "gpu_idle_per_step_ns": np.nan,
            "large_op_share": _large_share(mine) if call == "step" else np.nan,
        }
        if f.gpu_measured:
            # GPU work launched from inside these ops: the launching call's top op is one of them.
            launched = gpu_launch >= 0
            owners = np.full(len(gpu_launch), -1, dtype=np.int64)
            owners[launched] = tops[gpu_launch[launched]]
            work = np.isin(owners, mine.index.to_numpy())
            row["kernels_per_step"] = int(work.sum()) / steps
            row["gpu_per_step_ns"] = float(gpu_took[work].sum()) / steps
            row["gpu_idle_per_step_ns"] = iv.intersection_length(idle, spans) / steps
        rows[name] = row
    out = pd.DataFrame.from_dict(rows, orient="index")[columns]
    out.index.name = "key"
    return out


def _large_share(ops: pd.DataFrame) -> float:
    """The share of ``ops``' time spent on a first input of LARGE_TENSOR_BYTES or more; NaN
    where none of them has recorded shapes."""
    took = (ops["end_ns"] - ops["start_ns"]).to_numpy(dtype=np.float64)
    large = np.zeros(len(ops), dtype=bool)
    shaped = False
    # One parse per distinct shape: a step repeats the same few per parameter.
    for (dims, types), rows in ops.groupby(["input_dims", "input_types"], sort=False, dropna=True).indices.items():
        if not dims:
            continue
        try:
            first = Args(dims, types).tensor(0)
        except Uncostable:
            continue
        shaped = True
        large[rows] = first.numel * first.itemsize >= LARGE_TENSOR_BYTES
    total = took.sum()
    return float(took[large].sum() / total) if shaped and total > 0 else np.nan


def _gpu_idle(f: Facts) -> iv.Intervals:
    """The window's GPU idle time."""
    lo, hi = f.window
    return iv.subtract(([lo], [hi]), f.busy(*GPU_KINDS))
