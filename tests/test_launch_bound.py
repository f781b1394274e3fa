"""launch-bound on hand-made tables and on the real traces, and below-roofline's launch
floor: ops too short to be anything but launch-bound are left to launch-bound."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.rules import RuleContext, builtin_specs, run_rules
from advisor.rules.engine import checks
from advisor.tables import compute_tables

MS = 1_000_000


def spec(rule: str):
    return next(s for s in builtin_specs() if s.id == rule)


def dispatch_trace(*, kernels: int = 200, host_us: float = 15.0, kernel_us: float = 4.0, steps: int = 3,
                   kernel_name: str = "elementwise_kernel", launch: str = "cudaLaunchKernel",
                   optimizer_share: float = 0.0):
    """Steps of ``kernels`` operators, each dispatched by the host in ``host_us`` (its launch
    call the last 3 us of it) and running ``kernel_us`` on the GPU: where the kernel is the
    shorter, the GPU waits for the next dispatch. The last ``optimizer_share`` of a step's
    operators run inside an optimizer step range."""
    t = Trace()
    step_ms = kernels * host_us / 1000 + 1.0
    for number in range(steps):
        base = number * step_ms
        t.step(number + 1, base, base + step_ms)
        t.phase("Forward", base, base + step_ms - 1.0)
        first_optimizer = int(kernels * (1 - optimizer_share))
        if optimizer_share:
            t.add("Optimizer.step#SGD.step", "annotation", base + first_optimizer * host_us / 1000,
                  base + kernels * host_us / 1000)
        for k in range(kernels):
            at = base + k * host_us / 1000
            op = t.op("aten::add_", at, at + host_us / 1000)
            call = t.call(launch, at + (host_us - 3) / 1000, at + host_us / 1000, parent=op)
            t.gpu(kernel_name, "kernel", at + (host_us + 2) / 1000, at + (host_us + 2 + kernel_us) / 1000, launch=call)
    return t.session()


def launch_finding(session):
    findings = [f for f in _all(run_rules(session, compute_tables(session)).findings) if f.rule == "launch-bound"]
    return findings[0] if findings else None


def _all(findings):
    for finding in findings:
        yield finding
        yield from _all(finding.explains)


def test_many_short_kernels_with_the_gpu_idle_while_dispatching_is_launch_bound():
    finding = launch_finding(dispatch_trace())
    assert finding is not None and finding.severity.value == "high"
    assert "200 kernels a step, 200 of them (100.0%) shorter than 10 us" in finding.message
    assert "CUDA graph" in finding.recommendation
    # The optimizer advice only where the optimizer table shows a single-tensor step.
    assert "fused=True" not in finding.recommendation
    # The GPU runs 4 us of every 15: 11 us a kernel idle. The step replayed with the host's
    # dispatch cut to a quarter keeps the GPU's work and a quarter of the host's: the saving
    # is at most the idle time, and its range runs from half the dispatch kept to none.
    idle_ms = 200 * 11e-3
    saving = finding.saving
    assert saving.low_ms_per_step <= saving.ms_per_step <= saving.high_ms_per_step <= idle_ms + 1.0
    assert saving.ms_per_step == pytest.approx(200 * (15 * 0.75) * 1e-3, rel=0.05)
    cited = {(e.table, e.row, e.column) for e in finding.evidence}
    assert ("gpu_idle", "host in model", "per_step_ns") in cited and ("step_gpu", "mean", "short_kernels") in cited


def test_a_slow_host_is_not_launch_overhead():
    """200 us of host work per 4 us kernel: the host is slow at the model, which graphs are
    not the first fix for (host-bound says so)."""
    session = dispatch_trace(kernels=60, host_us=200.0)
    assert launch_finding(session) is None
    host = [f for f in run_rules(session, compute_tables(session)).findings if f.rule == "host-bound"]
    assert host and host[0].metrics["where"] == "inside the model"


def test_few_or_long_kernels_are_not_launch_bound():
    assert launch_finding(dispatch_trace(kernels=10)) is None  # too few to be the pattern
    assert launch_finding(dispatch_trace(kernel_us=40.0, host_us=45.0)) is None  # the kernels are long


def test_a_compiled_profile_is_not_told_to_compile():
    """Triton kernels replayed from graphs already: what is left is the host work around
    the replays, and the advice is about that, never about graphs or torch.compile."""
    finding = launch_finding(dispatch_trace(kernel_name="triton_poi_fused_add_0", launch="cudaGraphLaunch"))
    assert finding is not None and finding.metrics["compiled"]
    assert "already" in finding.message
    assert "torch.compile(model" not in finding.recommendation and "capture the step" not in finding.recommendation


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


def test_the_small_bert_inference_leads_with_launch_bound():
    """60 kernels of about 5 us, each costing the host about 70 us of Python and operator
    dispatch: graphs or batching save most of the 4.4 ms step."""
    session = load(shared_trace("bert_small_infer_h100.json.gz"))
    top = run_rules(session, compute_tables(session)).findings[0]
    assert top.rule == "launch-bound"
    assert "low-gpu-utilization" in [f.rule for f in top.explains]
    assert top.saving.low_ms_per_step <= top.saving.ms_per_step <= top.saving.high_ms_per_step
    assert 2.0 <= top.saving.ms_per_step <= 4.4


def test_the_optimizer_s_share_of_the_idle_time_is_said_to_overlap():
    session = dispatch_trace(optimizer_share=0.5)
    finding = launch_finding(session)
    assert finding is not None
    assert "of this idle time falls in the optimizer's per-parameter calls (Optimizer.step#SGD.step" in finding.message
    assert "optimizer-not-fused names that fix" in finding.message
