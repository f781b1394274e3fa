"""A loop that never runs backward but records autograd's graph (the inference_autograd
table, the rule autograd-in-inference): counted from autograd's sequence numbers as
torch.profiler records them, told apart from no_grad, from parameters that need no grad,
and from training; sized from a probe of this CPU or a typical figure for a trace."""

from __future__ import annotations

import itertools
import json

import pytest

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables
from tests.builders import Trace

NODES = 40  # per forward


def session(*, grad: bool = True, nodes: int = NODES, backward: bool = False, probed: float | None = None):
    """Four steps of a forward of NODES operators, 0.01 ms each, with grad mode on: the
    first ``nodes`` of each forward advance the sequence number by one (inputs that need
    grad; ``nodes=0``: nothing needs grad), or with no number (``grad=False``: no_grad)."""
    t = Trace()
    sequence = 100
    for number in range(1, 5):
        base = 2.0 * (number - 1)
        t.step(number, base, base + 1.5)
        t.phase("Forward", base, base + 0.6)
        for i in range(NODES):
            at = base + 0.01 + i * 0.0125
            t.op("aten::addmm", at, at + 0.01, sequence=sequence if grad else -1)
            sequence += 1 if i < nodes else 0
        if backward:
            t.phase("Backward", base + 0.7, base + 1.2)
            t.op("autograd::engine::evaluate_function: AddmmBackward0", base + 0.7, base + 0.8)
    metadata = {"advisor": {"autograd_node_ns": probed}} if probed is not None else {}
    return t.session(gpu_measured=False, **metadata)


def findings(s):
    return {f.rule: f for f in run_rules(s, compute_tables(s)).findings}


def test_the_nodes_a_forward_makes_are_counted_from_the_sequence_numbers():
    table = compute_tables(session(), ["inference_autograd"])["inference_autograd"]
    row = table.loc["forward with autograd"]
    # 160 operators over four steps, each advancing the number: the last less the first.
    assert row["nodes"] == 4 * NODES - 1
    assert row["nodes_per_step"] == pytest.approx((4 * NODES - 1) / 4)
    assert row["graded_ops_per_step"] == NODES
    assert row["probed_node_ns"] != row["probed_node_ns"]  # NaN: a trace, not probed


@pytest.mark.parametrize("case", ["no_grad", "nothing needs grad", "training"])
def test_no_row_where_no_graph_was_recorded_or_backward_ran(case):
    s = {"no_grad": session(grad=False), "nothing needs grad": session(nodes=0),
         "training": session(backward=True)}[case]
    assert compute_tables(s, ["inference_autograd"])["inference_autograd"].empty
    assert "autograd-in-inference" not in findings(s)


def test_the_rule_sizes_the_nodes_from_a_probe_or_a_typical_figure():
    typical = findings(session())["autograd-in-inference"]
    probed = findings(session(probed=2000.0))["autograd-in-inference"]
    assert typical.metrics["node_ns"] == pytest.approx(1000.0) and not typical.metrics["probed"]
    assert probed.metrics["node_ns"] == pytest.approx(2000.0) and probed.metrics["probed"]
    # 39.75 nodes a step: about 40 us at a microsecond, 80 us at two.
    assert typical.saving.ms_per_step == pytest.approx(0.03975, rel=0.15)
    assert probed.saving.ms_per_step == pytest.approx(2 * typical.saving.ms_per_step, rel=0.15)
    assert "inference_mode" in typical.recommendation
    assert "typical" in typical.message and "by a probe after the run" in probed.message


def test_too_few_nodes_make_no_finding():
    few = session(nodes=2, probed=1000.0)  # two nodes a forward: below min_nodes_per_step
    assert compute_tables(few, ["inference_autograd"])["inference_autograd"].loc[
        "forward with autograd", "nodes_per_step"] == pytest.approx(2.0, abs=0.3)
    assert "autograd-in-inference" not in findings(few)


torch = pytest.importorskip("torch", reason="the profiler traces are recorded by torch.profiler")


def _profiled(tmp_path, mode: str):
    """A real torch.profiler trace of six steps of a small model's forward in eval mode:
    with grad on, under no_grad, or with parameters that need no grad."""
    widths = (32, 48, 64, 48, 32)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.GELU())
                                  for a, b in itertools.pairwise(widths)]).eval()
    if mode == "frozen":
        for p in model.parameters():
            p.requires_grad_(False)
    x = torch.randn(8, 32)
    path = tmp_path / f"{mode}.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=6),
                                on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as prof:
        for _ in range(7):
            if mode == "no_grad":
                with torch.no_grad():
                    model(x)
            else:
                model(x)
            prof.step()
    return path


def test_a_real_profiler_trace_records_the_sequence_numbers(tmp_path):
    events = json.loads(_profiled(tmp_path, "grad").read_text())["traceEvents"]
    numbered = [e for e in events if e.get("cat") == "cpu_op" and "Sequence number" in e.get("args", {})]
    assert numbered, "torch.profiler records a sequence number for operators run with grad mode on"
    ops = load(_profiled(tmp_path, "grad")).events
    assert (ops["sequence"][(ops["kind"] == "op").to_numpy()] >= 0).any()


@pytest.mark.parametrize(("mode", "fires"), [("grad", True), ("no_grad", False), ("frozen", False)])
def test_real_traces_of_inference_with_and_without_autograd(tmp_path, mode, fires):
    s = load(_profiled(tmp_path, mode))
    table = compute_tables(s, ["inference_autograd"])["inference_autograd"]
    if fires:
        # Four blocks of linear (t, addmm) and GELU: a dozen nodes a forward.
        assert table.loc["forward with autograd", "nodes_per_step"] >= 8
    else:
        assert table.empty
    assert ("autograd-in-inference" in findings(s)) is fires


def test_the_probe_gives_a_cost_per_node():
    from advisor.knowledge.cpu import probe_autograd_node

    cost = probe_autograd_node(torch)
    assert cost is not None and cost >= 0
