"""The roofline table and the two rules built on it: below-roofline and
tensor-core-misalignment."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import shared_trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.session import (
    CollectorInfo,
    DeviceInfo,
    Session,
    SessionMeta,
    conform_events,
)
from advisor.tables import compute_tables

MS = 1_000_000


def _all(findings):
    for finding in findings:
        yield finding
        yield from _all(finding.explains)


def _by_rule(result):
    return {f.rule: f for f in _all(result.findings)}


def _session(rows: list[dict], *, gpu: bool, devices: list[DeviceInfo], target_gpu: str | None = None) -> Session:
    events = conform_events(pd.DataFrame(rows))
    from advisor.session.attribute import attribute

    meta = SessionMeta(source="test", source_format="test", collector=CollectorInfo(name="test", gpu_measured=gpu),
                       devices=devices, target_gpu=target_gpu)
    return Session(meta, attribute(events))


def _step(n: int, start: int, end: int) -> dict:
    return {"name": f"ProfilerStep#{n}", "kind": "annotation", "start_ns": start, "end_ns": end, "pid": 1, "tid": 1}


def _gemm_on_gpu(step: int, t0: int, dims: str, kernel: str, kernel_ns: int, corr: int) -> list[dict]:
    return [
        {"name": "aten::mm", "kind": "op", "start_ns": t0, "end_ns": t0 + MS, "pid": 1, "tid": 1,
         "input_dims": dims, "input_types": '["c10::BFloat16","c10::BFloat16"]', "external_id": corr},
        {"name": "cudaLaunchKernel", "kind": "runtime", "start_ns": t0 + 10, "end_ns": t0 + 20, "pid": 1, "tid": 1,
         "correlation": corr, "external_id": corr},
        {"name": kernel, "kind": "kernel", "start_ns": t0 + 100, "end_ns": t0 + 100 + kernel_ns, "pid": 0, "tid": 7,
         "device": 0, "stream": 7, "correlation": corr},
    ]


A100 = DeviceInfo(id=0, kind="gpu", name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", sm_count=108)
HOST = DeviceInfo(id=-1, kind="cpu", name="host")


def test_misaligned_bf16_gemm_is_named_with_its_padded_shape_and_the_aligned_one_is_not():
    rows = [_step(0, 0, 10 * MS)]
    rows += _gemm_on_gpu(0, 1 * MS, "[[60,1000],[1000,1023]]", "ampere_bf16_s16816gemm_bf16_align1", 400_000, 11)
    rows += _gemm_on_gpu(0, 4 * MS, "[[64,1024],[1024,1024]]", "ampere_bf16_s16816gemm_bf16_align8", 20_000, 12)
    session = _session(rows, gpu=True, devices=[HOST, A100])
    tables = compute_tables(session)
    roofline = tables["roofline"]
    assert set(roofline["target_id"]) == {"a100-sxm4-80gb"}
    assert roofline.loc["aten::mm [[60,1000],[1000,1023]]", "dtype"] == "bf16"
    finding = _by_rule(run_rules(session, tables))["tensor-core-misalignment"]
    assert "N 1023 -> 1024" in finding.message and "M 60 -> 64" in finding.message
    assert "[[64,1024],[1024,1024]]" not in finding.message
    assert finding.metrics["misaligned"] == ["aten::mm [[60,1000],[1000,1023]]"]
    # Measured 400 us against an ideal of a few us: nearly all of it is GPU time saved.
    assert 0.3e6 < finding.metrics["gpu_time_ns_per_step"] < 0.4e6
    # But the GPU idles 9.6 ms of the 10 ms step and the host never waits for it: the
    # host sets the pace, and faster GEMMs would not shorten the step.
    assert finding.saving.ms_per_step == 0 and "the host sets the pace" in finding.message


def test_a_misaligned_shape_already_as_fast_as_its_padded_twin_is_not_reported():
    # 60 x 1000 @ 1000 x 1023 in bf16 is 122.8 MFLOP: about 0.39 us at the A100's 312
    # TFLOP/s, 0.66 us at the 60 % a well-shaped GEMM reaches. Measured at 0.68 us,
    # padding (1.07x the work) would not make it faster: no finding for it.
    rows = [_step(0, 0, 10 * MS)]
    rows += _gemm_on_gpu(0, 1 * MS, "[[60,1000],[1000,1023]]", "ampere_bf16_s16816gemm_bf16_align1", 680, 11)
    session = _session(rows, gpu=True, devices=[HOST, A100])
    tables = compute_tables(session)
    assert "tensor-core-misalignment" not in _by_rule(run_rules(session, tables))


def test_fp32_gemm_on_cuda_cores_is_pointed_at_tf32():
    rows = [_step(0, 0, 10 * MS)]
    rows += _gemm_on_gpu(0, 1 * MS, "[[1024,1024],[1024,1024]]", "ampere_sgemm_128x64_nn", 2 * MS, 11)
    rows[1]["input_types"] = '["float","float"]'
    session = _session(rows, gpu=True, devices=[HOST, A100])
    tables = compute_tables(session)
    assert tables["roofline"]["tensor_core_kernels"].tolist() == ["no"]
    finding = _by_rule(run_rules(session, tables))["tensor-core-misalignment"]
    assert "fp32 on CUDA cores" in finding.message
    assert "set_float32_matmul_precision" in finding.recommendation


def test_cpu_run_gets_a_roofline_from_its_calibrated_peaks():
    rows = [_step(0, 0, 20 * MS),
            {"name": "aten::mm", "kind": "op", "start_ns": 1 * MS, "end_ns": 11 * MS, "pid": 1, "tid": 1,
             "input_dims": "[[512,512],[512,512]]", "input_types": '["float","float"]'}]
    cpu = DeviceInfo(id=-1, kind="cpu", name="host", peak_flops={"fp32": 1e11}, memory_bandwidth_gbps=20.0)
    session = _session(rows, gpu=False, devices=[cpu])
    tables = compute_tables(session)
    row = tables["roofline"].iloc[0]
    assert row["ideal_ns"] == pytest.approx(2 * 512**3 / 1e11 * 1e9)
    assert row["efficiency"] == pytest.approx(2 * 512**3 / 1e11 / 0.010)
    assert row["unit"] == "cpu" and row["target_id"] == "cpu"
    found = _by_rule(run_rules(session, tables))
    assert "below-roofline" in found and "tensor-core-misalignment" not in found


def test_without_peaks_the_roofline_says_how_to_get_them():
    rows = [_step(0, 0, 20 * MS),
            {"name": "aten::mm", "kind": "op", "start_ns": 1 * MS, "end_ns": 11 * MS, "pid": 1, "tid": 1,
             "input_dims": "[[512,512],[512,512]]", "input_types": '["float","float"]'}]
    session = _session(rows, gpu=False, devices=[HOST])
    roofline = compute_tables(session)["roofline"]
    assert roofline["ideal_ns"].isna().all()
    assert any("advisor calibrate" in note for note in roofline.attrs["notes"])


def test_qwen_lists_the_ops_furthest_below_their_roofline():
    session = load(shared_trace("qwen0.5b_infer_h100.json.gz"))
    tables = compute_tables(session)
    roofline = tables["roofline"]
    assert set(roofline["target_id"]) == {"h100-sxm"}
    sdpa = roofline[roofline["name"] == "aten::scaled_dot_product_attention"].iloc[0]
    assert sdpa["efficiency"] < 0.3
    finding = _by_rule(run_rules(session, tables))["below-roofline"]
    worst = [w["key"] for w in finding.metrics["worst"]]
    assert worst[0].startswith("aten::scaled_dot_product_attention")
    assert all(e.table == "roofline" and e.column == "efficiency" for e in finding.evidence)
    # It already runs FlashAttention kernels: the advice is what is left beyond them.
    assert "already runs FlashAttention" in finding.recommendation and "CUDNN_ATTENTION" in finding.recommendation
    assert "recoverable" in finding.message


def test_resnet50_forward_convolutions_cost_what_resnet50_costs():
    session = load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz"))
    roofline = compute_tables(session)["roofline"]
    forward = roofline[roofline["name"] == "aten::conv2d"]
    per_image = forward["flops"].sum() / 6 / 32  # 6 steps of 32 images
    assert per_image == pytest.approx(8.18e9, rel=0.02)  # ResNet-50: 4.09 GMACs an image
