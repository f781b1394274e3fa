"""The built-in rules on real traces: the findings an engineer would expect, ranked right."""

from __future__ import annotations

import pytest
from conftest import shared_trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables


def _diagnose(name: str):
    session = load(shared_trace(name))
    tables = compute_tables(session)
    return session, tables, run_rules(session, tables)


def _all(findings):
    for finding in findings:
        yield finding
        yield from _all(finding.explains)


def test_resnet_num_workers_0_is_starved_by_its_loader():
    _, tables, result = _diagnose("resnet50_v100_num_workers_0.pt.trace.json.gz")
    assert not result.errors
    top = result.findings[0]
    assert top.rule == "dataloader-starvation"
    assert top.severity.value == "high"
    # The trace's own ranges: 415.791 ms of enumerate(DataLoader) in 1048.976 ms of steps.
    assert tables["model"].loc["Dataloader", "cpu_ratio"] == pytest.approx(415.791 / 1048.976, abs=1e-4)
    assert top.metrics["share"] == pytest.approx(0.396, abs=0.005)
    # The saving is less: the host's other 105.5 ms (5% slower beside workers) and the
    # GPU's 13.5 ms tail, waited for at the pageable copy each step, stay.
    assert top.saving.share_of_step == pytest.approx((174.83 - (105.5 * 1.05 + 13.5)) / 174.83, abs=0.005)
    # The GPU's idle time is mostly the loader's: it is shown under it, not beside it.
    assert [f.rule for f in top.explains] == ["low-gpu-utilization"]
    assert "low-gpu-utilization" not in [f.rule for f in result.findings]
    cited = {(e.table, e.row) for e in top.evidence if e.kind == "table_row"}
    assert ("model", "Dataloader") in cited


def test_resnet_num_workers_4_has_no_loader_problem():
    _, tables, result = _diagnose("resnet50_v100_num_workers_4.pt.trace.json.gz")
    assert tables["model"].loc["Dataloader", "cpu_ratio"] < 0.02
    assert "dataloader-starvation" not in {f.rule for f in _all(result.findings)}
    # What is left: the host dispatching 1,478 kernels a step (the GPU idles 23.5 ms a
    # step inside operators and 2.0 ms in the optimizer's Python between them); the
    # pageable input copy, with the line that makes it; the zeroed gradients; fp32
    # convolutions that fp16 autocast would put on the V100's tensor cores, worth only the
    # 3.2 ms the host waits for a busy GPU while the host sets the pace; and the
    # single-tensor SGD step, worth only the GPU idle time while it runs and part of its
    # kernels' time, since the host waits for the GPU every step.
    ranked = [f.rule for f in result.findings]
    assert ranked == ["launch-bound", "sync-memcpy-stall", "grad-zeroing-memsets", "tensor-core-misalignment",
                      "optimizer-not-fused"]
    top, copy, _, amp, optimizer = result.findings
    assert top.saving.high_ms_per_step == pytest.approx(25.6, abs=0.2)
    assert top.metrics["idle_in_ops_ns_per_step"] == pytest.approx(23.5e6, abs=0.2e6)
    assert optimizer.metrics["ops_per_step"] == 484 and optimizer.saving.ms_per_step < 3
    assert "fp16 autocast" in amp.message and "GradScaler" in amp.recommendation
    assert amp.title == "fp32 matrix work runs without tensor cores"
    assert amp.saving.ms_per_step == pytest.approx(3.18, abs=0.01)
    assert amp.metrics["gpu_time_ns_per_step"] > 40e6  # the GPU time it saves, most of which would idle
    lines = [(e.file, e.line) for e in copy.evidence if e.kind == "source_line"]
    assert ("resnet50_profiler_api.py", 44) in lines


def test_ddp_gpu_is_underused_and_distributed_summary_is_filled():
    session, tables, result = _diagnose("ddp_cnn_a100_rank0.json.gz")
    idle = [f for f in _all(result.findings) if f.rule == "low-gpu-utilization"]
    assert len(idle) == 1 and idle[0].severity.value == "high"
    assert idle[0].metrics["utilization"] == pytest.approx(0.236, abs=0.005)
    # Its cause leads, with the idle GPU under it: the host dispatching 1,258 launches a
    # step while the GPU idles 145 ms of the 222 ms step inside operators and 21 ms in
    # DDP's and the optimizer's Python between them. A small sync explains nothing.
    top = result.findings[0]
    assert top.rule == "launch-bound" and [f.rule for f in top.explains] == ["low-gpu-utilization"]
    assert top.metrics["launches"] == 1258 and top.saving.high_ms_per_step == pytest.approx(165.9, abs=0.5)
    assert top.metrics["idle_in_ops_ns_per_step"] == pytest.approx(144.8e6, abs=0.5e6)
    distributed = tables["distributed"]
    assert distributed.loc["Communication", "total_ns"] > 0
    assert distributed.loc["Computation", "total_ns"] > 0
    assert 0 < distributed.loc["Overlap", "total_ns"] < distributed.loc["Communication", "total_ns"]


@pytest.mark.parametrize("name", ["qwen0.5b_infer_h100.json.gz", "bert_small_infer_h100.json.gz"])
def test_inference_traces_diagnose_without_errors(name):
    _, _, result = _diagnose(name)
    assert not result.errors
    for finding in _all(result.findings):
        assert finding.saving.ms_per_step >= 0 and 0 <= finding.saving.share_of_step <= 1
