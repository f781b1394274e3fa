"""Events that are copies of others: a profile written twice, or joined with a copy of
itself.

Two kinds, each said in the report: exact copies (every field the same but the row's
position), which a reader keeps once, and near-copies, the same event on the same thread
again a few nanoseconds later (a trace joined with a shifted copy of itself), which no
profiler writes: two operators of one thread with one name and one duration cannot start
nanoseconds apart. Near-copies are counted and said, not removed: which of a pair is the
real one cannot be told.

Only rows that share a start (for exact copies) or whose starts lie within NEAR_NS of
another's (for near-copies) are compared, so a profile without them costs a sort.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["NEAR_NS", "exact_copies", "near_copies", "without_copies"]

NEAR_NS = 10  # a copy shifted by at most this much is a near-copy


def _codes(column: pd.Series) -> np.ndarray:
    """A column as int64 codes, equal where the values are (text by its category code)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy().astype(np.int64)
    values = column.to_numpy()
    if values.dtype.kind == "f":
        return values.astype(np.float64).view(np.int64)
    if values.dtype.kind in "iub":
        return values.astype(np.int64, copy=False)
    return pd.factorize(column.astype(str))[0].astype(np.int64)


def exact_copies(events: pd.DataFrame, ignore: tuple[str, ...] = ("id",)) -> np.ndarray:
    """For each row, the first row it repeats in every column but ``ignore`` (itself
    where it repeats none): ``original != arange(n)`` marks the copies."""
    n = len(events)
    original = np.arange(n)
    if n < 2 or "start_ns" not in events.columns:
        return original
    start = events["start_ns"].to_numpy()
    ordered = np.sort(start)
    shared = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(shared):
        return original
    rows = np.flatnonzero(np.isin(start, shared))
    columns = [c for c in events.columns if c not in ignore]
    keys = pd.DataFrame({c: _codes(events[c])[rows] for c in columns})
    group = keys.groupby(columns, sort=False, dropna=False).ngroup().to_numpy()
    first = np.full(group.max() + 1, n, dtype=np.int64)
    np.minimum.at(first, group, rows)  # the first row of each group stands for it
    original[rows] = first[group]
    return original


def without_copies(events: pd.DataFrame, relations: tuple[str, ...]) -> tuple[pd.DataFrame, int]:
    """``events`` with each exact copy of an earlier row left out, the ``relations``
    (columns of row positions) pointed at the rows kept; and how many were left out."""
    original = exact_copies(events)
    keep = original == np.arange(len(events))
    dropped = int(len(events) - keep.sum())
    if not dropped:
        return events, 0
    position = np.cumsum(keep) - 1  # each kept row's new position
    out = events[keep].reset_index(drop=True)
    for column in relations:
        if column in out.columns:
            values = out[column].to_numpy()
            inside = (values >= 0) & (values < len(original))
            out[column] = np.where(inside, position[original[np.where(inside, values, 0)]], values)
    if "id" in out.columns:
        out["id"] = np.arange(len(out), dtype=np.int64)
    return out, dropped


def near_copies(start: np.ndarray, end: np.ndarray, *keys: np.ndarray) -> int:
    """How many events start within NEAR_NS (but not at the same time) after another of
    the same ``keys`` (name, kind, thread) and the same duration."""
    n = len(start)
    if n < 2:
        return 0
    start = np.asarray(start, dtype=np.int64)
    duration = np.asarray(end, dtype=np.int64) - start
    order = np.lexsort((start, duration, *keys))
    same = np.ones(n - 1, dtype=bool)
    for key in (*keys, duration):
        k = np.asarray(key)[order]
        same &= k[1:] == k[:-1]
    gap = np.diff(start[order])
    return int(np.count_nonzero(same & (gap > 0) & (gap <= NEAR_NS)))
