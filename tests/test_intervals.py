"""Interval arithmetic: known answers, a brute-force reference on small integer ranges, and
algebraic properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advisor.session import intervals as iv

# Small coordinates so the brute-force reference (a set of covered integer points) is cheap
# and overlaps, touching ends and empty intervals are common.
coordinate = st.integers(min_value=-20, max_value=60)
interval = st.tuples(coordinate, coordinate)
interval_lists = st.lists(interval, max_size=25)


def pair(items):
    if not items:
        return iv.as_intervals([], [])
    s, e = zip(*items)
    return iv.as_intervals(np.array(s), np.array(e))


def points(items) -> set[int]:
    covered = set()
    for s, e in items:
        covered.update(range(s, e))
    return covered


def points_of(result: iv.Intervals) -> set[int]:
    return points(zip(result.starts.tolist(), result.ends.tolist()))


def assert_normalised(result: iv.Intervals):
    assert result.starts.dtype == np.int64 and result.ends.dtype == np.int64
    assert (result.ends > result.starts).all()
    # Sorted, and a gap between neighbours (touching intervals are merged).
    assert (result.starts[1:] > result.ends[:-1]).all()


def test_union_merges_overlapping_and_touching():
    u = iv.union(pair([(10, 20), (0, 5), (15, 30), (30, 35), (40, 41), (50, 50)]))
    assert u.starts.tolist() == [0, 10, 40]
    assert u.ends.tolist() == [5, 35, 41]
    assert u.length == 5 + 25 + 1


def test_nested_interval_does_not_end_the_run():
    # The short inner interval ends before the outer one: the run must reach 100.
    u = iv.union(pair([(0, 100), (10, 20), (50, 60), (99, 101)]))
    assert list(zip(u.starts, u.ends)) == [(0, 101)]


def test_empty_inputs():
    assert iv.total_length(pair([])) == 0
    assert iv.intersect(pair([]), pair([(0, 5)])).length == 0
    assert iv.subtract(pair([(0, 5)]), pair([])).length == 5
    assert len(iv.union(pair([(5, 5), (7, 3)]))) == 0
    assert iv.grouped_union_length([], pair([])).empty


def test_intersect_subtract_clip_known():
    a = pair([(0, 10), (20, 30)])
    b = pair([(5, 25)])
    assert list(zip(*iv.intersect(a, b))) == [(5, 10), (20, 25)]
    assert list(zip(*iv.subtract(a, b))) == [(0, 5), (25, 30)]
    assert list(zip(*iv.clip(a, 8, 22))) == [(8, 10), (20, 22)]


def test_covers():
    u = iv.union(pair([(0, 10), (20, 30)]))
    assert iv.covers(u, [-1, 0, 9, 10, 15, 20, 29, 30]).tolist() == [
        False, True, True, False, False, True, True, False,
    ]
    assert iv.covers(iv.EMPTY, [1, 2]).tolist() == [False, False]


def test_grouped_union_length_known():
    lengths = iv.grouped_union_length(
        ["b", "a", "a", "b", "c"], pair([(0, 10), (0, 10), (5, 15), (20, 25), (3, 3)])
    )
    assert lengths.to_dict() == {"a": 15, "b": 15, "c": 0}


def test_large_values_are_exact():
    base = 1_700_000_000_000_000_000  # epoch nanoseconds: must not go through float
    u = iv.union(pair([(base + 1, base + 3), (base + 2, base + 7)]))
    assert u.starts.tolist() == [base + 1] and u.ends.tolist() == [base + 7]


def test_subtract_and_intersect_at_the_ends_of_int64():
    # subtract works on the gaps of b, the first and last reaching int64's ends: intervals
    # that reach them too must neither wrap around nor leave an empty gap behind.
    lowest, highest = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    a = iv.as_intervals(np.array([lowest, 0, 10]), np.array([-5, 5, highest]))
    b = iv.as_intervals(np.array([lowest, 3]), np.array([-7, 20]))
    assert list(zip(*iv.subtract(a, b))) == [(-7, -5), (0, 3), (20, highest)]
    assert list(zip(*iv.intersect(a, b))) == [(lowest, -7), (3, 5), (10, 20)]
    assert list(zip(*iv.subtract(b, a))) == [(5, 10)]
    assert len(iv.subtract(a, a)) == 0
    # Time before b's first interval, down to int64's lowest, is outside b: all of it is kept.
    whole = iv.as_intervals(np.array([lowest]), np.array([10]))
    assert list(zip(*iv.subtract(whole, iv.as_intervals(np.array([0]), np.array([5]))))) == [(lowest, 0), (5, 10)]


def test_results_are_arrays_of_their_own():
    # A normalised input is read as it is, never handed back: a caller that changes its
    # arrays afterwards must not change a result.
    a = iv.union(pair([(0, 10), (20, 30)]))
    for result in (iv.subtract(a, iv.EMPTY), iv.intersect(a, pair([(-5, 50)]))):
        assert not np.shares_memory(result.starts, a.starts)
        assert not np.shares_memory(result.ends, a.ends)


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError):
        iv.as_intervals([1, 2], [3])


@given(interval_lists)
def test_union_matches_reference(items):
    u = iv.union(pair(items))
    assert_normalised(u)
    assert points_of(u) == points(items)
    assert u.length == len(points(items))


@given(interval_lists)
def test_union_length_at_most_sum_of_lengths(items):
    assert iv.total_length(pair(items)) <= sum(max(e - s, 0) for s, e in items)


@given(interval_lists)
def test_union_is_idempotent(items):
    once = iv.union(pair(items))
    twice = iv.union(once)
    assert once.starts.tolist() == twice.starts.tolist()
    assert once.ends.tolist() == twice.ends.tolist()


@given(interval_lists, interval_lists)
def test_intersection_and_subtraction_match_reference(a, b):
    inter = iv.intersect(pair(a), pair(b))
    diff = iv.subtract(pair(a), pair(b))
    assert_normalised(inter)
    assert_normalised(diff)
    assert points_of(inter) == points(a) & points(b)
    assert points_of(diff) == points(a) - points(b)


@given(interval_lists, interval_lists)
def test_intersection_is_symmetric_and_partitions(a, b):
    ab = iv.intersection_length(pair(a), pair(b))
    assert ab == iv.intersection_length(pair(b), pair(a))
    # |A| = |A and B| + |A without B|
    assert iv.total_length(pair(a)) == ab + iv.subtract(pair(a), pair(b)).length


@given(interval_lists, coordinate, coordinate)
def test_clip_matches_reference(items, lo, hi):
    clipped = iv.union(iv.clip(pair(items), lo, hi))
    assert points_of(clipped) == {p for p in points(items) if lo <= p < hi}


@given(interval_lists, st.lists(coordinate, max_size=20))
def test_covers_matches_reference(items, probe):
    u = iv.union(pair(items))
    covered = points(items)
    assert iv.covers(u, probe).tolist() == [p in covered for p in probe]


@given(st.lists(st.tuples(st.sampled_from("xyz"), interval), max_size=30))
def test_grouped_union_length_matches_per_group_union(rows):
    groups = [g for g, _ in rows]
    lengths = iv.grouped_union_length(groups, pair([i for _, i in rows]))
    for g in set(groups):
        assert lengths[g] == iv.total_length(pair([i for h, i in rows if h == g]))


def test_unsorted_input_with_permutation():
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 10**9, 10_000)
    ends = starts + rng.integers(0, 10**6, 10_000)
    order = rng.permutation(len(starts))
    shuffled = iv.union(iv.as_intervals(starts[order], ends[order]))
    ordered = iv.union(iv.as_intervals(starts, ends))
    assert shuffled.starts.tolist() == ordered.starts.tolist()
    assert shuffled.ends.tolist() == ordered.ends.tolist()


def test_grouped_union_length_with_huge_span_takes_the_safe_path():
    # Group count times time span overflows int64: the per-group sort path must be used.
    big = 2**61
    lengths = iv.grouped_union_length(
        [0, 1, 2, 3, 0], pair([(0, 10), (big, big + 5), (-big, -big + 1), (5, 6), (5, 20)])
    )
    assert lengths.to_dict() == {0: 20, 1: 5, 2: 1, 3: 1}


@given(st.lists(st.integers(-(2**62), 2**62), max_size=200))
def test_distinct_is_numpy_unique(values):
    expected = np.unique(np.asarray(values, dtype=np.int64))
    got = iv.distinct(values)
    assert got.dtype == np.int64 and np.array_equal(got, expected)
