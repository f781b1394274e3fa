"""A start-up first step (far slower than the steps after it) is left out of the window,
so the tables and rules judge the steady steps, and the report says so."""

from __future__ import annotations

import numpy as np
import pytest
from builders import Trace

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


# -- periodic steps ------------------------------------------------------------------------------

def _periodic(durations: list[float]):
    from advisor.step.window import periodic_steps

    return periodic_steps(np.arange(len(durations)), np.asarray(durations) * MS, source="timed steps")


def test_validation_every_8_steps_is_found_past_a_slow_warm_up_and_its_own_after_effect():
    # The first steps run slower while the loop warms up (a global median would call them
    # slow too); each validation step is followed by one a little slow (the model back in
    # train mode): neither hides the period.
    took = [14, 7, 7.5, 8, 8, 8, 7] + [4.0] * 57
    for n in range(7, 64, 8):
        took[n] = 27.0
    took[16], took[56] = 7.9, 5.6
    found = _periodic(took)
    assert found is not None and found.every == 8
    assert found.steps == tuple(range(7, 64, 8))
    assert found.extra_ns == pytest.approx(23 * MS, rel=0.05)


def test_two_stray_slow_steps_are_not_a_period():
    rng = np.random.default_rng(0)
    took = list(4 + rng.random(40) * 0.4)
    took[5], took[23] = 9.0, 8.0  # a garbage collection, a page fault: 2x, not 3x
    assert _periodic(took) is None


def test_a_long_run_validating_twice_is_a_period_where_each_is_far_slower():
    took = [4.0] * 64
    took[31] = took[63] = 30.0
    found = _periodic(took)
    assert found is not None and (found.every, found.steps) == (32, (31, 63))


def test_a_period_most_of_whose_steps_are_not_slow_is_not_one():
    took = [4.0] * 64
    for n in (7, 15, 23):  # then it stops: 3 of the 8 steps on the period
        took[n] = 20.0
    assert _periodic(took) is None
