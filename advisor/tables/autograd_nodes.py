"""Autograd Nodes: the backward work of each kind of autograd node, and where the forward
operators that made those nodes ran.

Every differentiable operator a step runs with grad on leaves a node (``MulBackward0``
for ``aten::mul``) that ``loss.backward()`` runs, each in an
``autograd::engine::evaluate_function`` range. A loss or a metric written as a Python
loop over the batch makes a node per item for each operator in the loop: on a CPU their
backward can cost as much as the loop itself, and it is spent inside the Backward phase,
where nothing says it came from the loop. This table puts each kind of node beside the
forward operator of its name (``LogSoftmaxBackward0`` and ``aten::_log_softmax``), counted
inside the model's Forward phase and outside the model's phases: the nodes of an operator
that ran only outside the model (a per-item loss loop) are that work's backward. The
rule host-bound reads it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.step.facts import MODEL_PHASES, Facts, coded
from advisor.tables._registry import table

NODE = re.compile(r"^autograd::engine::evaluate_function: (\w+?)Backward\d*$")
COLUMNS = ["calls_per_step", "ns_per_step", "forward_op", "outside_calls_per_step", "model_calls_per_step",
           "outside_share"]
FORWARD = "Forward"


def _base(name: str) -> str:
    """An operator's or a node's name reduced to what both share: 'aten::_log_softmax' and
    'LogSoftmax' are both 'logsoftmax'."""
    return name.rpartition("::")[2].replace("_", "").lower()


@table(
    "autograd_nodes",
    title="Autograd Nodes",
    description=(
        "One row per kind of autograd node backward ran (its autograd::engine::evaluate_function "
        "ranges), most host time first: how many a step and their host time, and the forward "
        "operator of the same name (aten::mul for MulBackward0) counted where it ran: inside the "
        "model's Forward phase, or outside every model phase (the script's own code between them: a "
        "loss written as a loop over the batch). Empty where the profile has no nodes or no steps."
    ),
    key="The node's name ('MulBackward0')",
    columns={
        "calls_per_step": "Nodes of this kind run per step.",
        "ns_per_step": "Their host time per step (the evaluate_function ranges, as recorded), ns.",
        "forward_op": "The forward operator of the node's name, as the profile names it ('' where none ran).",
        "outside_calls_per_step": "Calls of that operator per step outside the model's phases.",
        "model_calls_per_step": "Calls of it per step inside the Forward phase.",
        "outside_share": "outside_calls_per_step / (outside + model): the share of these nodes the work outside "
                         "the model made (NaN where the operator ran in neither).",
    },
)
def autograd_nodes_table(f: Facts) -> pd.DataFrame | None:
    empty = pd.DataFrame({c: pd.Series(dtype="object" if c == "forward_op" else "float64") for c in COLUMNS})
    empty = empty.rename_axis("key")
    steps = len(f.steps) if f.has_steps else 0
    ev = f.events
    if not steps or not len(ev):
        return empty
    lo, hi = f.window
    start = ev["start_ns"].to_numpy()
    # Only the columns read, taken once: a profile's events have dozens.
    ops = ev[["name", "phase", "start_ns", "end_ns"]][(ev["kind"] == "op").to_numpy() & (start >= lo) & (start < hi)]
    if not len(ops):
        return empty
    # By name code (a profile has thousands of calls of a few dozen names); code -1 ("")
    # lands on a last slot of its own.
    codes, names = coded(ops["name"])
    codes = np.where(codes < 0, len(names), codes)
    matched = [NODE.match(str(name)) for name in names]
    nodes = np.flatnonzero([m is not None for m in matched])
    if not len(nodes):
        return empty
    bases = [_base(m.group(1)) if m is not None else _base(str(name)) for m, name in zip(matched, names)]
    slots = len(names) + 1
    took = (ops["end_ns"] - ops["start_ns"]).to_numpy(dtype=np.float64)
    calls = np.bincount(codes, minlength=slots)
    ns = np.bincount(codes, weights=took, minlength=slots)
    # The forward operators, by phase: inside Forward, or outside every model phase.
    phase_codes, phases = coded(ops["phase"])
    where = np.array(["model" if p == FORWARD else "" if p in MODEL_PHASES else "outside" for p in phases]
                     + ["outside"], dtype=object)[phase_codes]
    model = np.bincount(codes[where == "model"], minlength=slots)
    outside = np.bincount(codes[where == "outside"], minlength=slots)
    is_node = np.zeros(slots, dtype=bool)
    is_node[nodes] = True
    rows = {}
    for i in sorted(nodes, key=lambda i: -ns[i]):
        # An operator and the one it calls can share a base (log_softmax and
        # _log_softmax): the larger count stands for the nodes, not their sum.
        ops_of = [j for j, base in enumerate(bases) if base == bases[i] and not is_node[j] and model[j] + outside[j]]
        out_n = float(max((outside[j] for j in ops_of), default=0))
        model_n = float(max((model[j] for j in ops_of), default=0))
        op = str(names[max(ops_of, key=lambda j: model[j] + outside[j])]) if ops_of else ""
        rows[str(names[i]).partition(": ")[2]] = {
            "calls_per_step": calls[i] / steps, "ns_per_step": ns[i] / steps, "forward_op": op,
            "outside_calls_per_step": out_n / steps, "model_calls_per_step": model_n / steps,
            "outside_share": out_n / (out_n + model_n) if out_n + model_n else np.nan,
        }
    return pd.DataFrame.from_dict(rows, orient="index")[COLUMNS].rename_axis("key")
