"""Batch Loops: Python loops over the rows of a batch, found in the operators they call.

``torch.stack([h[i, :n[i]].mean(0) for i in range(h.shape[0])])`` takes the batch apart
row by row: each row is an ``aten::select`` of dimension 0 (``h[i]``, with the row's index
as a recorded argument), followed by the loop body's few operators on that row. A batch of
64 rows makes 64 selects and 64 of each body operator a pass, where the batched form (one
masked sum) makes a handful; and every one of them that works on a tensor needing grad
leaves an autograd node that ``loss.backward()`` runs (``SelectBackward0`` makes a zero
tensor the size of the whole batch for each row it scatters back). The work is spent
inside the Forward and Backward phases, where the model's own operators hide it.

A loop is found by its indexing: calls of ``aten::select`` (or ``aten::narrow``, or a slice
one row long) on dimension 0 of one tensor shape, as many a pass as the tensor has rows,
at least ``MIN_ROWS`` of them and mostly different rows; or one ``aten::unbind`` of
dimension 0 (``for row in h``) whose rows the next operators take one at a time. Its
extent in each pass runs from the first row's indexing to the end of the last row's body
(the operators after the last index whose kind ran at least half as often as there are
rows, and a torch.stack or torch.cat right after, gathering the rows' results). Its backward is the nodes named after its body's operators that ran about as often.
Where stack samples fell inside the loop, the user's line they name is its source.

``loop_spans(facts)`` gives each loop's host time (its forward extents, its nodes' ranges)
for the rule batch-loop-in-model, which replays the step without most of it.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.knowledge.costs._model import Args, Uncostable
from advisor.session import intervals as iv
from advisor.step.facts import Facts, coded
from advisor.tables._op_costs import call_target, per_call
from advisor.tables._registry import table
from advisor.tables.autograd_nodes import NODE, _base
from advisor.tables.python_hotspots import library_roots, stack_facts

MIN_ROWS = 8  # fewer rows than this is a loop over a few heads or parts, not a batch
ROW_OPS = ("aten::select", "aten::narrow", "aten::slice")
SPLIT_OPS = ("aten::unbind",)
GATHER_OPS = ("aten::stack", "aten::cat")
GATHER_NODES = ("StackBackward0", "CatBackward0")
BODY_SHARE = 0.5  # a body operator runs at least this share of once per row
COLUMNS = ["phase", "rows", "passes_per_step", "index_calls_per_step", "body_ops_per_row", "body", "forward_ns_per_step",
           "op_ns_per_step", "bytes_per_step", "memory_ns_per_step", "nodes", "node_calls_per_step",
           "node_ns_per_step", "source", "source_samples"]


class Loop(NamedTuple):
    """One loop over a batch's rows, as found (see the module docstring)."""

    key: str  # the indexing operator, the tensor's shape and dimension 0
    phase: str
    rows: int
    passes: int  # passes (forward calls, or steps) the loop ran in
    index_calls: int
    body: Counter  # operator name -> calls inside the loop's extents
    extents: iv.Intervals  # the loop's forward time, one interval a pass
    op_ns: float  # the host time of the operators inside the extents
    bytes: float  # the bytes those operators move, by advisor's cost models (NaN: none costed)
    nodes: dict[str, int]  # autograd node kind -> calls
    node_spans: iv.Intervals
    node_ns: float
    source: str  # 'file:line' of the user's line the samples inside the loop name most
    source_samples: int


@table(
    "batch_loops",
    title="Batch Loops",
    description=(
        "Python loops over the rows of a batch, one row per loop: the indexing that takes each row "
        "(aten::select of dimension 0 as many times a pass as the tensor has rows, or one aten::unbind), "
        "the operators its body calls per row, its host time in forward (from the first row's indexing "
        "to the end of the last row's body) and the autograd nodes its operators left for backward. "
        "Empty where the profile has no such loop, no steps, or no input shapes."
    ),
    key="The indexing operator, the tensor's shape and the dimension ('aten::select [64,48,64] dim 0')",
    columns={
        "phase": "The phase the loop ran in ('Forward', or '' outside the model's phases).",
        "rows": "Rows of the indexed dimension: the batch the loop walks.",
        "passes_per_step": "Passes of the loop per step (forward calls that ran it).",
        "index_calls_per_step": "Calls of the indexing operator per step.",
        "body_ops_per_row": "Top-level operators inside the loop per row, the indexing included.",
        "body": "The body's operators, most calls first, with their calls per row ('aten::slice x1').",
        "forward_ns_per_step": "The loop's host time per step: its extents, Python between the operators "
                               "included, ns.",
        "op_ns_per_step": "The host time per step of the operators inside the loop, ns.",
        "bytes_per_step": "The bytes per step those operators read and write, by advisor's cost models (NaN where "
                          "none of them is costed): the arithmetic a batched form still does.",
        "memory_ns_per_step": "bytes_per_step at the device's memory bandwidth (the knowledge base's, or advisor "
                              "calibrate's for a CPU), ns; NaN where no bandwidth is known.",
        "nodes": "The autograd nodes of the body's operators that ran about once a row, most time first.",
        "node_calls_per_step": "Those nodes run per step.",
        "node_ns_per_step": "Their host time per step (their evaluate_function ranges), ns.",
        "source": "The user's line ('file:line') most stack samples inside the loop stopped at; '' where "
                  "none fell inside it.",
        "source_samples": "Stack samples inside the loop naming that line.",
    },
)
def batch_loops_table(f: Facts) -> pd.DataFrame | None:
    loops = find_loops(f)
    steps = len(f.steps) if f.has_steps else 0
    if not loops or not steps:
        return None
    target, _ = call_target(f)
    bandwidth = target.bandwidth() if target is not None else None
    rows = {}
    for loop in loops:
        calls = sum(loop.body.values())
        rows[loop.key] = {
            "phase": loop.phase, "rows": loop.rows, "passes_per_step": loop.passes / steps,
            "index_calls_per_step": loop.index_calls / steps,
            "body_ops_per_row": calls / max(loop.passes * loop.rows, 1),
            "body": ", ".join(f"{name} x{n / max(loop.passes * loop.rows, 1):.0f}"
                              for name, n in loop.body.most_common(6) if n >= BODY_SHARE * loop.passes * loop.rows),
            "forward_ns_per_step": float(iv.total_length(loop.extents)) / steps, "op_ns_per_step": loop.op_ns / steps,
            "bytes_per_step": loop.bytes / steps, "memory_ns_per_step": loop.bytes / bandwidth * 1e9 / steps
            if bandwidth else np.nan,
            "nodes": ", ".join(loop.nodes), "node_calls_per_step": sum(loop.nodes.values()) / steps,
            "node_ns_per_step": loop.node_ns / steps, "source": loop.source,
            "source_samples": loop.source_samples,
        }
    frame = pd.DataFrame.from_dict(rows, orient="index")[COLUMNS]
    return frame.sort_values("forward_ns_per_step", ascending=False).rename_axis("key")


def loop_spans(f: Facts) -> dict[str, tuple[iv.Intervals, iv.Intervals]]:
    """Each loop's forward extents and its autograd nodes' ranges, by the table's key."""
    return {loop.key: (loop.extents, loop.node_spans) for loop in find_loops(f)}


def find_loops(f: Facts) -> list[Loop]:
    """The loops over a batch's rows in the window's steps, worked out once per session."""
    return f.memo("batch_loops", lambda: _find(f))


def _find(f: Facts) -> list[Loop]:
    if not f.has_steps or f.main_thread is None:
        return []
    ops = f.main_ops
    lo, hi = f.window
    start = ops["start_ns"].to_numpy()
    ops = ops[(start >= lo) & (start < hi)]
    if not len(ops):
        return []
    names = ops["name"].astype(str).to_numpy()
    starts, ends = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    index_rows = np.flatnonzero(np.isin(names, ROW_OPS + SPLIT_OPS))
    if not len(index_rows):
        return []
    passes = _pass_of(f, starts)
    phase_of = ops["phase"].astype(str).to_numpy()
    concrete = f.events["concrete_inputs"].reindex(ops.index).to_numpy() if "concrete_inputs" in f.events else None
    dims_col, types_col = ops["input_dims"].to_numpy(), ops["input_types"].to_numpy()
    # The row-taking calls, by (operator, shape) and pass: their indices and positions.
    found: dict[tuple[str, str], dict[int, list[tuple[int, object]]]] = {}
    rows_of: dict[tuple[str, str], int] = {}
    for i in index_rows:
        taken = _row_taken(names[i], dims_col[i], types_col[i], concrete[i] if concrete is not None else None)
        if taken is None:
            continue
        shape, rows, index = taken
        if rows < MIN_ROWS:
            continue
        key = (names[i], shape)
        rows_of[key] = rows
        found.setdefault(key, {}).setdefault(int(passes[i]), []).append((int(i), index))
    loops: list[Loop] = []
    claimed = np.zeros(len(ops), dtype=bool)
    # The biggest tensor first: a loop indexing both h[i] and lengths[i] is named by h.
    for key in sorted(found, key=lambda k: -_elements(k[1])):
        rows = rows_of[key]
        split = key[0] in SPLIT_OPS
        extents: list[tuple[int, int]] = []
        inside: list[np.ndarray] = []
        calls = 0
        for pass_id, taken in found[key].items():
            positions = [p for p, _ in taken]
            if claimed[positions].any():
                continue
            if not split:
                indices = {index for _, index in taken if index is not None}
                if len(taken) < BODY_SHARE * rows or (indices and len(indices) < BODY_SHARE * rows):
                    continue
            span = _extent(names, passes, pass_id, positions, rows, split)
            if span is None:
                continue
            first, last = span
            claimed[first:last + 1] = True
            extents.append((int(starts[first]), int(ends[first:last + 1].max())))
            inside.append(np.arange(first, last + 1))
            calls += len(taken)
        if not extents:
            continue
        within = np.concatenate(inside)
        body = Counter(names[within].tolist())
        if split:
            body.pop(key[0], None)
        n_passes = len(extents)
        # A loop's body runs once a row: fewer than that is a pass of the model around one
        # indexing call (an unbind whose rows nothing takes one at a time).
        if not body or max(body.values()) < BODY_SHARE * rows * n_passes:
            continue
        taking = np.array([p for taken in found[key].values() for p, _ in taken], dtype=np.int64)
        loops.append(_loop(f, key, rows, n_passes, calls, body, extents, within, ops, phase_of[taking]))
    return loops


def _loop(f: Facts, key: tuple[str, str], rows: int, n_passes: int, calls: int, body: Counter,
          extents: list[tuple[int, int]], within: np.ndarray, ops: pd.DataFrame, phase_of: np.ndarray) -> Loop:
    """The loop found, measured: ``phase_of`` holds the phases of its indexing calls."""
    starts, ends = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    spans = iv.union((np.array([s for s, _ in extents], dtype=np.int64), np.array([e for _, e in extents],
                                                                                  dtype=np.int64)))
    # The loop's phase is its indexing's: rows taken outside the model and each passed to
    # it (a loop of model calls, per-sample-model-calls' case) are not a loop in the model.
    phase = Counter(phase_of.tolist()).most_common(1)[0][0]
    nodes, node_spans, node_ns = _nodes(f, body, rows * n_passes)
    source, samples = _source(f, spans)
    return Loop(key=f"{key[0]} {key[1]} dim 0", phase=phase if phase in ("Forward",) else "", rows=rows,
                passes=n_passes, index_calls=calls, body=body, extents=spans,
                op_ns=float((ends[within] - starts[within]).sum()), bytes=_bytes(f, ops.index.to_numpy()[within]),
                nodes=nodes, node_spans=node_spans,
                node_ns=node_ns, source=source, source_samples=samples)


def _bytes(f: Facts, ids: np.ndarray) -> float:
    """The bytes the op calls ``ids`` (and the calls inside them) move, by the cost models."""
    costs = per_call(f)
    if costs is None or not len(costs):
        return float("nan")
    # A call's own row, or the rows of the calls it made (aten::mean costs as itself; a
    # module's composite op as the ops below it).
    mine = np.isin(costs["id"].to_numpy(), ids)
    top = f.events["top_op"].to_numpy()[costs["id"].to_numpy()]
    mine |= np.isin(top, ids)
    return float(costs["bytes"].to_numpy()[mine].sum()) if mine.any() else float("nan")


def _row_taken(name: str, dims, types, concrete) -> tuple[str, int, object] | None:
    """For a call that takes one row of dimension 0 (or splits a tensor into its rows): the
    tensor's shape as text, its rows, and the row's index (None where not recorded)."""
    try:
        args = Args(dims, types, None, concrete)
        tensor = args.tensor(0)
    except (Uncostable, IndexError, TypeError):
        return None
    sizes = tensor.dims
    if not sizes:
        return None
    values = [args[i].value if i < len(args) else None for i in range(1, 5)]
    values = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
    dim = values[0]
    # Where the arguments were recorded, the dimension must be 0; where they were not, the
    # count of calls against the rows decides.
    if dim is not None and dim not in (0, -len(sizes)):
        return None
    shape = "[" + ",".join(str(s) for s in sizes) + "]"
    if name == "aten::select":
        return shape, int(sizes[0]), values[1]
    if name == "aten::narrow":
        if values[2] is not None and values[2] != 1:
            return None
        return shape, int(sizes[0]), values[1]
    if name == "aten::slice":
        # One row long (h[i:i+1]); a range of rows is not a row.
        start, end = values[1], values[2]
        if start is None or end is None or end - start != 1:
            return None
        return shape, int(sizes[0]), start
    if name in SPLIT_OPS:
        return shape, int(sizes[0]), None
    return None


def _elements(shape: str) -> int:
    return int(np.prod([int(s) for s in shape.strip("[]").split(",") if s])) if shape != "[]" else 0


def _pass_of(f: Facts, starts: np.ndarray) -> np.ndarray:
    """Each operator's pass: the Forward range it started in (its position), else -1 - its
    step (a loop outside the model counts once a step)."""
    _, names, p_start, p_end = f.phase_spans
    forward = names == "Forward"
    fs, fe = p_start[forward], p_end[forward]
    order = np.argsort(fs, kind="stable")
    fs, fe = fs[order], fe[order]
    at = np.searchsorted(fs, starts, side="right") - 1
    inside = (at >= 0) & (starts < fe[np.maximum(at, 0)]) if len(fs) else np.zeros(len(starts), dtype=bool)
    steps = f.steps
    step_at = np.searchsorted(steps["start_ns"].to_numpy(), starts, side="right") - 1
    return np.where(inside, at, -2 - step_at)


def _extent(names: np.ndarray, passes: np.ndarray, pass_id: int, positions: list[int], rows: int,
            split: bool) -> tuple[int, int] | None:
    """The first and last operator position of the loop in one pass: from its first
    indexing to the end of the last row's body."""
    first, last = min(positions), max(positions)
    mine = np.flatnonzero(passes == pass_id)
    counts = Counter(names[mine].tolist())
    is_body = {name for name, n in counts.items() if n >= BODY_SHARE * rows}
    # The last row's body: the operators after the last indexing that run once a row.
    end = last
    for p in mine[mine > last]:
        if names[p] not in is_body:
            break
        end = int(p)
    if split and end == last:
        return None
    # The call that gathers the rows' results back into one tensor (torch.stack(list)) is
    # the loop's too: batched, there is nothing to gather.
    after = mine[mine > end]
    if len(after) and names[after[0]] in GATHER_OPS:
        end = int(after[0])
    return first, end


def _nodes(f: Facts, body: Counter, row_passes: int) -> tuple[dict[str, int], iv.Intervals, float]:
    """The autograd nodes named after the body's operators that ran at least half as often
    as the loop's rows: their calls by kind (most time first), their ranges and host time."""
    lo, hi = f.window
    ev = f.events
    start = ev["start_ns"].to_numpy()
    ops = ev[["name", "start_ns", "end_ns"]][(ev["kind"] == "op").to_numpy() & (start >= lo) & (start < hi)]
    if f.main_thread is not None:
        ops = ops[(ev["pid"].reindex(ops.index).to_numpy() == f.main_thread[0])]
    codes, labels = coded(ops["name"])
    bases = {_base(name) for name in body}
    wanted = []
    for code, label in enumerate(labels):
        match = NODE.match(str(label))
        if match is not None and _base(match.group(1)) in bases:
            wanted.append(code)
    if not wanted:
        return {}, iv.union((np.zeros(0, np.int64), np.zeros(0, np.int64))), 0.0
    took = (ops["end_ns"] - ops["start_ns"]).to_numpy(dtype=np.float64)
    kinds: dict[str, tuple[int, float]] = {}
    keep = np.zeros(len(ops), dtype=bool)
    for code in wanted:
        mine = codes == code
        n = int(mine.sum())
        # The gather's node (StackBackward0) runs once a pass, the body's about once a row.
        if n < BODY_SHARE * row_passes and str(labels[code]).rpartition(" ")[2] not in GATHER_NODES:
            continue
        keep |= mine
        kinds[str(labels[code]).partition(": ")[2]] = (n, float(took[mine].sum()))
    ordered = dict(sorted(((k, v[0]) for k, v in kinds.items()), key=lambda kv: -kinds[kv[0]][1]))
    spans = iv.union((ops["start_ns"].to_numpy()[keep].astype(np.int64), ops["end_ns"].to_numpy()[keep].astype(np.int64)))
    return ordered, spans, float(sum(v[1] for v in kinds.values()))


def _source(f: Facts, spans: iv.Intervals) -> tuple[str, int]:
    """The user's line most stack samples inside ``spans`` stopped at, and their count."""
    ev = f.events
    samples = ev[(ev["kind"] == "stack").to_numpy()]
    if not len(samples) or not len(spans[0]):
        return "", 0
    # A sample's stack is the one seen at its end; its start is the sample before.
    t = samples["end_ns"].to_numpy().astype(np.int64)
    inside = iv.covers(spans, t)
    samples = samples[inside]
    if not len(samples):
        return "", 0
    codes, stacks = coded(samples["call_stack"])
    frames = stack_facts(stacks, library_roots(f))
    counts = Counter()
    for code in codes[codes >= 0]:
        row = frames.iloc[int(code)]
        if row["file"]:
            counts[f"{row['file']}:{row['line']}"] += 1
    if not counts:
        return "", 0
    line, n = counts.most_common(1)[0]
    return line, n
