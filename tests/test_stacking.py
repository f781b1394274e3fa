"""Event frames stacked (advisor.session.session.concat_events): categorical columns come out
as union_categoricals makes them, whichever way they are stacked."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st
from pandas.api.types import union_categoricals

from advisor.session.session import EVENT_COLUMNS, _stacked_categories, concat_events, conform_events

names = st.sampled_from(["aten::mm", "aten::add", "", "kernel_a", "ProfilerStep#3", "Forward", "copy"])
columns = st.lists(st.one_of(names, st.none()), max_size=12)


def categorical(values: list[str | None]) -> pd.Categorical:
    return pd.Categorical(values) if any(v is not None for v in values) else pd.Categorical(values, categories=[])


@given(columns, st.lists(columns, min_size=1, max_size=3))
def test_stacked_categories_are_union_categoricals(first, others):
    arrays = [categorical(first), *(categorical(o) for o in others)]
    kinds = {a.categories.dtype for a in arrays if len(a.categories)}
    expected_input = arrays
    if len(kinds) == 1:
        kind = kinds.pop()
        expected_input = [a if a.categories.dtype == kind else a.set_categories(a.categories.astype(kind))
                          for a in arrays]
    expected = union_categoricals(expected_input)
    got = _stacked_categories(arrays)
    assert list(got.categories) == list(expected.categories)
    assert got.codes.tolist() == expected.codes.tolist()
    assert got.codes.dtype == expected.codes.dtype


def _events(n: int, names: list[str], start: int) -> pd.DataFrame:
    return conform_events(pd.DataFrame({
        "name": pd.Categorical([names[i % len(names)] for i in range(n)]),
        "kind": pd.Categorical(["op"] * n),
        "start_ns": np.arange(start, start + 10 * n, 10, dtype="int64"),
        "end_ns": np.arange(start + 5, start + 10 * n + 5, 10, dtype="int64"),
    }))


def test_conformed_frames_stack_the_same_either_way():
    # The few rows stacked under many, some of their names new (union_categoricals' path),
    # some not (codes mapped onto the first's categories).
    for few in (["aten::mm"], ["aten::mm", "Optimizer.step"]):
        frames = [_events(50, ["aten::mm", "aten::add"], 0), _events(3, few, 7)]
        trusted = concat_events(frames, by_start=True, conformed=True)
        checked = concat_events(frames, by_start=True)
        pd.testing.assert_frame_equal(trusted, checked, check_exact=True)
        assert list(trusted.columns) == list(EVENT_COLUMNS)
        assert (np.diff(trusted["start_ns"].to_numpy()) >= 0).all()
        assert trusted["name"].astype(str).tolist()[:3] == ["aten::mm", "aten::mm", "aten::add"]  # by start
