"""AMD Instinct GPUs judged as NVIDIA's are: the device named as ROCm names it (gfx942, not
a CUDA compute capability), its kernels on matrix cores from their names, GEMMs against the
CDNA multiples and the part's own peaks, and a GEMM's tiles against its compute units.

The planted ROCm traces (cases/synth_rocm_*) check each kernel-level problem end to end; these
tests check the parts and the real MI300X traces."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from builders import write_trace
from conftest import shared_trace

from advisor.diagnosis import diagnose
from advisor.importers import load
from advisor.reports import terminal_text
from advisor.rules import run_rules
from advisor.session import CollectorInfo, DeviceInfo, Session, SessionMeta, conform_events
from advisor.tables import compute_tables

MS = 1_000_000


def _all(findings):
    for finding in findings:
        yield finding
        yield from _all(finding.explains)


def test_a_rocm_trace_s_gpu_is_named_by_its_architecture_and_compute_units():
    """ROCm writes its GFXIP version (9.4) where CUDA's compute capability goes: read as is,
    an MI300X was 'sm 9.4, 304 SMs'."""
    diagnosis = diagnose(load(shared_trace("bert_small_infer_mi300.json.gz")))
    (gpu,) = [d for d in diagnosis.report.session.devices if d.kind == "gpu"]
    assert (gpu.vendor, gpu.architecture) == ("amd", "gfx942, CDNA 3")
    text = " ".join(terminal_text(diagnosis.report, width=120).split())
    assert "(gfx942, CDNA 3, 304 CUs," in text and "sm 9.4" not in text and "304 SMs" not in text


def test_an_nvidia_trace_keeps_its_compute_capability():
    diagnosis = diagnose(load(shared_trace("bert_small_infer_h100.json.gz")))
    (gpu,) = [d for d in diagnosis.report.session.devices if d.kind == "gpu"]
    assert (gpu.vendor, gpu.architecture) == ("nvidia", "")
    assert "(sm 9.0, 132 SMs," in " ".join(terminal_text(diagnosis.report, width=120).split())


def test_an_amd_device_with_no_known_name_is_still_read_as_amd(tmp_path):
    """A ROCm device record without a name the knowledge base holds: the 64-wide wavefront
    says AMD, and the label says GFXIP, never sm."""
    from advisor.reports._common import device_label

    record = {"id": 0, "name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "warpSize": 64,
              "numSms": 104, "totalGlobalMem": 68_702_699_520}
    path = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 5,
         "args": {"External id": 1, "correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1", "pid": 0, "tid": 0,
         "ts": 8, "dur": 20, "args": {"device": 0, "stream": 0, "correlation": 7}}], deviceProperties=[record])
    (gpu,) = [d for d in load(path).meta.devices if d.kind == "gpu"]
    assert gpu.vendor == "amd"
    assert "GFXIP 9.0, 104 CUs" in device_label(gpu)


def _rocm_gemm_session(dims: str, kernel: str, kernel_ns: int, *, calls: int = 6) -> Session:
    """A ROCm benchmark session: one aten::mm a step, each launching one kernel."""
    from advisor.session.attribute import attribute

    rows = []
    for i in range(calls):
        t0 = i * 2 * kernel_ns
        rows += [
            {"name": f"ProfilerStep#{i}", "kind": "annotation", "start_ns": t0, "end_ns": t0 + 2 * kernel_ns,
             "pid": 1, "tid": 1},
            {"name": "aten::mm", "kind": "op", "start_ns": t0, "end_ns": t0 + MS // 10, "pid": 1, "tid": 1,
             "input_dims": dims, "input_types": '["c10::BFloat16","c10::BFloat16"]', "external_id": i + 1},
            {"name": "hipExtModuleLaunchKernel", "kind": "runtime", "start_ns": t0 + 10, "end_ns": t0 + 20,
             "pid": 1, "tid": 1, "correlation": i + 1, "external_id": i + 1},
            {"name": kernel, "kind": "kernel", "start_ns": t0 + 100, "end_ns": t0 + 100 + kernel_ns, "pid": 0,
             "tid": 0, "device": 0, "stream": 0, "correlation": i + 1},
        ]
    mi300x = DeviceInfo(id=0, kind="gpu", name="AMD Instinct MI300X", vendor="amd", compute_capability="9.4",
                        sm_count=304, total_memory_bytes=206_141_652_992)
    meta = SessionMeta(source="test", source_format="test", collector=CollectorInfo(name="test", gpu_measured=True),
                       devices=[DeviceInfo(id=-1, kind="cpu", name="host"), mi300x])
    return Session(meta, attribute(conform_events(pd.DataFrame(rows))))


def test_a_misaligned_bf16_gemm_on_mi300x_is_judged_against_its_matrix_peak():
    tensile = "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_GRVWA1_GRVWB1_ISA942"
    session = _rocm_gemm_session("[[4097,4097],[4097,4097]]", tensile, 363_000)
    tables = compute_tables(session)
    roof = tables["roofline"]
    row = roof.iloc[0]
    assert row["unit"] == "matrix cores" and row["tensor_core_kernels"] == "yes" and row["tile"] == "256x256"
    # 2 x 4097^3 FLOP at 1307.4 TFLOPS: 105 us for each 363 us call.
    assert row["efficiency"] == pytest.approx(2 * 4097 ** 3 / 1307.4e12 / 363e-6, rel=0.01)
    found = {f.rule: f for f in _all(run_rules(session, tables).findings)}
    misaligned = found["tensor-core-misalignment"]
    assert "pad M 4097 -> 4104" in misaligned.message and "matrix-core multiples" in misaligned.message
    assert misaligned.title == "Matrix shapes keep matrix cores from full speed"
    assert "below-roofline" in found


def test_an_aligned_gemm_that_fills_few_tiles_is_named_with_its_tiles_and_compute_units():
    tensile = "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_GRVWA8_GRVWB8_ISA942"
    session = _rocm_gemm_session("[[256,16384],[16384,1024]]", tensile, 333_000)
    tables = compute_tables(session)
    row = tables["roofline"].iloc[0]
    assert (row["tiles"], row["waves"]) == (8, pytest.approx(8 / 304))
    found = {f.rule: f for f in _all(run_rules(session, tables).findings)}
    assert "tensor-core-misalignment" not in found
    below = found["below-roofline"]
    assert "only 8 output tiles (256x128) for 304 compute units, 2.6% of them busy" in below.message
    assert "larger batch" in below.recommendation


def test_gpu_mi300x_judges_a_cpu_run_s_misaligned_gemm_and_names_the_multiple(tmp_path):
    """A CPU trace of a 2049-cubed GEMM, judged with --gpu MI300X as it would run there in
    fp16: pad every dimension to 2056."""
    events = []
    for i in range(4):
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i * 200_000,
                       "dur": 190_000, "args": {"External id": i + 1, "Input Dims": [[2049, 2049], [2049, 2049]],
                                                "Input type": ["float", "float"]}})
    trace = write_trace(tmp_path / "cpu_gemm.json", events)
    from advisor.cli import main

    out = tmp_path / "report.json"
    assert main(["diagnose", "--gpu", "MI300X", str(trace), "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    found = {f["rule"]: f for f in report["findings"]}
    message = found["tensor-core-misalignment"]["message"]
    assert "AMD Instinct MI300X" in message and "pad M 2049 -> 2056, N 2049 -> 2056, K 2049 -> 2056" in message


def test_real_mi300x_kernels_run_on_matrix_cores_by_their_names():
    tables = compute_tables(diagnose(load(shared_trace("bert_small_infer_mi300.json.gz"))).session)
    gemms = tables["roofline"]
    gemms = gemms[gemms["kind"] == "gemm"]
    assert len(gemms) and set(gemms["unit"]) == {"matrix cores"}
    assert (gemms["tensor_core_kernels"] == "yes").all()
    assert (gemms["tile"] != "").all()  # hipBLASLt's kernels name their macro tiles
