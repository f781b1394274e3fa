"""A run recorded on a busy machine, weighed as on a quiet one (advisor.step.load): Python
time by the share its thread ran, operator calls by their time at one thread, so that a
fix's share of the step is the quiet machine's. Hand-made sessions with known answers; the
scripts under load are benchmarks/under_load.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import REPO, Trace

from advisor.session import intervals as iv
from advisor.step.load import weighed_per_step
from advisor.step.model import build_step_model
from advisor.step.whatif import Fix, what_if

ADDMM = {"input_dims": "[[256],[64,512],[512,256],[],[]]", "input_types": '["float","float","float","Scalar","Scalar"]',
         "concrete_inputs": '["","","","1","1"]'}
WAITED = 0.8  # the main thread waited for a core 80 % of its run
ONE_THREAD_MS = 2.0  # the addmm at one thread; on two threads, between 1 and 2 ms


def session(*, busy: bool = True, retimed: bool = True, gpu_measured: bool = False, samples: str = "",
            allreduce: bool = False, accumulators: int = 0):
    """Four steps of 100 ms as a loaded machine recorded them: 20 ms of loading in Python,
    then a Forward phase of one matrix multiply that waited 79 ms for its threads (and where
    ``samples`` is a stack, the main thread sampled there three times a step)."""
    t = Trace()
    for number in range(1, 5):
        base = 100.0 * (number - 1)
        t.step(number, base, base + 100)
        t.phase("Dataloader", base, base + 20)
        t.phase("Forward", base + 20, base + 100)
        t.op("aten::addmm", base + 20.5, base + 99.5, phase="Forward", **ADDMM)
        if allreduce:  # a rank of a job, waiting on the others
            t.op("c10d::allreduce_", base + 99.6, base + 99.9, phase="Forward")
        for k in range(accumulators):  # backward's, one for each parameter's gradient
            t.op("torch::autograd::AccumulateGrad", base + 99.6 + 0.1 * k, base + 99.65 + 0.1 * k, phase="Backward")
        for k in range(3 if samples else 0):
            t.add("stack sample", "stack", base + 30 + 20 * k, base + 31 + 20 * k, phase="Forward", call_stack=samples)
    advisor: dict = {}
    if busy:
        advisor["cpu_wait"] = {"wall_ns": 1_000_000_000, "run_delay_ns": int(WAITED * 1_000_000_000)}
    if retimed:
        advisor["retimed_ops"] = {"threads": 2, "cores": 2.0, "stack_frames": 12, "covered_share": 1.0,
                                  "ops": [{"name": "aten::addmm", **ADDMM, "one_thread_ns": ONE_THREAD_MS * 1e6}]}
    return t.session(gpu_measured=gpu_measured, advisor=advisor)


def loading_share(model) -> float:
    result = what_if(model.graph, Fix("loading gone", host_states={"loading": 0.0}))
    return result.saved_ns / result.before_ns


def test_on_a_busy_machine_the_python_work_weighs_what_ran_and_the_operator_its_one_thread_time():
    model = build_step_model(session())
    assert model.pace.source == "quiet mix" and model.pace.density is not None
    python = 20.0 * (1 - WAITED)  # loading: the share of its 20 ms the thread ran
    operator = ONE_THREAD_MS / math.sqrt(2)  # long enough to split across the job's two threads
    rest = 1.0 * (1 - WAITED)  # the Forward phase's Python around the call
    assert loading_share(model) == pytest.approx(python / (python + operator + rest), rel=1e-3)
    # The step keeps its length at this run's load: only the mix changes.
    assert model.graph.baseline == pytest.approx(100e6, rel=1e-3)
    assert "waited for a core 80%" in model.pace.says and "timed again at one thread" in model.pace.says


def test_a_fixs_spans_inside_a_node_take_their_weighed_share_of_it():
    model = build_step_model(session())
    f = model.facts
    forward = f.phase_intervals("Forward")
    calls = iv.Intervals(np.array([20_500_000 + k * 100_000_000 for k in range(4)], dtype=np.int64),
                         np.array([99_500_000 + k * 100_000_000 for k in range(4)], dtype=np.int64))
    # The multiply gone: its weighed time, not 79 % of the Forward phase's 80 ms.
    gone = what_if(model.graph, Fix("multiply gone", host_spans=((calls, 0.0),)))
    python, operator, rest = 4.0, ONE_THREAD_MS / math.sqrt(2), 0.2
    assert gone.saved_ns / gone.before_ns == pytest.approx(operator / (python + operator + rest), rel=1e-3)
    assert len(forward)


@pytest.mark.parametrize("kind", ["quiet", "not re-timed", "gpu", "a rank of a job"])
def test_the_recorded_mix_stands_where_the_machine_was_quiet_nothing_was_re_timed_or_the_gpu_ran_the_work(kind):
    built = {"quiet": session(busy=False), "not re-timed": session(retimed=False),
             "gpu": session(gpu_measured=True), "a rank of a job": session(allreduce=True)}[kind]
    model = build_step_model(built)
    assert model.pace.source != "quiet mix" and model.pace.density is None
    if kind != "gpu":
        assert loading_share(model) == pytest.approx(0.2, rel=1e-3)


def test_anomaly_modes_stack_capture_is_read_from_the_forward_calls_timed_with_and_without_autograd():
    from advisor.step.load import own_frames
    from advisor.tables.autograd_anomaly import _retimed

    # Innermost first: two frames of the capture, the job's five frames to its <module>, the launcher's.
    stack = ";".join(["/lib/traceback.py(1): extract", "/lib/linecache.py(2): getline", "/torch/nn/linear.py(5): forward",
                      "train.py(9): block", "train.py(20): forward", "train.py(30): main", "train.py(40): <module>",
                      "<frozen runpy>(88): _run_code"])
    assert own_frames(stack) == 5
    built = session()
    # The multiply made again with autograd (2 ms of it the node and its stored stack) and
    # without (1 ms), from 12 frames down; from 22 frames further down, 1.1 ms more: 0.05 ms a frame.
    retimed = built.meta.trace_metadata["advisor"]["retimed_ops"]
    retimed.update(stack_frames=12, deeper_frames=22)
    retimed["ops"][0].update(one_thread_ns=3e6, no_grad_ns=1e6, deeper_ns=4.1e6)
    model = build_step_model(built)
    assert model.pace.mix.job_frames is None  # no samples in a hand-made session: taken at 12 frames
    assert model.pace.mix.forward_autograd_ns == pytest.approx(2e6)
    forward = 1.0 / math.sqrt(2) + 2.0 + 1.0 * (1 - WAITED)  # its own work split, autograd's not; Python around
    assert _retimed(model.facts) == (pytest.approx(2.0 / forward, rel=1e-3), 0.0)
    # With the job's own stacks sampled, five frames deep: 2 ms less 7 frames at 0.05 ms.
    sampled = session(samples=stack)
    sampled.meta.trace_metadata["advisor"]["retimed_ops"] = retimed
    model = build_step_model(sampled)
    assert model.pace.mix.job_frames == 5
    assert model.pace.mix.forward_autograd_ns == pytest.approx(2e6 - 7 * 0.05e6)
    # A quiet run without samples: no depth to take the capture at, the samples' measure stands.
    assert _retimed(build_step_model(session(busy=False)).facts) is None


def test_on_a_quiet_machine_the_capture_is_taken_at_the_sampled_stacks_depth_the_launchers_part_apart():
    from advisor.tables.autograd_anomaly import _retimed

    # The job's five frames and one of the launcher's, as the samples show them.
    stack = ";".join(["/lib/traceback.py(1): extract", "/torch/nn/linear.py(5): forward", "train.py(9): block",
                      "train.py(20): forward", "train.py(30): main", "train.py(40): <module>",
                      "<frozen runpy>(88): _run_code"])
    built = session(busy=False, samples=stack)
    retimed = built.meta.trace_metadata["advisor"]["retimed_ops"]
    retimed.update(stack_frames=12, deeper_frames=22)
    retimed["ops"][0].update(one_thread_ns=3e6, no_grad_ns=1e6, deeper_ns=4.1e6)  # 0.05 ms a frame
    model = build_step_model(built)
    assert model.pace.mix is None  # a quiet run keeps its recorded mix
    # At the job's five frames, then the launcher's one frame costing what each of the job's does.
    own = 2e6 - 7 * 0.05e6
    share, launcher = _retimed(model.facts)
    assert share == pytest.approx(own * 6 / 5 / 80e6, rel=1e-3)  # of the Forward phase's 80 ms a step
    assert launcher == pytest.approx(1 / 6, rel=1e-3)


def test_the_parameters_gradient_accumulators_made_each_step_count_in_the_forwards_autograd_time():
    built = session(accumulators=3)
    retimed = built.meta.trace_metadata["advisor"]["retimed_ops"]
    retimed.update(deeper_frames=22, accumulator={"ns": 0.1e6, "deeper_ns": 0.1e6 + 22 * 0.01e6})
    retimed["ops"][0].update(one_thread_ns=3e6, no_grad_ns=1e6, deeper_ns=3e6)
    # The multiply's node (2 ms), and three accumulators a step at 0.1 ms each.
    assert build_step_model(built).pace.mix.forward_autograd_ns == pytest.approx(2e6 + 3 * 0.1e6)
    retimed.pop("accumulator")
    assert build_step_model(built).pace.mix.forward_autograd_ns == pytest.approx(2e6)


CASES = REPO / "cases"


@pytest.mark.parametrize("case", ["cpu_json_records", "cpu_anomaly_left_on"])
def test_a_recorded_runs_operators_are_timed_again_and_weigh_its_step(case):
    """The collector's step on a recorded case as if its run had been busy: its calls are
    made again (most of the operators' time), and the step model weighs the step with them."""
    from advisor.collect.assemble import _with_retimed_ops
    from advisor.importers.loader import load

    pytest.importorskip("torch")  # the script's: re-timing runs in the process that ran it
    recorded = load(CASES / case / "session", use_cache=False)
    busy = {"cpu_wait": {"wall_ns": 10_000_000_000, "run_delay_ns": 8_000_000_000}}
    facts = _with_retimed_ops(busy, recorded, None, gpu=False)
    retimed = facts["retimed_ops"]
    assert retimed["covered_share"] > 0.5 and len(retimed["ops"]) >= 5
    assert _with_retimed_ops(busy, recorded, None, gpu=True) is busy  # a GPU's operators are not timed here
    # Nor a quiet run's, unless its backward shows anomaly detection's NaN checks.
    quiet = _with_retimed_ops({}, recorded, None, gpu=False)
    assert ("retimed_ops" in quiet) == (case == "cpu_anomaly_left_on")
    recorded.meta.trace_metadata["advisor"] = {**recorded.meta.trace_metadata.get("advisor", {}), **facts}
    model = build_step_model(recorded)
    assert model.pace.source == "quiet mix"
    assert 0 < weighed_per_step(model) and weighed_per_step(model, model.facts.phase_intervals("Forward")) > 0


def test_a_span_across_several_pieces_of_the_weighing_takes_each_at_its_own_rate():
    from advisor.step.load import Density

    # A call not re-timed over 0-100 at 0.5, with a re-timed call inside it, 10-90 at 0.1.
    density = Density(np.array([0, 10, 90]), np.array([10, 90, 100]), np.array([0.5, 0.1, 0.5]), 0.5)
    edges = np.array([0, 100])
    whole = density.within(iv.Intervals(np.array([0]), np.array([100])), edges)
    assert whole[1] - whole[0] == pytest.approx(18.0)
    part = density.within(iv.Intervals(np.array([5]), np.array([95])), edges)
    assert part[1] - part[0] == pytest.approx(2.5 + 8.0 + 2.5)
    assert density.before(np.array([100]))[0] == pytest.approx(18.0)


def test_a_call_of_no_length_leaves_the_weighing_rising():
    import pandas as pd

    from advisor.step.load import _density

    ops = pd.DataFrame({"start_ns": [50, 100], "end_ns": [200, 100], "top": [True, False]})
    density = _density(ops, np.array([np.nan, 5.0]), np.array([False, True]), 1.0)
    assert np.all(np.diff(density.before(np.array([0, 50, 100, 150, 200, 250]))) >= 0)
