"""Costs for whole tables of op rows (``costs_for_ops``) and for the GPU kernels those
ops launch (``kernel_costs``).

Traces repeat the same op with the same shapes thousands of times, so each distinct
(name, dims, types, strides, concrete inputs) is costed once and the result spread back
over its rows.

Ops nest (aten::linear calls aten::addmm; aten::conv2d calls aten::convolution, which
calls aten::cudnn_convolution), and each level carries the same cost. ``counted`` marks
the rows whose cost is complete and has no complete ancestor among the rows, so summing
over ``counted`` rows counts each FLOP and byte once; it needs the ``id`` and
``parent_op`` columns of a Session's events (without them every complete row counts).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.knowledge.costs import _conv
from advisor.knowledge.costs._model import Args, OpCost, Uncostable
from advisor.knowledge.costs._registry import MODELS, cost_args

KEY_COLUMNS = ("name", "input_dims", "input_types", "input_strides", "concrete_inputs")
DIM_COLUMNS = ("m", "n", "k", "batch", "c_in", "c_out", "groups")
COST_COLUMNS = ("flops", "bytes_read", "bytes_written", "bytes", "dtype", "kind", *DIM_COLUMNS,
                "kernel", "out_spatial", "model", "counted")
# parent chains deeper than this are cut (real traces nest a few dozen ops at most)
_MAX_DEPTH = 256


def _codes(column: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Integer codes and the text of each code for a column of strings (or categories)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        categories = [str(c) for c in column.cat.categories]
        codes = column.cat.codes.to_numpy().astype(np.int64)
        if (codes < 0).any():
            codes = np.where(codes < 0, len(categories), codes)
            categories = categories + [""]
        return codes, categories
    codes, uniques = pd.factorize(column.astype(object).where(column.notna(), ""), sort=False)
    return codes.astype(np.int64), [str(u) for u in uniques]


def _shape_text(dims) -> str:
    return "x".join(str(d) for d in dims) if dims else ""


class CostGroups(NamedTuple):
    """The distinct calls of a frame of op rows, each costed once: ``costs[g]`` is the cost
    of group ``g`` (None: not costed) and ``group_ids[row]`` each row's group."""

    costs: list[OpCost | None]
    group_ids: np.ndarray


def cost_groups(frame: pd.DataFrame) -> CostGroups:
    """Each distinct (name, dims, types, strides, concrete inputs) of ``frame`` costed once."""
    if "name" not in frame.columns:
        raise ValueError("costs_for_ops needs a 'name' column")
    n_rows = len(frame)
    present = [c for c in KEY_COLUMNS if c in frame.columns]
    coded = [_codes(frame[c]) for c in present]
    if n_rows:
        # Groups numbered in the order their first row comes (as a groupby's ngroup with
        # sort=False), one column at a time: the pairs (group so far, code) renumbered,
        # which stays below rows x codes. A groupby over the five columns holds a copy of
        # them all at once.
        group_ids = pd.factorize(coded[0][0], sort=False)[0]
        for codes, categories in coded[1:]:
            group_ids = pd.factorize(group_ids * (len(categories) + 1) + codes, sort=False)[0]
        group_ids = group_ids.astype(np.int64, copy=False)
        _, first_rows = np.unique(group_ids, return_index=True)
    else:
        group_ids = np.zeros(0, dtype=np.int64)
        first_rows = np.zeros(0, dtype=np.int64)

    def text_of(column: str, row: int) -> str | None:
        if column not in present:
            return None
        codes, categories = coded[present.index(column)]
        return categories[codes[row]]

    parsed: list[tuple[str, Args | None]] = []
    for row in first_rows:
        name = text_of("name", row) or ""
        args = None
        if name in MODELS:
            try:
                args = Args(text_of("input_dims", row), text_of("input_types", row),
                            text_of("input_strides", row), text_of("concrete_inputs", row))
            except Uncostable:
                args = None
        parsed.append((name, args))

    hints = _conv_output_hints(parsed)
    costs: list[OpCost | None] = []
    for name, args in parsed:
        cost = cost_args(name, args) if args is not None else None
        if cost is not None and cost.kind == "conv" and cost.out_spatial is None and name in _conv.FORWARD_NAMES:
            x, w = args.opt_tensor(0), args.opt_tensor(1)
            found = hints.get((tuple(x.dims), tuple(w.dims))) if x is not None and w is not None else None
            if found is not None and len(found) == 1:
                cost = cost_args(name, args, conv_output_spatial=next(iter(found))) or cost
        costs.append(cost)
    return CostGroups(costs, group_ids)


def costs_for_ops(frame: pd.DataFrame, *, counted_only: bool = False, groups: CostGroups | None = None,
                  columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The cost of every row of ``frame`` (op rows of a Session's events, or any frame with
    ``name``, ``input_dims``, ``input_types`` and optionally ``input_strides`` and
    ``concrete_inputs``), indexed like ``frame``.

    Columns (COST_COLUMNS): flops, bytes_read, bytes_written, bytes (NaN where unknown or
    not costed); dtype, kind, model ("" where not costed); the GEMM and convolution dims
    m, n, k, batch, c_in, c_out, groups (nullable integers); kernel and out_spatial as
    "3x3" text; counted (see the module docstring). With ``counted_only``, the counted
    rows alone: on a large trace most op rows are not (nested or not costed), and the
    full frame of every row is hundreds of MB. ``columns``: only these of COST_COLUMNS
    (and counted). ``groups``: ``cost_groups(frame)``, where the caller has it already.
    """
    costs, group_ids = groups if groups is not None else cost_groups(frame)
    if not counted_only:
        out = _spread(costs, group_ids, frame.index, columns)
        amounts = out if {"flops", "bytes"} <= set(out.columns) else \
            _spread(costs, group_ids, frame.index, ("flops", "bytes"))
        out["counted"] = _counted(frame, amounts, _row_dtypes(costs, group_ids))
        return out
    flops = np.array([c.flops if c else np.nan for c in costs], dtype=np.float64)
    nbytes = np.array([c.bytes_read + c.bytes_written if c else np.nan for c in costs], dtype=np.float64)
    if len(group_ids):
        flops, nbytes = flops[group_ids], nbytes[group_ids]
    rows = np.flatnonzero(_counted(frame, pd.DataFrame({"flops": flops, "bytes": nbytes}, copy=False),
                                   _row_dtypes(costs, group_ids)))
    out = _spread(costs, group_ids[rows], frame.index[rows], columns) if len(group_ids) else \
        _spread(costs, group_ids, frame.index, columns)
    out["counted"] = True
    return out


def _conv_output_hints(parsed: list[tuple[str, Args | None]]) -> dict[tuple, set]:
    """(input dims, weight dims) -> the output sizes that convolution backward rows with
    those operands report; a forward convolution with the same operands had that output."""
    hints: dict[tuple, set] = {}
    for name, args in parsed:
        if args is None or name not in _conv.CONV_BACKWARD:
            continue
        hint = _conv.backward_output_hint(name, args)
        if hint is not None:
            hints.setdefault(hint[:2], set()).add(hint[2])
    return hints


def _spread(costs: list[OpCost | None], group_ids: np.ndarray, index: pd.Index,
            wanted: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The groups' costs spread over their rows: the ``wanted`` columns (default all)."""
    wanted = tuple(c for c in COST_COLUMNS if c != "counted" and (wanted is None or c in wanted))
    n = len(costs)
    nan = np.nan
    columns: dict[str, object] = {}
    numbers = {"flops": lambda c: c.flops, "bytes_read": lambda c: c.bytes_read,
               "bytes_written": lambda c: c.bytes_written, "bytes": lambda c: c.bytes_read + c.bytes_written}
    for field, getter in numbers.items():
        if field in wanted:
            values = np.array([getter(c) if c else nan for c in costs], dtype=np.float64)
            columns[field] = values[group_ids] if n else values
    for field, getter in (("dtype", lambda c: c.dtype), ("kind", lambda c: c.kind),
                          ("kernel", lambda c: _shape_text(c.kernel)),
                          ("out_spatial", lambda c: _shape_text(c.out_spatial)), ("model", lambda c: c.model)):
        if field not in wanted:
            continue
        values = [getter(c) if c else "" for c in costs]
        categories = sorted(set(values))
        lookup = {v: i for i, v in enumerate(categories)}
        codes = np.array([lookup[v] for v in values], dtype=np.int64)
        columns[field] = pd.Categorical.from_codes(codes[group_ids] if n else codes, categories=categories)
    for field in DIM_COLUMNS:
        if field not in wanted:
            continue
        values = [getattr(c, field) if c else None for c in costs]
        data = np.array([v if v is not None else 0 for v in values], dtype=np.int64)
        missing = np.array([v is None for v in values], dtype=bool)
        if n:
            data, missing = data[group_ids], missing[group_ids]
        columns[field] = pd.arrays.IntegerArray(data, missing)
    frame = pd.DataFrame(columns, index=index)
    return frame[list(wanted)]


def _positions(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's parent as a row position in ``frame`` (-1: none, or not in the frame)."""
    if "id" not in frame.columns or "parent_op" not in frame.columns or not len(frame):
        return None
    ids = frame["id"].to_numpy(dtype=np.int64)
    parents = frame["parent_op"].to_numpy(dtype=np.int64)
    top = max(int(ids.max()), int(parents.max()), 0) + 1
    where = np.full(top, -1, dtype=np.int64)
    valid = ids >= 0
    where[ids[valid]] = np.flatnonzero(valid)
    parent_pos = np.where(parents >= 0, where[np.clip(parents, 0, top - 1)], -1)
    return ids, parent_pos


def _complete(costs: pd.DataFrame) -> np.ndarray:
    return np.isfinite(costs["flops"].to_numpy()) & np.isfinite(costs["bytes"].to_numpy())


def _counted(frame: pd.DataFrame, costs: pd.DataFrame, dtypes: np.ndarray | None = None) -> np.ndarray:
    complete = _complete(costs)
    located = _positions(frame)
    if located is None:
        return complete
    _, parent_pos = located
    # Autocast: an op called again inside itself on cast inputs (aten::linear on fp32
    # around aten::linear on bf16) computes in the inner call's dtype, so the inner call
    # counts and the outer one does not.
    recast = np.zeros(len(frame), dtype=bool)
    if dtypes is not None and len(frame):
        names = frame["name"].astype(object).to_numpy()
        child = np.flatnonzero((parent_pos >= 0) & complete)
        parent = parent_pos[child]
        outer = complete[parent] & (names[child] == names[parent]) & (dtypes[child] != dtypes[parent])
        recast[parent[outer]] = True
    counts = complete & ~recast
    covered = np.zeros(len(frame), dtype=bool)
    cur = parent_pos.copy()
    for _ in range(_MAX_DEPTH):
        active = cur >= 0
        if not active.any():
            break
        covered[active] |= counts[cur[active]]
        cur[active] = parent_pos[cur[active]]
    return counts & ~covered


def _row_dtypes(costs: list[OpCost | None], group_ids: np.ndarray) -> np.ndarray:
    """Each row's compute dtype ('' where not costed)."""
    values = np.array([c.dtype if c else "" for c in costs] + [""], dtype=object)
    return values[group_ids] if len(group_ids) else values[:0]


# What kernel_costs reads of the op rows' costs.
KERNEL_COST_COLUMNS = ("flops", "bytes_read", "bytes_written", "bytes", "dtype", "kind", "model")


def kernel_costs(events: pd.DataFrame, op_costs: pd.DataFrame | None = None, *,
                 ops: pd.DataFrame | None = None, groups: CostGroups | None = None) -> pd.DataFrame:
    """The cost of each GPU kernel, where the kernel is tied to an op.

    A kernel's op is the nearest op around its launch (``parent_op`` and up) whose cost is
    complete. Where that op launched this kernel alone, the kernel carries the op's cost;
    where it launched several, the cost belongs to them together and the kernel's FLOPs
    and bytes are NaN (``op`` and ``op_kernels`` say which op and how many kernels, so a
    caller can sum their times and compare). Indexed like the kernel rows of ``events``.
    ``op_costs`` is costs_for_ops over the op rows of ``events``, where the caller has it
    (KERNEL_COST_COLUMNS are all it needs); ``groups``: ``cost_groups(ops)``, where the
    caller has that instead (with both, op_costs is used). ``ops``: the op rows, where
    ``events`` holds the kernels alone. Without op_costs the costs are looked up per
    distinct call, not spread over every op row first (nor whether each counts): on a
    1 GB trace (1.7 M op rows) the kernel table's peak was 50 MB higher that way.
    """
    is_kernel = (events["kind"] == "kernel").to_numpy()
    kernels = events if is_kernel.all() else events[is_kernel]
    if ops is None:
        ops = events[(events["kind"] == "op").to_numpy()]
    if op_costs is None:
        # One row per distinct call (group), and each op row's group.
        costs, row_of_op = groups if groups is not None else cost_groups(ops)
        picked = _spread(costs, np.arange(len(costs)), pd.RangeIndex(len(costs)), KERNEL_COST_COLUMNS)
    else:
        picked = op_costs.reindex(ops.index)
        row_of_op = np.arange(len(ops))
    complete = _complete(picked)[row_of_op] if len(ops) else np.zeros(0, dtype=bool)
    op_ids = ops["id"].to_numpy(dtype=np.int64)
    located = _positions(ops)
    parent_pos = located[1] if located is not None else np.full(len(ops), -1, dtype=np.int64)

    # the op position each kernel was launched from, then up to the nearest complete cost
    launched_by = kernels["parent_op"].to_numpy(dtype=np.int64)
    top = max(int(op_ids.max()) if len(ops) else 0, int(launched_by.max()) if len(kernels) else 0, 0) + 1
    where = np.full(top, -1, dtype=np.int64)
    where[op_ids[op_ids >= 0]] = np.flatnonzero(op_ids >= 0)
    cur = np.where(launched_by >= 0, where[np.clip(launched_by, 0, top - 1)], -1)
    del where  # one slot per event id, not needed past here
    owner = np.full(len(kernels), -1, dtype=np.int64)
    for _ in range(_MAX_DEPTH):
        active = (cur >= 0) & (owner < 0)
        if not active.any():
            break
        hit = np.zeros(len(kernels), dtype=bool)
        hit[active] = complete[cur[active]]
        owner[hit] = cur[hit]
        climb = active & ~hit
        cur[climb] = parent_pos[cur[climb]]
        cur[~active] = -1

    tied = owner >= 0
    at = np.where(tied, owner, 0)
    counts = np.bincount(owner[tied], minlength=len(ops))
    op_kernels = np.where(tied, counts[at] if len(ops) else 0, 0)
    sole = tied & (op_kernels == 1)
    out = {"op": np.where(tied, op_ids[at] if len(ops) else -1, -1), "op_kernels": op_kernels}
    picked_at = row_of_op[at] if len(ops) else at
    for column in ("flops", "bytes_read", "bytes_written", "bytes"):
        values = picked[column].to_numpy(dtype=np.float64)[picked_at] if len(ops) else np.zeros(len(kernels))
        out[column] = np.where(sole, values, np.nan)
    for column in ("dtype", "kind", "model"):
        # One str per category, taken by code: not a string made per op row.
        values = picked[column].astype("category")
        labels = np.asarray([str(c) for c in values.cat.categories] + [""], dtype=object)
        codes = values.cat.codes.to_numpy()
        codes = np.where(codes >= 0, codes, len(labels) - 1)[picked_at] if len(ops) \
            else np.full(len(kernels), len(labels) - 1)
        out[column] = pd.Series(labels[np.where(tied, codes, len(labels) - 1)], index=kernels.index, dtype=object,
                                copy=False)
    return pd.DataFrame(out, index=kernels.index, copy=False)  # the arrays above, not copied into one block
