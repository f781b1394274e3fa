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


def test_the_perf_summary_says_which_steps_it_leaves_out():
    """The Perf Summary is over the steady steps; a timer over every step would differ, so
    the table says which step it left out and why."""
    perf = compute_tables(steady_of(session([60, 10, 11, 10])), ["perf"])["perf"]
    assert perf.at["batch_cost", "max"] == pytest.approx(11 * MS)
    (note,) = [n for n in perf.attrs["notes"] if "set apart" in n]
    assert note.startswith("Over the 3 steady steps: 1 step set apart left out (step #1:")
    steady = compute_tables(session([10, 10, 11, 10]), ["perf"])["perf"]
    assert not [n for n in steady.attrs["notes"] if "set apart" in n]


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


def _busy_run(seed: int = 0):
    """40 steps of a loop that validates every 8 on a loaded machine: a steady step is 50 ms
    of CPU time and a validation step 50 ms more, but the wall time of each swings 1x-4x
    with the load (a step waits for a core), so on wall time alone the spikes drown."""
    rng = np.random.default_rng(seed)
    cpu = np.full(40, 50.0)
    calls = [{"Forward": 1, "Backward": 1, "Optimization": 1} for _ in range(40)]
    for n in range(7, 40, 8):
        cpu[n] += 50.0
        calls[n] = {**calls[n], "Forward without grad": 12}
    took = cpu * (1 + 3 * rng.random(40))
    return took, cpu, calls


def test_periodic_work_is_found_on_a_busy_machine_by_the_steps_shape_and_cpu_time():
    from advisor.step.window import periodic_steps

    took, cpu, calls = _busy_run()
    numbers = np.arange(40)
    assert periodic_steps(numbers, took * MS, source="timed steps") is None, "wall time alone misses it here"
    by_cpu = periodic_steps(numbers, took * MS, source="timed steps", cpu=cpu * MS)
    assert by_cpu is not None and (by_cpu.every, by_cpu.steps, by_cpu.signal) == (8, (7, 15, 23, 31, 39), "CPU time")
    by_shape = periodic_steps(numbers, took * MS, source="timed steps", cpu=cpu * MS, calls=calls)
    assert by_shape is not None and (by_shape.every, by_shape.signal) == (8, "forward calls")
    assert by_shape.no_grad is True, "its extra forwards ran with autograd off"
    assert by_shape.extra_ns > 0


def test_a_recurring_shape_that_costs_nothing_is_not_periodic_work():
    from advisor.step.window import periodic_steps

    took = np.full(40, 50.0)
    calls = [{"Forward": 1 + (n % 8 == 7), "Backward": 1} for n in range(40)]  # a cheap extra call
    assert periodic_steps(np.arange(40), took * MS, source="timed steps", calls=calls) is None


def test_a_period_most_of_whose_steps_are_not_slow_is_not_one():
    took = [4.0] * 64
    for n in (7, 15, 23):  # then it stops: 3 of the 8 steps on the period
        took[n] = 20.0
    assert _periodic(took) is None


def test_evaluation_with_autograd_on_is_told_to_use_no_grad_and_named_by_its_caller():
    # Every 8 steps the loop validates: twelve extra forwards with autograd on, 50 ms more.
    from advisor.diagnosis import diagnose
    from advisor.session import TimedStep

    t = Trace()
    for n in range(2, 7):
        base = 50.0 * n
        t.step(n, base, base + 50)
        t.phase("Forward", base, base + 20)
        t.phase("Backward", base + 20, base + 45)
        t.op("aten::mm", base + 1, base + 19)
    session = t.session(gpu_measured=False)
    timed = []
    for n in range(40):
        extra = n % 8 == 7
        timed.append(TimedStep(step=n, start_ns=int(n * 50 * MS), duration_ns=int((100 if extra else 50) * MS),
                               recorded=2 <= n < 7, phases={"Forward": int((70 if extra else 20) * MS)},
                               cpu_ns=int((100 if extra else 50) * MS),
                               calls={"Forward": 13 if extra else 1, "Backward": 1, "Optimization": 1}))
    session.meta.timed_steps = timed
    (finding,) = [f for f in diagnose(session).findings if f.rule == "periodic-step-work"]
    assert finding.metrics["no_grad"] is False
    assert finding.recommendation.startswith("Run the evaluation under torch.no_grad()")


# -- stalled steps -------------------------------------------------------------------------------

def _timed_run(durations_ms: list[float]):
    """Five recorded steps (#2-#6) and, after them, one unrecorded step per duration: the
    session as the collector's clock timed it."""
    from advisor.session import TimedStep

    t = Trace()
    for n in range(2, 7):
        base = 10.0 * n
        t.step(n, base, base + 10)
        t.phase("Dataloader", base, base + 8)
        t.op("aten::mm", base + 8.5, base + 9.5)
    session = t.session(gpu_measured=False)
    took = [10.0] * 5 + list(durations_ms)
    loading = [8.0] * 5 + [d - 2 for d in durations_ms]
    start, timed = 20.0, []
    for i, (d, load) in enumerate(zip(took, loading)):
        timed.append(TimedStep(step=i + 2, start_ns=int(start * MS), duration_ns=int(d * MS), recorded=i < 5,
                               phases={"Dataloader": int(load * MS)}))
        start += d
    session.meta.timed_steps = timed
    return session


def test_one_step_a_pause_stopped_is_set_apart_from_the_job_s_pace_and_said():
    """A full collection of the garbage collector stopped one read of a loader for 190 ms
    among steps of 8 ms (a struct-decoding Dataset under advisor): in the mean of 70 steps it
    added 2.6 ms to each, and to the loader's fix."""
    from advisor.diagnosis import report_steps

    durations = [8.0 + 0.1 * (i % 5) for i in range(71)]
    durations[47] = 190.0
    model = build_step_model(_timed_run(durations))
    times = model.times
    assert times.stalled["step"].tolist() == [54]
    # The first step after the window (it stops the profiler) is left out as ever.
    assert times.unrecorded_step_ns == pytest.approx(np.mean(durations[1:47] + durations[48:]) * MS)
    timing = compute_tables(model.session, ["step_timing"])["step_timing"]
    assert timing.at["Dataloader", "unrecorded_avg_ns"] < 6.5 * MS, "the pause is not the loader's"
    (stall,) = report_steps(model).stalled
    assert (stall.step, stall.duration_ns) == (54, 190 * MS) and stall.times_median == pytest.approx(23.2, abs=0.1)


@pytest.mark.parametrize("slow", [
    [10, 30],  # two in 39: the loop's own, however slow
    [],  # none far over the median
])
def test_slow_steps_that_recur_or_are_not_far_over_the_median_stay_in_the_mean(slow):
    durations = [8.0] * 40
    for n in slow:
        durations[n] = 190.0
    durations[25] = 70.0  # 8.75x the median: slow, not a stall
    times = build_step_model(_timed_run(durations)).times
    assert times.stalled.empty
    assert times.unrecorded_step_ns == pytest.approx(np.mean(durations[1:]) * MS), "the first after the window goes"


def test_a_stall_among_too_few_steps_cannot_be_told_from_their_spread_nor_many_slow_steps_called_stalls():
    from advisor.step.timing import isolated_stalls

    assert isolated_stalls(np.array([8.0] * 8 + [190.0])).size == 0
    assert isolated_stalls(np.array([8.0] * 9 + [190.0])).tolist() == [9]
    # A long run's slow steps that keep coming (a per-sample loop's, 80 in 2000) are its own.
    long = np.full(400, 0.4 * MS)
    long[[50, 150, 250]] = 5.0 * MS
    assert isolated_stalls(long).tolist() == [50, 150, 250]
    long[350] = 5.0 * MS
    assert isolated_stalls(long).size == 0


# -- gradient accumulation -----------------------------------------------------------------------

@pytest.mark.parametrize("every, said", [(4, True), (1, False), (None, False)])
def test_gradient_accumulation_is_said_so_a_step_reads_as_one_batch(every, said):
    """A loop that steps the optimizer every 4 batches: advisor's step is one batch (its
    figures per step a quarter of the script's own timer's), which the report says."""
    from advisor.session import TimedStep

    t = Trace()
    for n in range(2, 7):
        t.step(n, 10.0 * n, 10.0 * n + 10)
        t.phase("Forward", 10.0 * n, 10.0 * n + 5)
    session = t.session(gpu_measured=False)
    session.meta.timed_steps = [
        TimedStep(step=n, start_ns=int(n * 10 * MS), duration_ns=int(10 * MS), recorded=2 <= n < 7,
                  calls={"Forward": 1, "Backward": 1,
                         **({"Optimization": 2} if every is not None and n % every == every - 1 else {})})
        for n in range(40)]
    notes = [n for n in steady_of(session).meta.collector.notes if "gradient accumulation" in n]
    if said:
        assert notes == ["The optimizer steps once every 4 steps (gradient accumulation): a step here is one batch, "
                         "its forward and backward, and an optimizer step 4 of them; figures per step are per batch, "
                         "their shares of the step the same either way."]
    else:
        assert not notes
