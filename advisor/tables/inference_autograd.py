"""Inference with autograd on: the autograd nodes a loop's forwards record for a backward
that never runs.

With grad mode on (torch's default), every differentiable operator whose inputs require
grad (a model's parameters do, in eval mode too) creates an autograd node and saves the
tensors its backward would need. A scoring, evaluation or serving loop that never calls
backward pays that bookkeeping in every forward, and keeps each output's activations
alive for as long as the output is.

torch.profiler records it: with grad mode on each operator carries autograd's sequence
number ("Sequence number" in a Kineto trace, the events' ``sequence``), which every node
created advances by one; under ``torch.no_grad()`` or ``torch.inference_mode()`` none is
recorded, and where no input requires grad the number does not move. So the nodes a
window made are, per thread, the last sequence number less the first. The table has one
row, 'forward with autograd', where the window's operators made nodes and no backward ran
(no ``autograd::engine::evaluate_function`` range, no Backward phase, no step timed with
one); empty otherwise. The rule autograd-in-inference reads it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.session import intervals as iv
from advisor.step.facts import Facts
from advisor.tables._registry import table
from advisor.tables.python_hotspots import phase_ns

ROW = "forward with autograd"
ENGINE = re.compile(r"^autograd::engine::evaluate_function")
COLUMNS = ["nodes", "nodes_per_step", "graded_ops_per_step", "forward_per_step_ns", "graded_per_step_ns",
           "probed_node_ns"]


def _backward_ran(f: Facts) -> bool:
    """Whether the profile shows any backward: an autograd function's range, a Backward
    phase, or a step the step clock timed with one."""
    names = f.events["name"]
    kinds = f.events["kind"]
    if bool(names[(kinds == "op").to_numpy()].astype(str).str.match(ENGINE).any()):
        return True
    if len(f.phase_intervals("Backward")):
        return True
    return any(float((step.phases or {}).get("Backward", 0) or 0) > 0 for step in f.meta.timed_steps)


@table(
    "inference_autograd",
    title="Inference With Autograd",
    description=(
        "Where a loop's forwards ran with grad mode on and nothing ran backward: the autograd nodes "
        "the window's operators created (per thread, the last autograd sequence number less the first, "
        "as torch.profiler records them), per step, and the time of the operators that ran with grad "
        "mode on. One row, 'forward with autograd'; empty where no node was made, where any backward "
        "ran, or where the profile records no sequence numbers."
    ),
    key="'forward with autograd'",
    columns={
        "nodes": "Autograd nodes the window's operators created.",
        "nodes_per_step": "nodes / the window's steps (per pass where the profile has no steps).",
        "graded_ops_per_step": "Top-level operators per step that ran with grad mode on (a sequence number).",
        "forward_per_step_ns": "The Forward phase's time per step from the step clock, ns (NaN without phases).",
        "graded_per_step_ns": "Host time per step of the top-level operators that ran with grad mode on, ns.",
        "probed_node_ns": "What one node cost a forward on this CPU, by a probe after the run (a chain of "
                          "multiplications with grad on and under inference_mode), ns; NaN where not probed "
                          "(a trace, or a run that ran backward).",
    },
)
def inference_autograd_table(f: Facts) -> pd.DataFrame | None:
    empty = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS}).rename_axis("key")
    ev = f.events
    if "sequence" not in ev.columns or not len(ev):
        return empty
    lo, hi = f.window
    start = ev["start_ns"].to_numpy()
    sequence = ev["sequence"].to_numpy()
    graded = (ev["kind"] == "op").to_numpy() & (sequence >= 0) & (start >= lo) & (start < hi)
    if not graded.any() or _backward_ran(f):
        return empty
    rows = ev[["pid", "tid", "sequence", "start_ns", "end_ns", "parent_op"]][graded]
    span = rows.groupby(["pid", "tid"], observed=True)["sequence"].agg(["min", "max"])
    nodes = float((span["max"] - span["min"]).sum())
    if nodes <= 0:
        return empty
    steps = len(f.steps) if f.has_steps else 1
    top = rows[rows["parent_op"].to_numpy() < 0]
    graded_ns = iv.union(iv.Intervals(top["start_ns"].to_numpy(), top["end_ns"].to_numpy())).length
    facts = f.meta.trace_metadata.get("advisor") if isinstance(f.meta.trace_metadata, dict) else None
    probed = facts.get("autograd_node_ns") if isinstance(facts, dict) else None
    row = {
        "nodes": nodes, "nodes_per_step": nodes / steps, "graded_ops_per_step": len(top) / steps,
        "forward_per_step_ns": phase_ns(f).get("Forward", np.nan), "graded_per_step_ns": graded_ns / steps,
        "probed_node_ns": float(probed) if isinstance(probed, (int, float)) and probed >= 0 else np.nan,
    }
    return pd.DataFrame([row], index=pd.Index([ROW], name="key"))[COLUMNS]
