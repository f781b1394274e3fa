"""Re-timing the job's operator calls at one thread (advisor.collect.retime), as the
collector does after a run recorded on a busy machine: which calls are made again, from
what the trace recorded of them, and that the job's own state is left as it was."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import REPO

from advisor.collect import retime

torch = pytest.importorskip("torch")

MS = 1_000_000


def ops(rows: list[tuple]) -> pd.DataFrame:
    """Operator calls as a session holds them: (id, parent, name, dims, types, concrete,
    start ms, end ms, phase)."""
    return pd.DataFrame([{"id": i, "parent_op": parent, "name": name, "input_dims": dims, "input_types": types,
                          "concrete_inputs": concrete, "start_ns": int(start * MS), "end_ns": int(end * MS),
                          "phase": phase}
                         for i, parent, name, dims, types, concrete, start, end, phase in rows])


ROWS = [
    # A linear layer in forward, whole: its addmm inside it is not timed apart.
    (0, -1, "aten::linear", "[[64,512],[256,512],[256]]", '["float","float","float"]', "", 0, 10, "Forward"),
    (1, 0, "aten::addmm", "[[256],[64,512],[512,256],[],[]]", '["float","float","float","Scalar","Scalar"]',
     '["","","","1","1"]', 1, 9, "Forward"),
    # gelu's approximate= argument is a string the trace leaves blank: the schema's default.
    (2, -1, "aten::gelu", "[[64,256],[]]", '["float",""]', "", 10, 12, "Forward"),
    # An autograd node is no operator: the calls inside it are timed.
    (3, -1, "autograd::engine::evaluate_function: AddmmBackward0", "", "", "", 12, 20, "Backward"),
    (4, 3, "aten::mm", "[[64,256],[256,512]]", '["float","float"]', "", 13, 19, "Backward"),
    (5, -1, "aten::sum", "[[64,256],[],[],[]]", '["float","ScalarList","Scalar",""]', '["","[0]","True",""]',
     20, 22, "Backward"),
    # An optimizer's update: in place, with a scalar.
    (6, -1, "aten::add_", "[[256,512],[256,512],[]]", '["float","float","Scalar"]', '["","","-0.01"]', 22, 25,
     "Optimization"),
    # Never made again: it draws random numbers.
    (7, -1, "aten::dropout", "[[64,256],[],[]]", '["float","Scalar","Scalar"]', '["","0.1","True"]', 25, 27,
     "Forward"),
    # A name torch does not have.
    (8, -1, "aten::no_such_operator", "[[4]]", '["float"]', "", 27, 28, "Forward"),
]


def test_each_outermost_call_that_can_be_made_again_is_timed_once_at_one_thread():
    threads = torch.get_num_threads()
    state = torch.get_rng_state()
    found = retime.retime_ops(torch, ops(ROWS))
    timed = {row["name"]: row for row in found["ops"]}
    assert set(timed) == {"aten::linear", "aten::gelu", "aten::mm", "aten::sum", "aten::add_"}
    assert all(row["one_thread_ns"] > 0 for row in timed.values())
    # Forward calls are timed with autograd and without: a node each, recorded.
    assert timed["aten::linear"]["no_grad_ns"] > 0 and "no_grad_ns" not in timed["aten::mm"]
    # And what a parameter's gradient accumulator adds to such a call, at two depths.
    assert set(found["accumulator"]) == {"ns", "deeper_ns"} and min(found["accumulator"].values()) >= 0
    # The outermost calls' time re-timed: linear 10, gelu 2, mm 6 of its node's 8, sum 2 and
    # add_ 3 ms of 28 ms (not dropout's 2 ms, the unknown name's 1, the node's own 2).
    assert found["covered_share"] == pytest.approx(23 / 28, abs=1e-3)
    assert found["threads"] == threads and found["stack_frames"] > 5
    # The job's state as it was: its thread count, its random numbers.
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), state)


def test_the_calls_are_timed_on_a_thread_of_their_own_whatever_the_callers_stack():
    # Anomaly detection stores the stack with every node a timed call makes: the stack the
    # timing holds is the same few frames from a command line or a notebook's deep stack.
    def deep(depth: int):
        return retime.retime_ops(torch, ops(ROWS[:1])) if depth <= 0 else deep(depth - 1)

    shallow, far_down = retime.retime_ops(torch, ops(ROWS[:1])), deep(40)
    assert shallow["stack_frames"] == far_down["stack_frames"] < 20


def test_an_error_while_re_timing_reaches_the_caller():
    with pytest.raises(KeyError):
        retime.retime_ops(torch, ops(ROWS).drop(columns=["parent_op"]))


def test_a_forward_calls_inputs_require_grad_without_being_leaves():
    # A call on a leaf that requires grad makes the leaf's gradient accumulator (with
    # anomaly detection, a stored stack too) each time: a model's activations make none.
    call, _ = retime._rebuilt(torch, torch.Generator().manual_seed(0), *ROWS[0][2:6], grad=True)
    inputs = [t for t in call.__defaults__[1] if isinstance(t, torch.Tensor)]
    assert len(inputs) == 3 and all(t.requires_grad and not t.is_leaf for t in inputs)
    assert call().grad_fn is not None


def test_each_round_times_every_call_before_the_next_round_begins(monkeypatch):
    # A spell in which the machine runs slow then slows one round of many calls, not every
    # round of one.
    order: list[int] = []
    timed = retime._Timing.round

    def logged(self, clock):
        order.append(id(self))
        return timed(self, clock)

    monkeypatch.setattr(retime._Timing, "round", logged)
    retime.retime_ops(torch, ops(ROWS))
    # The operators' calls, then the gradient accumulator's: each group round by round.
    groups, rest = [], order
    while rest:
        each = rest.index(rest[0], 1) if rest.count(rest[0]) > 1 else len(rest)
        groups.append(rest[:each])
        assert rest[:each * retime.ROUNDS] == rest[:each] * retime.ROUNDS
        rest = rest[each * retime.ROUNDS:]
    assert len(groups[0]) > 3 and len(groups) == 2


def test_a_call_that_changes_its_inputs_gets_them_back_before_each_timing():
    # A scale below one a thousand times over would leave denormal numbers, slow on a CPU.
    rows = [(0, -1, "aten::mul_", "[[1024],[]]", '["float","Scalar"]', '["","0.5"]', 0, 1, "Optimization")]
    call, reset = retime._rebuilt(torch, torch.Generator().manual_seed(0), *(rows[0][2:6]))
    assert reset is not None
    target = call.__defaults__[1][0]  # the tensor the call scales
    before = target.clone()
    for _ in range(200):
        call()
    reset()
    assert torch.equal(target, before)


@pytest.mark.parametrize("recorded", ["__import__('os').getcwd()", "open('x')", "lambda: 1"])
def test_a_recorded_scalar_is_read_as_a_literal_never_run(recorded):
    with pytest.raises(retime._Unfit):
        retime._literal(recorded)
    assert retime._literal("[64, 1024]") == [64, 1024] and retime._literal("0.") == 0.0


def test_the_budget_bounds_what_is_timed():
    found = retime.retime_ops(torch, ops(ROWS), budget_ns=0)
    assert len(found["ops"]) <= 1 and torch.get_num_threads() >= 1


@pytest.mark.parametrize("name", ["aten::__class__", "aten::_ops", "aten::linear.default", "aten::", "prim::abs",
                                  "aten::__init__"])
def test_a_name_from_the_trace_is_only_looked_up_among_torchs_operators(name):
    with pytest.raises(retime._Unfit):
        retime._rebuilt(torch, torch.Generator(), name, "[[4]]", '["float"]', "")


def test_an_operator_that_draws_random_numbers_from_a_scalar_leaves_the_jobs_generator_alone():
    # Attention with dropout asked for by its scalar: not a name the filter knows.
    rows = [(0, -1, "aten::scaled_dot_product_attention", "[[2,4,8,16],[2,4,8,16],[2,4,8,16],[],[],[],[],[]]",
             '["float","float","float","","Scalar","Scalar","",""]', '["","","","","0.1","False","",""]', 0, 5,
             "Forward")]
    state = torch.get_rng_state()
    found = retime.retime_ops(torch, ops(rows))
    assert torch.equal(torch.get_rng_state(), state)
    assert [row["name"] for row in found["ops"]] == ["aten::scaled_dot_product_attention"]


def test_inputs_are_sized_from_their_recorded_shapes_before_any_is_made():
    # An expand's recorded shape: 40 GB were it made.
    with pytest.raises(retime._Unfit, match="too large"):
        retime._arguments(torch, torch.Generator(), torch.ops.aten.relu.default._schema.arguments,
                          [[100_000, 100_000]], ["float"], [""], False)


def test_an_optimizers_foreach_update_gets_each_tensor_of_its_list_back():
    call, reset = retime._rebuilt(torch, torch.Generator().manual_seed(0), "aten::_foreach_mul_",
                                  "[[[64],[32]],[]]", '["TensorList","Scalar"]', '["","0.5"]')
    assert reset is not None
    tensors = call.__defaults__[1][0]
    before = [t.clone() for t in tensors]
    call()
    reset()
    assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))


def test_a_forward_under_no_grad_is_not_made_with_autograd():
    # The trace records sequence numbers: a Forward call without one ran under no_grad.
    rows = ops(ROWS[:3]).assign(sequence=[5, -1, -1])
    frame = retime._keyed(rows)
    assert frame["forward"].tolist() == [True, False, False]
    # Where the trace records none at all, the Forward phase's calls are taken as graded.
    assert retime._keyed(ops(ROWS[:3]))["forward"].tolist() == [True, True, True]


def test_re_timing_that_fails_leaves_the_runs_facts_as_they_were(monkeypatch):
    from advisor.collect import assemble
    from advisor.importers.loader import load

    recorded = load(REPO / "cases" / "cpu_json_records" / "session", use_cache=False)
    busy = {"cpu_wait": {"wall_ns": 10, "run_delay_ns": 8}}

    def broken(*args, **kwargs):
        raise KeyError("parent_op")

    monkeypatch.setattr(retime, "retime_ops", broken)
    assert assemble._with_retimed_ops(busy, recorded, None, gpu=False) is busy
