"""launch-bound on hand-made tables and on the real traces, and below-roofline's launch
floor: ops too short to be anything but launch-bound are left to launch-bound."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import shared_trace

from advisor.importers import load
from advisor.rules import RuleContext, builtin_specs, run_rules
from advisor.rules.engine import checks
from advisor.tables import compute_tables

MS = 1_000_000


def spec(rule: str):
    return next(s for s in builtin_specs() if s.id == rule)


def launch_context(*, launching_ms: float, kernels: int = 600, short: int = 500, gpu: bool = True,
                   step_ms: float = 10.0) -> RuleContext:
    idle = pd.DataFrame({"idle_ns": [launching_ms * MS, 1 * MS], "per_step_ns": [launching_ms * MS, 1 * MS]},
                        index=["launching", "other"])
    balance = pd.DataFrame({"step_ns": [step_ms * MS], "gpu_busy_ns": [3 * MS], "kernels": [kernels],
                            "short_kernels": [short], "launches": [kernels + 10]}, index=["mean"])
    return RuleContext(tables={"gpu_idle": idle, "step_gpu": balance}, spec=spec("launch-bound"), step_count=1,
                       mean_step_ns=step_ms * MS, window_ns=int(step_ms * MS), gpu_measured=gpu)


def test_many_short_kernels_with_the_gpu_idle_while_launching_is_launch_bound():
    (finding,) = checks()["launch-bound"](launch_context(launching_ms=5.0))
    assert finding.severity.value == "high"  # 50% of the step, over XProf's 15%
    assert "600 kernels a step, 500 of them (83.3%) shorter than 10 us" in finding.message
    assert "CUDA graph" in finding.recommendation
    # The optimizer advice only where the optimizer table shows a single-tensor step.
    assert "fused=True" not in finding.recommendation
    ctx = launch_context(launching_ms=5.0)
    ctx.tables["optimizer"] = pd.DataFrame({"call": ["step"], "implementation": ["single-tensor"]},
                                           index=["Optimizer.step#SGD.step"])
    (with_optimizer,) = checks()["launch-bound"](ctx)
    assert "fused=True" in with_optimizer.recommendation
    saving = finding.saving
    assert saving.low_ms_per_step == 2.5 and saving.high_ms_per_step == 5.0
    assert saving.ms_per_step == pytest.approx(5.0 * 0.75)
    cited = {(e.table, e.row, e.column) for e in finding.evidence}
    assert ("gpu_idle", "launching", "per_step_ns") in cited and ("step_gpu", "mean", "short_kernels") in cited


def test_launch_idle_under_the_threshold_or_without_a_gpu_is_not_reported():
    assert checks()["launch-bound"](launch_context(launching_ms=0.2)) == []  # 2% < XProf's 3%
    assert checks()["launch-bound"](launch_context(launching_ms=5.0, gpu=False)) == []


def test_tiny_ops_are_left_to_launch_bound_and_real_ones_judged_with_the_floor():
    roofline = pd.DataFrame({
        "name": ["aten::add_", "aten::mm"], "input_dims": ["[[1],[1]]", "[[512,512],[512,512]]"],
        "kind": ["elementwise", "gemm"], "dtype": ["fp32", "bf16"], "calls": [1000, 10],
        "measured_ns": [3000 * 1000, 10 * 400_000], "ideal_ns": [1.0 * 1000, 10 * 100_000.0],
        "efficiency": [1e-3, 0.25], "bound": ["memory", "compute"], "unit": ["cuda cores", "tensor cores"],
        "target": ["H100", "H100"],
    }, index=["add", "mm"])
    ctx = RuleContext(tables={"roofline": roofline}, spec=spec("below-roofline"), step_count=10,
                      mean_step_ns=10 * MS, window_ns=100 * MS, gpu_measured=True)
    (finding,) = checks()["below-roofline"](ctx)
    assert "aten::mm" in finding.message and "aten::add_" not in finding.message
    assert finding.metrics["op_shapes"] == 1


@pytest.mark.parametrize("name", ["bert_small_infer_h100.json.gz", "ddp_cnn_a100_rank0.json.gz"])
def test_eager_traces_with_an_idle_gpu_lead_with_launch_bound(name):
    session = load(shared_trace(name))
    tables = compute_tables(session)
    top = run_rules(session, tables).findings[0]
    assert top.rule == "launch-bound"
    assert "low-gpu-utilization" in [f.rule for f in top.explains]
    assert top.saving.low_ms_per_step <= top.saving.ms_per_step <= top.saving.high_ms_per_step


def test_the_optimizer_s_share_of_the_idle_time_is_said_to_overlap():
    ctx = launch_context(launching_ms=5.0)
    ctx.tables["optimizer"] = pd.DataFrame(
        {"call": ["zero_grad", "step"], "implementation": ["zero_", "foreach"], "gpu_idle_per_step_ns": [2 * MS, 3 * MS]},
        index=["Optimizer.zero_grad#SGD.zero_grad", "Optimizer.step#SGD.step"])
    (finding,) = checks()["launch-bound"](ctx)
    assert ("2.00 ms of this idle time falls in the optimizer's per-parameter calls "
            "(Optimizer.zero_grad#SGD.zero_grad 2.00 ms): grad-zeroing-memsets names that fix") in finding.message
