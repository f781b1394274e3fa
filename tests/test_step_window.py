"""A start-up first step (far slower than the steps after it) is left out of the window,
so the tables and rules judge the steady steps, and the report says so."""

from __future__ import annotations

import pytest
from test_tables import Trace

from advisor.step import build_step_model
from advisor.tables import compute_tables

MS = 1_000_000


def steady_of(session):
    """The session as its step model judges it."""
    return build_step_model(session).session


def session(durations: list[float]):
    t = Trace()
    start = 0.0
    for number, took in enumerate(durations, 1):
        t.step(number, start, start + took)
        t.phase("Forward", start, start + took / 2)
        t.op("aten::mm", start + 1, start + took / 2)
        start += took
    return t.session()


def test_a_first_step_three_times_the_others_is_left_out():
    steady = steady_of(session([60, 10, 11, 10]))
    assert steady.steps()["step"].tolist() == [2, 3, 4]
    assert steady.window() == (60 * MS, 91 * MS)
    model = compute_tables(steady, ["model"])["model"]
    assert model.at["ProfileStep", "calls"] == 3 and model.at["ProfileStep", "cpu_avg_ns"] == pytest.approx(31 / 3 * MS)
    (note,) = [n for n in steady.meta.collector.notes if n.startswith("Set apart from the window (start-up step")]
    assert "step #1" in note and "6.0 times the median" in note
    # The step's own event is kept, as a plain range.
    assert "ProfilerStep#1" in set(steady.events["name"].astype(str))


@pytest.mark.parametrize("durations", [[25, 10, 10, 10], [60, 10], [10, 10, 10]])
def test_a_steady_first_step_or_too_few_steps_change_nothing(durations):
    original = session(durations)
    steady = steady_of(original)
    assert steady.steps()["step"].tolist() == original.steps()["step"].tolist()
    assert steady.window() == original.window()
