"""Traces as other profilers write them: what the trace does not say is read from what it does.

The smaller items of reading real traces: a GPU the trace names nowhere is named by its
kernels' architecture; a front end's trace that launched nothing says whose trace to read;
a step's GPU share never exceeds the step.
"""

from __future__ import annotations

import json

import pytest

from advisor.importers import load
from advisor.step import build_step_model
from advisor.tables import compute_tables


def _write(path, events, **top):
    path.write_text(json.dumps({**top, "traceEvents": events}))
    return path


@pytest.mark.parametrize("kernel, family", [
    ("volta_sgemm_128x64_nn", "Volta"), ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n", "Hopper"),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_nn", "Ampere"),
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "AMD Instinct"),
])
def test_a_gpu_the_trace_does_not_name_is_named_by_its_kernels_architecture(tmp_path, kernel, family):
    events = [{"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": i * 10, "dur": 5,
               "args": {"device": 0, "stream": 7}} for i in range(4)]
    session = load(_write(tmp_path / "t.json", events))
    gpu = next(d for d in session.meta.devices if d.kind == "gpu")
    assert family in gpu.name and "kernel names" in gpu.name


def test_a_process_that_launched_nothing_says_whose_trace_holds_the_gpu(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
               "args": {}} for i in range(4)]
    session = load(_write(tmp_path / "t.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA H100"}]))
    [note] = [n for n in session.meta.collector.notes if n.startswith("GPU not measured")]
    assert "launched no GPU work" in note and "another process" in note


def test_gpu_work_that_outlives_its_step_is_at_most_the_whole_step(tmp_path):
    events = []
    for step in range(4):
        t = step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": t, "dur": 1000})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 20,
                       "args": {"External id": step + 1}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t + 12, "dur": 5, "args": {"correlation": 100 + step, "External id": step + 1}})
        # Launched early in the step, it runs 1.5 steps long, into the next one's time.
        events.append({"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": t + 20, "dur": 1500,
                       "args": {"device": 0, "stream": 7, "correlation": 100 + step}})
    session = load(_write(tmp_path / "t.json", events))
    tables = compute_tables(build_step_model(session).session)
    assert tables["model"].loc["ProfileStep", "gpu_ratio"] <= 1.0
