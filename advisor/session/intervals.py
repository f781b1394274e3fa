"""Set arithmetic on half-open time intervals [start, end) in int64 nanoseconds.

The summary tables measure time as unions: two kernels that overlap on two streams keep
the GPU busy once, not twice. Everything here is vectorised (one sort, then cumulative
maxima and sums) so a union of millions of events costs one ``argsort``.

An interval set is any pair ``(starts, ends)`` of equal-length integer arrays; functions
return ``Intervals``, a named pair of int64 arrays that is *normalised*: sorted, disjoint,
non-touching and without empty intervals. Empty and reversed input intervals
(``end <= start``) are ignored.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "EMPTY",
    "Intervals",
    "as_intervals",
    "clip",
    "covers",
    "grouped_union_length",
    "intersect",
    "intersection_length",
    "subtract",
    "total_length",
    "union",
]


class Intervals(NamedTuple):
    starts: np.ndarray
    ends: np.ndarray

    @property
    def length(self) -> int:
        """Sum of the interval lengths (the covered time, for a normalised set)."""
        return int((self.ends - self.starts).sum()) if len(self.starts) else 0

    def __len__(self) -> int:  # the number of intervals, not the pair's 2
        return len(self.starts)


EMPTY = Intervals(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))


def as_intervals(starts, ends=None) -> Intervals:
    """Two arrays, a pair, or a frame with ``start_ns``/``end_ns`` as int64 ``Intervals``
    (not normalised)."""
    if ends is None:
        if isinstance(starts, pd.DataFrame):
            starts, ends = starts["start_ns"], starts["end_ns"]
        else:
            starts, ends = starts
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length: {s.shape[0]} != {e.shape[0]}")
    return Intervals(s, e)


def union(intervals) -> Intervals:
    """Merge overlapping and touching intervals into a normalised set."""
    s, e = as_intervals(intervals)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    n = len(s)
    if n == 0:
        return EMPTY
    if n > 1 and not (s[1:] >= s[:-1]).all():
        order = np.argsort(s)
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new run starts where an interval begins after everything before it has ended.
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.greater(s[1:], reach[:-1], out=first[1:])
    heads = np.flatnonzero(first)
    tails = np.empty_like(heads)
    tails[:-1] = heads[1:] - 1
    tails[-1] = n - 1
    return Intervals(s[heads], reach[tails])


def total_length(intervals) -> int:
    """Time covered by the intervals, overlaps counted once."""
    return union(intervals).length


def _combine(a, b, want) -> Intervals:
    """Segments where ``want(in_a, in_b)`` holds, as a normalised set."""
    a, b = union(a), union(b)
    na, nb = len(a), len(b)
    if na + nb == 0:
        return EMPTY
    points = np.concatenate([a.starts, a.ends, b.starts, b.ends])
    step_a = np.concatenate([np.ones(na, np.int8), -np.ones(na, np.int8), np.zeros(2 * nb, np.int8)])
    step_b = np.concatenate([np.zeros(2 * na, np.int8), np.ones(nb, np.int8), -np.ones(nb, np.int8)])
    order = np.argsort(points, kind="stable")
    points = points[order]
    # Each input set is disjoint, so its depth is 0 or 1; int8 cannot overflow.
    in_a = np.cumsum(step_a[order], dtype=np.int8) > 0
    in_b = np.cumsum(step_b[order], dtype=np.int8) > 0
    # The state after event i holds on [points[i], points[i+1]); several events at one
    # point leave zero-length segments behind, which the length test drops.
    lo, hi = points[:-1], points[1:]
    mask = want(in_a[:-1], in_b[:-1]) & (hi > lo)
    return union((lo[mask], hi[mask]))


def intersect(a, b) -> Intervals:
    """Time covered by both ``a`` and ``b``."""
    return _combine(a, b, np.logical_and)


def intersection_length(a, b) -> int:
    return intersect(a, b).length


def subtract(a, b) -> Intervals:
    """Time covered by ``a`` and not by ``b``."""
    return _combine(a, b, lambda x, y: x & ~y)


def clip(intervals, lo: int, hi: int) -> Intervals:
    """The part of each interval inside the window [lo, hi); empties dropped. The result
    is normalised only if the input was."""
    s, e = as_intervals(intervals)
    s = np.clip(s, lo, hi)
    e = np.clip(e, lo, hi)
    keep = e > s
    return Intervals(s[keep], e[keep])


def covers(normalised: Intervals, points) -> np.ndarray:
    """For each point, whether the normalised set contains it."""
    p = np.asarray(points, dtype=np.int64)
    if len(normalised) == 0:
        return np.zeros(p.shape, dtype=bool)
    i = np.searchsorted(normalised.starts, p, side="right") - 1
    inside = i >= 0
    inside[inside] = p[inside] < normalised.ends[i[inside]]
    return inside


def grouped_union_length(groups, intervals) -> pd.Series:
    """Union length of the intervals of each group: a Series indexed by the group labels
    present (in sorted order) holding int64 nanoseconds. Groups whose intervals are all
    empty get 0."""
    s, e = as_intervals(intervals)
    g = pd.Series(np.asarray(groups)).reset_index(drop=True)
    if len(g) != len(s):
        raise ValueError("groups and intervals differ in length")
    codes, labels = pd.factorize(g, sort=True)
    out = np.zeros(len(labels), dtype=np.int64)
    keep = (e > s) & (codes >= 0)
    if not keep.any():
        return pd.Series(out, index=pd.Index(labels), dtype="int64")
    c, s, e = codes[keep].astype(np.int64), s[keep], e[keep]
    lo = int(s.min())
    span = int(e.max()) - lo + 1
    if len(labels) * span < 2**62:
        # Lay the groups end to end on one axis (group g owns [g*span, (g+1)*span)):
        # one plain union then merges within groups and never across them.
        shift = c * span - lo
        merged = union((s + shift, e + shift))
        np.add.at(out, merged.starts // span, merged.ends - merged.starts)
    else:
        order = np.lexsort((s, c))
        c, s, e = c[order], s[order], e[order]
        reach = pd.Series(e).groupby(c, sort=False).cummax().to_numpy()
        first = np.empty(len(s), dtype=bool)
        first[0] = True
        first[1:] = (c[1:] != c[:-1]) | (s[1:] > reach[:-1])
        heads = np.flatnonzero(first)
        tails = np.append(heads[1:] - 1, len(s) - 1)
        np.add.at(out, c[heads], reach[tails] - s[heads])
    return pd.Series(out, index=pd.Index(labels), dtype="int64")


def covered_before(spans: Intervals, points) -> np.ndarray:
    """For a normalised interval set, the time it covers before each point (int64 ns)."""
    points = np.asarray(points, dtype=np.int64)
    if not len(spans):
        return np.zeros(points.shape, dtype=np.int64)
    lengths = spans.ends - spans.starts
    before = np.concatenate([[0], np.cumsum(lengths)])
    i = np.searchsorted(spans.starts, points, side="right") - 1
    inside = np.clip(points - spans.starts[np.maximum(i, 0)], 0, lengths[np.maximum(i, 0)])
    return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)
