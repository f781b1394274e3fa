"""Who encloses whom on a thread (advisor.session.attribute): the vectorised searches give
what a stack walk over the sorted intervals gives, on any intervals, nested or not."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.session import PHASES
from advisor.session.attribute import _innermost_containing, _phase_segments, parents_of_sorted
from advisor.session.session import start_order


def stack_walk(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The specification: pop the top while it has ended (a zero-length interval at this
    very start still counts as open); what is left on top encloses this interval."""
    parents = [-1] * len(starts)
    stack: list[int] = []
    for i, s in enumerate(starts.tolist()):
        while stack and ends[stack[-1]] <= s and not (ends[stack[-1]] == s == starts[stack[-1]]):
            stack.pop()
        if stack:
            parents[i] = stack[-1]
        stack.append(i)
    return np.asarray(parents, dtype="int64")


def walk_up(starts, ends, ids, parents, points) -> np.ndarray:
    """The specification: the latest op starting at or before the point, or the first of
    its ancestors that has not ended before it."""
    found = []
    for point in points.tolist():
        j = int(np.searchsorted(starts, point, side="right")) - 1
        while j >= 0 and ends[j] < point:
            j = int(parents[j])
        found.append(int(ids[j]) if j >= 0 else -1)
    return np.asarray(found, dtype="int64")


intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20), st.booleans()), max_size=80)


def _sorted(spans):
    starts = np.array([s for s, _, _ in spans], dtype="int64")
    ends = starts + np.array([0 if zero else d for _, d, zero in spans], dtype="int64")
    order = np.lexsort((-ends, starts))
    return starts[order], ends[order]


@settings(max_examples=400, deadline=None)
@given(intervals)
def test_start_order_is_by_start_then_outer_first_then_as_given(spans):
    """The specification: Python's stable sort on (start, -end); many ties on both keys."""
    starts = np.array([s for s, _, _ in spans], dtype="int64")
    ends = starts + np.array([0 if zero else d for _, d, zero in spans], dtype="int64")
    expected = sorted(range(len(spans)), key=lambda i: (starts[i], -ends[i]))
    assert start_order(starts, ends).tolist() == expected


@settings(max_examples=400, deadline=None)
@given(intervals)
def test_parents_are_the_stack_walks(spans):
    starts, ends = _sorted(spans)
    assert parents_of_sorted(starts, ends).tolist() == stack_walk(starts, ends).tolist()


@settings(max_examples=300, deadline=None)
@given(intervals.filter(bool), st.lists(st.integers(-5, 90), max_size=30))
def test_innermost_containing_walks_up_as_the_stack_would(spans, points):
    starts, ends = _sorted(spans)
    parents = stack_walk(starts, ends)
    ids = np.arange(len(starts), dtype="int64")[::-1].copy()
    points = np.array(points, dtype="int64")
    assert _innermost_containing(starts, ends, ids, parents, points).tolist() == \
        walk_up(starts, ends, ids, parents, points).tolist()


def test_long_runs_of_siblings_and_deep_nesting():
    siblings = np.arange(0, 200_000, 2, dtype="int64")
    assert (parents_of_sorted(siblings, siblings + 1) == -1).all()
    deep_starts = np.arange(5000, dtype="int64")
    deep_ends = 10_000 - deep_starts
    assert parents_of_sorted(deep_starts, deep_ends).tolist() == list(range(-1, 4999))


def covering_scan(starts, ends, names):
    """The specification of phase segments: each piece between two bounds takes the
    latest-starting range covering it (ties: the later in the trace)."""
    bounds = np.unique(np.concatenate([starts, ends]))
    order = np.argsort(starts, kind="stable")
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        covering = order[(starts[order] <= a) & (ends[order] >= b)]
        if len(covering):
            out.append((int(a), int(b), names[covering[-1]]))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15), st.sampled_from(PHASES)), max_size=40))
def test_phase_segments_take_the_innermost_range(ranges):
    starts = np.array([s for s, _, _ in ranges], dtype="int64")
    ends = starts + np.array([d for _, d, _ in ranges], dtype="int64")
    names = [n for _, _, n in ranges]
    phases = pd.DataFrame({"start_ns": starts, "end_ns": ends, "phase": pd.Categorical(names)})
    seg_start, seg_end, seg_name = _phase_segments(phases)
    assert list(zip(seg_start.tolist(), seg_end.tolist(), seg_name.tolist())) == covering_scan(starts, ends, names)
