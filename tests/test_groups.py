"""advisor.step.facts' grouping helpers (Groups, sums_by, stats, most_common, top_names)
against the pandas groupby each stands in for, on generated keys and values with missing
ones among them: the tables' figures must not move when they group by numpy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.step.facts import Groups, most_common, stats, sums_by, top_names

ROWS = st.integers(min_value=0, max_value=40)


def columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    key = rng.integers(-1, 6, n).astype(float)
    key[rng.random(n) < 0.15] = np.nan  # a missing key is in no group
    value = rng.integers(-1, 4, n).astype(float)
    value[rng.random(n) < 0.15] = np.nan
    return {"key": key, "value": value, "ns": rng.integers(0, 10**6, n), "flag": rng.random(n) < 0.5,
            "name": rng.choice(np.array(["a", "b", "c", "d"], dtype=object), n)}


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values, missing where missing."""
    return len(got) == len(want) and bool((pd.isna(got) == pd.isna(want)).all()) and all(
        g == w for g, w, gone in zip(got, want, pd.isna(got)) if not gone)


@settings(max_examples=150, deadline=None)
@given(ROWS, st.integers(0, 2**32 - 1), st.booleans())
def test_groups_reduce_as_a_pandas_groupby(n, seed, sort):
    c = columns(n, seed)
    frame = pd.DataFrame(c)
    theirs = frame.groupby("key", sort=sort)
    mine = Groups(c["key"], sort=sort)
    assert np.array_equal(mine.keys, theirs.size().index.to_numpy())
    expected = {
        "size": (mine.size(), theirs.size()),
        "sum of values": (mine.sum(c["value"]), theirs["value"].sum()),
        "sum of ints": (mine.sum(c["ns"]), theirs["ns"].sum()),
        "count": (mine.count(c["value"]), theirs["value"].count()),
        "min": (mine.min(c["value"]), theirs["value"].min()),
        "max": (mine.max(c["ns"]), theirs["ns"].max()),
        "any": (mine.any(c["flag"]), theirs["flag"].any()),
        "first value": (mine.first(c["value"]), theirs["value"].first()),
        "first name": (mine.first(c["name"]), theirs["name"].first()),
    }
    for what, (got, want) in expected.items():
        want = want.to_numpy()
        assert same(got, want), what
        assert len(got) == 0 or got.dtype == want.dtype or what.startswith("first"), what


@settings(max_examples=150, deadline=None)
@given(ROWS, st.integers(0, 2**32 - 1))
def test_sums_stats_and_most_common_match_pandas(n, seed):
    c = columns(n, seed)
    frame = pd.DataFrame(c)
    theirs = frame.groupby("key")
    sums = sums_by(c["key"], {"value": c["value"], "ns": c["ns"]}, unknown_if_none=("value",))
    assert np.array_equal(sums["value"].to_numpy(), theirs["value"].sum(min_count=1).to_numpy(), equal_nan=True)
    assert np.array_equal(sums["ns"].to_numpy(), theirs["ns"].sum().to_numpy())

    keys = np.nan_to_num(c["key"], nan=-1).astype(np.int64)  # the tables' keys are codes, never missing
    got = stats(keys, c["ns"], prefix="cpu")
    by = pd.DataFrame({"key": keys, "d": c["ns"]}).groupby("key")["d"]
    pd.testing.assert_frame_equal(got, pd.DataFrame({"calls": by.size(), "cpu_total_ns": by.sum(), "cpu_max_ns": by.max(),
                                                     "cpu_min_ns": by.min(), "cpu_avg_ns": by.sum() / by.size()}))

    common = most_common(keys, c["value"], missing=-1)
    kept = pd.DataFrame({"k": keys, "v": c["value"]})
    kept = kept[kept["v"].notna() & (kept["v"] != -1)]
    counts = kept.groupby(["k", "v"]).size().rename("n").reset_index()
    best = counts.sort_values(["k", "n"], ascending=[True, False], kind="stable").drop_duplicates("k")
    assert common.to_dict() == dict(zip(best["k"], best["v"]))  # the most frequent, ties to the smallest


def test_top_names_are_the_heaviest_per_key_heaviest_first():
    keys = np.array([1, 1, 1, 2, 2, 1])
    names = np.array([0, 1, 2, 0, 0, 1])
    weights = np.array([5.0, 1.0, 3.0, 2.0, 2.0, 9.0])
    got = top_names(keys, names, weights, limit=2, labels=np.array(["x", "y", "z"], dtype=object))
    assert got.to_dict() == {1: "y; x", 2: "x"}
