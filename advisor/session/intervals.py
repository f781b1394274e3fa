"""Set arithmetic on half-open time intervals [start, end) in int64 nanoseconds.

The summary tables measure time as unions: two kernels that overlap on two streams keep
the GPU busy once, not twice. Everything here is vectorised: a union of millions of events
costs one ``argsort`` (none where they come sorted), an intersection or a difference of
two normalised sets a binary search of one in the other.

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
    "distinct",
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


def _normalised(intervals) -> Intervals:
    """``intervals`` normalised: as they are where they already are (the result of
    another operation here, mostly), else their union. Only read, never written."""
    s, e = as_intervals(intervals)
    if (e > s).all() and (s[1:] > e[:-1]).all():
        return Intervals(s, e)
    return union((s, e))


def intersect(a, b) -> Intervals:
    """Time covered by both ``a`` and ``b``."""
    a, b = _normalised(a), _normalised(b)
    if not len(a) or not len(b):
        return EMPTY
    # Each interval of ``a`` meets a run of ``b``'s: those ending after it starts and
    # starting before it ends. Each meeting is one piece of the result, in order, and
    # pieces neither overlap nor touch because neither set's intervals do. No sort of
    # both sets' ends together, which holds every end of both at once.
    first = np.searchsorted(b.ends, a.starts, side="right")
    count = np.searchsorted(b.starts, a.ends, side="left") - first
    np.maximum(count, 0, out=count)
    total = int(count.sum())
    if not total:
        return EMPTY
    i = np.repeat(np.arange(len(a)), count)
    # j runs from first[i] up, one per piece of the same interval of ``a``.
    j = np.arange(total, dtype=np.int64)
    j -= np.repeat(np.cumsum(count) - count - first, count)
    starts = np.maximum(a.starts[i], b.starts[j])
    ends = np.minimum(a.ends[i], b.ends[j])
    return Intervals(starts, ends)


def intersection_length(a, b) -> int:
    return intersect(a, b).length


_BEFORE_ALL, _AFTER_ALL = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def subtract(a, b) -> Intervals:
    """Time covered by ``a`` and not by ``b``: ``a`` within the gaps of ``b``."""
    b = _normalised(b)
    if not len(b):
        a = _normalised(a)
        return Intervals(a.starts.copy(), a.ends.copy())  # a result of its own, as ever
    gap_starts = np.concatenate([[_BEFORE_ALL], b.ends])
    gap_ends = np.concatenate([b.starts, [_AFTER_ALL]])
    return intersect(a, (gap_starts, gap_ends))


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


def distinct(values) -> np.ndarray:
    """The distinct values among ``values`` (int64: time points, row ids), sorted: ``np.unique`` by a
    sort, which numpy 2.4's hashing unique is not (1.3 s for a million random int64 where
    a sort takes 0.02 s)."""
    values = np.sort(np.asarray(values, dtype=np.int64), kind="stable")
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]
