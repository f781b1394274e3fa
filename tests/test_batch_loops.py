"""A loop over the batch's rows inside the model (the batch_loops table, the rule
batch-loop-in-model): found by its indexing, measured with its autograd nodes, told apart
from loops over a few heads, over another dimension, and outside the model."""

from __future__ import annotations

import json

import pytest

from advisor.rules import run_rules
from advisor.tables import compute_tables
from tests.builders import Trace

ROWS = 32
SHAPE = [ROWS, 16, 8]


def session(*, rows: int = ROWS, dim: int = 0, phase: str = "Forward", nodes: bool = True, loops: bool = True,
            **metadata):
    """Four steps of a model whose forward pools each of ``rows`` rows (h[i].mean(0)) in a
    Python loop, 0.05 ms a row, and whose backward runs each row's nodes, 0.1 ms a row."""
    t = Trace()
    shape = list(SHAPE)
    shape[0] = rows if dim == 0 else shape[0]
    shape[dim] = rows
    for number in range(1, 5):
        base = 20.0 * (number - 1)
        t.step(number, base, base + 20)
        t.phase("Forward", base, base + 6)
        t.op("aten::linear", base + 0.1, base + 0.9)
        start = base + 1.0 if phase == "Forward" else base + 6.5
        for i in range(rows if loops else 0):
            at = start + i * 0.1
            t.op("aten::select", at, at + 0.02, input_dims=json.dumps([shape, [], []]),
                 input_types=json.dumps(["float", "Scalar", "Scalar"]), concrete_inputs=json.dumps(["", str(dim), str(i)]))
            t.op("aten::mean", at + 0.03, at + 0.08, input_dims=json.dumps([shape[1:], [], [], []]),
                 input_types=json.dumps(["float", "ScalarList", "Scalar", ""]))
        end = start + rows * 0.1
        t.op("aten::stack", end, end + 0.05)
        t.phase("Backward", base + 10, base + 18)
        for i in range(rows if loops and nodes else 0):
            at = base + 10 + i * 0.2
            t.op("autograd::engine::evaluate_function: MeanBackward1", at, at + 0.08)
            t.op("autograd::engine::evaluate_function: SelectBackward0", at + 0.1, at + 0.18)
        t.op("autograd::engine::evaluate_function: AddmmBackward0", base + 17, base + 17.5)
    return t.session(gpu_measured=False, **metadata)


def findings(s):
    return {f.rule: f for f in run_rules(s, compute_tables(s)).findings}


def test_a_loop_over_the_rows_is_found_with_its_body_and_its_nodes():
    table = compute_tables(session(), ["batch_loops"])["batch_loops"]
    assert list(table.index) == ["aten::select [32,16,8] dim 0"]
    row = table.iloc[0]
    assert row["phase"] == "Forward" and row["rows"] == ROWS and row["index_calls_per_step"] == ROWS
    assert row["body_ops_per_row"] == pytest.approx(2 + 1 / ROWS)  # select, mean; the stack once
    assert row["body"] == "aten::select x1, aten::mean x1"
    # From the first select to the end of the stack that gathers the rows.
    assert row["forward_ns_per_step"] == pytest.approx((ROWS * 0.1 + 0.05) * 1e6)
    assert row["nodes"] == "MeanBackward1, SelectBackward0" and row["node_calls_per_step"] == 2 * ROWS
    assert row["node_ns_per_step"] == pytest.approx(ROWS * 0.16e6)


def test_the_rule_names_the_loop_and_saves_most_of_it():
    found = findings(session())
    assert "batch-loop-in-model" in found
    finding = found["batch-loop-in-model"]
    assert "a batch of 32 rows" in finding.message and "select (h[i])" in finding.message
    loop = (ROWS * 0.1 + 0.05 + ROWS * 0.16) * 1e6
    # Batched: each operator called twice for the batch, not once a row, so 2/32 of the
    # loop's time stays (its arithmetic, a few kB, is less).
    assert finding.saving.ms_per_step * 1e6 == pytest.approx(loop * (1 - 2 / ROWS), rel=0.02)
    assert finding.saving.low_ms_per_step < finding.saving.ms_per_step <= finding.saving.high_ms_per_step


@pytest.mark.parametrize("kind", ["few rows", "another dimension", "outside the model", "no loop"])
def test_no_loop_over_the_batch_is_no_finding(kind):
    made = {"few rows": {"rows": 4}, "another dimension": {"dim": 1}, "outside the model": {"phase": ""},
            "no loop": {"loops": False}}[kind]
    s = session(**made)
    table = compute_tables(s, ["batch_loops"])["batch_loops"]
    if kind == "outside the model":
        assert list(table["phase"]) == [""]  # found, and left to host-bound, which names the script's own code
    else:
        assert table.empty
    assert "batch-loop-in-model" not in findings(s)


def test_a_loop_over_other_rows_than_the_batch_is_not_called_one():
    # The model's input says the batch is 64: a loop over 32 rows walks something else
    # (time steps, parts of a sample), which batching the rows would not remove.
    assert "batch-loop-in-model" not in findings(session(batch_size=64))
    assert "batch-loop-in-model" in findings(session(batch_size=ROWS))
