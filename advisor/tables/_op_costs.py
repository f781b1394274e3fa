"""The window's op calls and what they cost: shared by the operator, roofline, kernel and
ceilings tables, below all four so that none of them imports another.

``op_calls(f)`` gives each op call its row code (operator name and level) and the (call,
GPU event) pairs that attribute GPU work to every call it ran inside. ``per_call(f)``
costs the calls advisor's cost models know: FLOPs and bytes from the recorded shapes,
measured time, and the ideal time max(flops / peak, bytes / bandwidth) on the target
device (advisor.knowledge.roofline). Both are memoised per session.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from advisor.knowledge import hardware as kb
from advisor.knowledge.costs import CostGroups, cost_groups, costs_for_ops
from advisor.knowledge.roofline import MATRIX_KINDS, compute_dtypes, resolve_target
from advisor.session import text
from advisor.step.facts import Facts, ancestors, coded, decode

__all__ = ["DIMS", "NESTED_SUFFIX", "TENSOR_DTYPES", "OpCalls", "add_rates", "ideal_parts", "op_calls", "per_call"]

NESTED_SUFFIX = " (nested)"
TENSOR_DTYPES = ("fp16", "bf16", "fp8", "int8")
DIMS = ("m", "n", "k", "batch", "c_in", "c_out", "groups")


class OpCalls:
    """The window's op calls, each with a row code (name code * 2 + nested), and the
    (call, GPU event) pairs that attribute GPU work to every call it ran inside."""

    def __init__(self, f: Facts):
        ops = f.ops
        self.ops = ops
        ids = ops["id"].to_numpy()
        top = ops["top_op"].to_numpy()
        nested = ((top >= 0) & (top != ids)).astype(np.int64)
        name_codes, self._labels = f.name_codes
        # A blank name (code -1) takes the slot after the last label, which names() leaves blank.
        self.codes = np.where(name_codes[ids] >= 0, name_codes[ids], len(self._labels)) * 2 + nested
        # Row id -> position among the window's ops (-1: not one of them).
        position = np.full(len(f.events), -1, dtype=np.int64)
        position[ids] = np.arange(len(ops))
        pair_call, pair_gpu = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for where, anc in ancestors(f.parents, f.gpu["parent_op"].to_numpy()):
            call = position[anc]
            hit = call >= 0
            pair_call.append(call[hit])
            pair_gpu.append(where[hit])
        self.pair_call = np.concatenate(pair_call)
        self.pair_gpu = np.concatenate(pair_gpu)

    def names(self, codes) -> np.ndarray:
        """Operator names for row codes."""
        slot = np.asarray(codes) // 2
        return decode(np.where(slot < len(self._labels), slot, -1), self._labels)

    def keys(self, codes) -> np.ndarray:
        """Row keys for row codes."""
        codes = np.asarray(codes)
        names = self.names(codes)
        return np.where(codes % 2 == 1, names + NESTED_SUFFIX, names)


def op_cost_groups(f: Facts) -> CostGroups:
    """The window's distinct op calls, each costed once (memoised per session): the
    operator, roofline and kernel tables all start from them."""
    return f.memo("op_cost_groups", lambda: cost_groups(op_calls(f).ops))


def op_calls(f: Facts) -> OpCalls:
    """The window's op calls and the GPU work each launched (memoised per session)."""
    return f.memo("operator_calls", lambda: OpCalls(f))


def add_rates(out: pd.DataFrame) -> None:
    """efficiency, lost_ns and the achieved rates from flops, bytes, measured_ns, ideal_ns."""
    measured = out["measured_ns"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["efficiency"] = np.where(measured > 0, np.minimum(out["ideal_ns"] / measured, 1.0), np.nan)
        out["lost_ns"] = np.maximum(measured - out["ideal_ns"], 0)
        out["achieved_flops_per_s"] = np.where(measured > 0, out["flops"] / measured * 1e9, np.nan)
        out["achieved_bytes_per_s"] = np.where(measured > 0, out["bytes"] / measured * 1e9, np.nan)


def per_call(f: Facts) -> pd.DataFrame | None:
    """One row per costed op call (each FLOP once): its cost, measured and ideal time on
    the target (``call_target``). Shared by the roofline, operator and kernel tables
    (memoised per session)."""
    return f.memo("roofline_calls", lambda: _per_call(f))


def call_target(f: Facts) -> tuple[Any, str]:
    """The target the calls are judged against (None where none could be resolved), and a
    note on where its figures come from. Kept beside the calls, not in their ``attrs``:
    pandas deep-copies attrs into every frame derived from them, and the target holds the
    knowledge base's models (a fifth of a second per diagnosis went into those copies)."""

    def resolve() -> tuple[Any, str]:
        target, why = resolve_target(f.session)
        return target, (f"Target: {target.how}." if target is not None else f"Ideal times not computed: {why}")

    return f.memo("roofline_target", resolve)


def _per_call(f: Facts) -> pd.DataFrame | None:
    target, _note = call_target(f)
    calls = op_calls(f)
    ops = calls.ops
    if not len(ops):
        return None
    cost = costs_for_ops(ops, counted_only=True, groups=op_cost_groups(f))
    if not len(cost):
        return None
    positions = (np.searchsorted(ops.index.to_numpy(), cost.index.to_numpy()) if ops.index.is_monotonic_increasing
                 else ops.index.get_indexer(cost.index))
    rows = ops[["id", "name", "input_dims", "top_op", "start_ns", "end_ns"]].iloc[positions]

    gpu_here = f.gpu_measured and (target is None or target.measured_here)
    if gpu_here:
        gpu = f.gpu
        duration = (gpu["end_ns"] - gpu["start_ns"]).to_numpy()[calls.pair_gpu]
        per_op = np.bincount(calls.pair_call, weights=duration, minlength=len(ops))
        measured = per_op[positions]
        tc_yes, tc_no = _tensor_core_kernels(f, calls, len(ops))
        tc_yes, tc_no = tc_yes[positions], tc_no[positions]
        tile_m, tile_n = (t[positions] for t in _kernel_tiles(f, calls, len(ops)))
    elif target is None or target.measured_here:
        measured = (rows["end_ns"] - rows["start_ns"]).to_numpy().astype(float)
        tc_yes, tc_no = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
        tile_m = tile_n = np.full(len(rows), np.nan)
    else:
        measured = np.full(len(rows), np.nan)
        tc_yes, tc_no = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
        tile_m = tile_n = np.full(len(rows), np.nan)

    kind = text(cost["kind"])  # every counted call has a kind
    dtype = compute_dtypes(cost["dtype"].to_numpy())
    flops = cost["flops"].to_numpy(dtype=float)
    nbytes = cost["bytes"].to_numpy(dtype=float)
    matrix = np.isin(kind, MATRIX_KINDS)
    # Tensor cores: half-precision matrix work always can; fp32 matrix work only as TF32,
    # which shows where its kernels are tensor-core kernels.
    tensor = matrix & (np.isin(dtype.astype(str), TENSOR_DTYPES) | ((dtype == "fp32") & (tc_yes > 0)))
    compute_ns, memory_ns, unit = ideal_parts(target, dtype, tensor, flops, nbytes)
    if gpu_here:
        # A copy between host and device is bound by the interconnect, not by device
        # memory: no device roofline applies (sync-memcpy-stall judges those copies).
        crossing = _host_device_copies(f, calls, len(ops))[positions]
        compute_ns[crossing] = np.nan
        memory_ns[crossing] = np.nan
        unit[crossing] = "host-device copy"

    # Text columns hold one str object per distinct value, not one per call: a trace of
    # millions of op calls otherwise spends hundreds of MB on copies of a few names.
    name = text(rows["name"])
    dims_text = text(rows["input_dims"])
    ids = rows["id"].to_numpy()
    top = rows["top_op"].to_numpy()
    nested = (top >= 0) & (top != ids)
    # Kept as object columns: pandas would otherwise copy each into an Arrow string
    # array, a string at a time (figures: benchmarks/RESULTS.md).
    texts = {
        "key": _keys(rows["name"], rows["input_dims"]),
        "operator": _as_text(np.where(nested, _suffixed(name, NESTED_SUFFIX), name)),
        "name": name, "input_dims": dims_text, "kind": kind, "dtype": _as_text(dtype),
    }
    out = pd.DataFrame({
        "id": ids,
        **{column: pd.Series(values, dtype=object, copy=False) for column, values in texts.items()},
        "flops": flops, "bytes": nbytes, "measured_ns": measured, "ideal_ns": np.fmax(compute_ns, memory_ns),
        "compute_ns": compute_ns, "memory_ns": memory_ns, "unit": pd.Series(unit, dtype=object, copy=False),
        "tc_yes": tc_yes, "tc_no": tc_no, "tile_m": tile_m, "tile_n": tile_n,
        **{d: pd.to_numeric(cost[d], errors="coerce").to_numpy(dtype=float) for d in DIMS},
    }, copy=False)  # the arrays as made above, not copied again into one block
    return out


def _as_text(values: np.ndarray) -> np.ndarray:
    """``values`` as str, one object per distinct value (None as "None", as str() has it)."""
    series = pd.Series(values, dtype=object)
    return text(series.where(series.notna(), "None"))


def _keys(names: pd.Series, dims: pd.Series) -> np.ndarray:
    """Row keys "name dims" from the categorical name and dims columns, one str object per
    distinct (name, dims) pair, the pairs told apart by their codes."""
    name_codes, name_labels = coded(names)
    dims_codes, dims_labels = coded(dims)
    width = len(dims_labels) + 1
    codes, distinct = pd.factorize((name_codes + 1) * width + (dims_codes + 1))
    name_text = decode(distinct // width - 1, name_labels)
    dims_text = decode(distinct % width - 1, dims_labels)
    return np.array([f"{n} {d}".rstrip() for n, d in zip(name_text, dims_text)], dtype=object)[codes]


def _suffixed(names: np.ndarray, suffix: str) -> np.ndarray:
    """``names`` with ``suffix`` added, one str object per distinct name."""
    codes, distinct = pd.factorize(names)
    return np.array([f"{n}{suffix}" for n in distinct], dtype=object)[codes]


def ideal_parts(target, dtype: np.ndarray, tensor: np.ndarray, flops: np.ndarray,
                nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute-bound and memory-bound ideal times (ns) and the unit assumed, per row."""
    n = len(flops)
    compute_ns = np.full(n, np.nan)
    memory_ns = np.full(n, np.nan)
    unit = np.full(n, "", dtype=object)
    if target is None:
        return compute_ns, memory_ns, unit
    bandwidth = target.bandwidth()
    if bandwidth:
        memory_ns = np.asarray(nbytes, dtype=float) / bandwidth * 1e9
    # The peak is looked up once per distinct (dtype, tensor cores) pair: a table has a
    # row per op call and a few such pairs.
    dtype_codes, dtypes = pd.factorize(np.asarray(dtype, dtype=object), sort=False)  # None: code -1
    dtypes = [*dtypes, None]
    dtype_at = np.where(dtype_codes >= 0, dtype_codes, len(dtypes) - 1).astype(np.int64)
    pairs = dtype_at * 2 + np.asarray(tensor, dtype=bool)
    for pair in np.unique(pairs):
        peak = target.peak(dtypes[pair // 2], tensor_core=bool(pair % 2))
        if peak:
            rows = pairs == pair
            compute_ns[rows] = np.asarray(flops, dtype=float)[rows] / peak * 1e9
    # Shared str objects, not a fixed-width array turned into a str per row.
    unit[:] = "cpu" if target.kind == "cpu" else np.array(list(kb.unit_names(target.profile)), dtype=object)[
        tensor.astype(np.intp)]
    return compute_ns, memory_ns, unit


def _host_device_copies(f: Facts, calls, n_ops: int) -> np.ndarray:
    """Per op call: whether it launched a copy between host and device memory."""
    gpu = f.gpu
    kinds = text(gpu["copy_kind"])[calls.pair_gpu]
    crossing = np.isin(kinds, ("HtoD", "DtoH"))
    return np.bincount(calls.pair_call[crossing], minlength=n_ops) > 0


def _kernel_tiles(f: Facts, calls, n_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op call: the output tile (rows, columns) of the first kernel it launched whose
    name gives one (a GEMM's: Tensile's MT256x112x64, cuBLAS's tilesize128x128x64); NaN
    where none does."""
    gpu = f.gpu
    name_codes, labels = f.name_codes
    tiles = [kb.kernel_tile(str(n)) for n in labels] + [None]
    tile_m = np.array([t[0] if t else np.nan for t in tiles], dtype=float)
    tile_n = np.array([t[1] if t else np.nan for t in tiles], dtype=float)
    codes = name_codes[gpu["id"].to_numpy()[calls.pair_gpu]]
    codes = np.where(codes >= 0, codes, len(labels))
    has = ~np.isnan(tile_m[codes])
    out_m, out_n = np.full(n_ops, np.nan), np.full(n_ops, np.nan)
    if has.any():
        # The first pair of each call that names a tile (pairs run in kernel order per call).
        call = calls.pair_call[has]
        first = np.unique(call, return_index=True)[1]
        out_m[call[first]] = tile_m[codes[has]][first]
        out_n[call[first]] = tile_n[codes[has]][first]
    return out_m, out_n


def _tensor_core_kernels(f: Facts, calls, n_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op call: how many of the kernels it launched are tensor-core kernels by name,
    and how many are known not to be."""
    gpu = f.gpu
    is_kernel = (gpu["kind"] == "kernel").to_numpy()[calls.pair_gpu]
    name_codes, labels = f.name_codes
    verdict = np.array([kb.uses_tensor_cores(str(n)) for n in labels] + [None], dtype=object)
    codes = name_codes[gpu["id"].to_numpy()[calls.pair_gpu]]
    per_pair = verdict[np.where(codes >= 0, codes, len(labels))]
    yes = is_kernel & (per_pair == True)  # noqa: E712  (an object array of True/False/None)
    no = is_kernel & (per_pair == False)  # noqa: E712
    return (np.bincount(calls.pair_call[yes], minlength=n_ops), np.bincount(calls.pair_call[no], minlength=n_ops))
