"""Nsight Compute's counters (../shared/gpu/ncu: real ncu output from an H200) read, matched
to a session's kernels and worded by the rules."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.errors import TraceError
from advisor.importers import load
from advisor.importers.ncu import attach, read_ncu
from advisor.rules import run_rules
from advisor.step import build_step_model
from advisor.tables import compute_tables

NCU = Path(__file__).resolve().parents[2] / "shared" / "gpu" / "ncu"


def pages(stem: str) -> list[Path]:
    paths = [NCU / f"{stem}_raw.csv", NCU / f"{stem}_details.csv"]
    if not all(p.is_file() for p in paths):
        pytest.skip("the real ncu output is not here: ../shared/gpu/ncu is absent on this machine")
    return paths


def raw_rows(path: Path) -> list[dict[str, str]]:
    """The raw page's kernels, each with its duration in ns by the page's own unit row."""
    rows = list(csv.reader(path.open()))
    unit = rows[1][rows[0].index("gpu__time_duration.sum")]
    scale = {"ns": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}[unit]
    return [{**dict(zip(rows[0], r)), "duration_ns": float(r[rows[0].index("gpu__time_duration.sum")]) * scale}
            for r in rows[2:]]


@pytest.mark.parametrize("stem", ["gpt2_fp32_gemm", "resnet50_fp32_kernels"])
def test_both_pages_are_read_and_the_figures_are_the_csvs(stem):
    raw, details = pages(stem)
    kernels = read_ncu([raw, details])
    expected = raw_rows(raw)
    assert len(kernels) == len(expected)
    for record, row in zip(kernels, expected):
        assert record["kernel"] == row["Kernel Name"]
        assert record["duration_ns"] == pytest.approx(row["duration_ns"])
        assert record["sm_pct"] == pytest.approx(float(row["sm__throughput.avg.pct_of_peak_sustained_elapsed"]))
        assert record["achieved_occupancy"] == pytest.approx(
            float(row["sm__warps_active.avg.pct_of_peak_sustained_active"]))
        assert record["registers"] == float(row["launch__registers_per_thread"])
        assert record["rules"], "the details page's rules are kept"
    # The details page alone gives the same kernels and the main figures.
    alone = read_ncu([details])
    assert [k["kernel"] for k in alone] == [k["kernel"] for k in kernels]
    assert alone[0]["sm_pct"] == pytest.approx(kernels[0]["sm_pct"], abs=0.01)


def test_the_occupancy_limiter_is_named():
    kernels = read_ncu(pages("gpt2_fp32_gemm"))
    assert kernels[0]["limiter"] == "registers" and kernels[0]["theoretical_occupancy"] == 25.0


def test_a_file_that_is_not_an_ncu_page_is_one_clear_error(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="not an Nsight Compute CSV page"):
        read_ncu([bad])


def _gpt2_trace(tmp_path: Path) -> Path:
    """A trace of the GEMMs ncu profiled: each kernel launched by an fp32 aten::mm, with
    the name, grid and block ncu gives it, on an H200."""
    kernels = read_ncu(pages("gpt2_fp32_gemm"))
    events, t, correlation = [], 0.0, 100
    for step in range(3):
        begin = t
        for k in kernels:
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 30,
                           "args": {"External id": correlation, "Input Dims": [[1024, 768], [768, 2304]],
                                    "Input type": ["float", "float"]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t + 5, "dur": 10, "args": {"correlation": correlation, "External id": correlation}})
            grid = json.loads(k["grid"])
            block = json.loads(k["block"])
            events.append({"ph": "X", "cat": "kernel", "name": k["kernel"], "pid": 0, "tid": 7, "ts": t + 20,
                           "dur": k["duration_ns"] / 1e3,
                           "args": {"device": 0, "stream": 7, "correlation": correlation, "grid": grid, "block": block}})
            # The loop reads a result back after each GEMM: the host waits for the GPU.
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                           "ts": t + 16, "dur": k["duration_ns"] / 1e3 + 6,
                           "args": {"correlation": 10_000 + correlation}})
            correlation += 1
            t += 30 + k["duration_ns"] / 1e3
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": begin, "dur": t - begin})
    trace = tmp_path / "gpt2.json"
    trace.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9,
                                                       "computeMinor": 0, "numSms": 132,
                                                       "totalGlobalMem": 150_000_000_000}],
                                 "traceEvents": events}))
    return trace


def test_every_profiled_kernel_is_matched_and_the_fp32_gemms_are_named_fma_work(tmp_path):
    session = attach(load(_gpt2_trace(tmp_path)), pages("gpt2_fp32_gemm"))
    steady = build_step_model(session).session
    tables = compute_tables(steady)
    counters = tables["kernel_counters"]
    assert len(counters) == 6 and counters["matched"].all()
    assert set(counters["op"]) == {"aten::mm"}
    assert counters["sm_pct"].iloc[0] == pytest.approx(87.29, abs=0.01)
    findings = {f.rule: f for f in run_rules(steady, tables).findings}
    tc = findings["tensor-core-misalignment"]
    assert "FMA pipes" in tc.message and "tensor pipes idle" in tc.message and "TF32 or bf16" in tc.message
    assert any(e.table == "kernel_counters" for e in tc.evidence)
    assert tc.saving.ms_per_step > 0, "the GPU sets the pace here: the fp32 GEMMs' time is the step's"


def test_diagnose_reads_an_ncu_export_given_on_the_command_line(tmp_path, capsys):
    raw, details = pages("gpt2_fp32_gemm")
    out = tmp_path / "r.json"
    assert main(["diagnose", str(_gpt2_trace(tmp_path)), "--ncu", str(raw), "--ncu", str(details),
                 "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "kernel_counters" in report["tables"]
    html = tmp_path / "r.html"
    assert main(["diagnose", str(_gpt2_trace(tmp_path)), "--ncu", str(raw), "--ncu", str(details),
                 "--format", "html", "-o", str(html)]) == 0
    page = html.read_text()
    card = page[page.index('id="chart-roofline"'):]
    assert 'id="chart-kernel-counters"' in card, "the counters sit beside the roofline chart"
    assert "registers" in card[card.index('id="chart-kernel-counters"'):]
    assert main(["diagnose", str(_gpt2_trace(tmp_path)), "--ncu", str(tmp_path / "none.csv")]) != 0
    assert "cannot be read" in capsys.readouterr().err


def test_a_kernel_at_the_hardware_limit_is_said_so():
    from advisor.rules.kernel_why import at_limit, why

    kernels = read_ncu(pages("gpt2_fp32_gemm"))
    row = {**kernels[3], "kernel": kernels[3]["kernel"]}
    assert at_limit(row)  # 92% of peak SM throughput
    assert "at the CUDA cores' limit" in why(row), "at the limit of the FMA pipes, not of the GPU"
    conv = read_ncu(pages("resnet50_fp32_kernels"))
    bn = next(k for k in conv if "bn_fw" in k["kernel"])
    assert "too few blocks to fill the GPU: 0.24 waves" in why(bn, 132)
    assert "limited by registers" in why(bn, 132)
    at_peak = {**bn, "sm_pct": 20.0, "memory_pct": 91.0, "dram_pct": 90.0, "waves": 12.0}
    assert at_limit(at_peak) and "at the hardware's limit (91% of peak memory throughput)" in why(at_peak)


def test_the_kernels_that_matter_are_profiled_past_the_warm_up_a_few_launches_each(tmp_path):
    import pandas as pd

    from advisor.collect.ncu_run import SECTIONS, plan

    kernels = pd.DataFrame({"gpu_total_ns": [900.0, 500.0, 10.0], "calls": [10, 20, 5]},
                           index=["void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor>(int)",
                                  "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8", "tiny_kernel"])
    the_plan = plan(kernels, "2", tmp_path / "train.py", ["--epochs", "1"], tmp_path, steps=5, warmup_steps=2,
                    ncu="/usr/local/cuda/bin/ncu", python="python3")
    assert the_plan.kernels == ("vectorized_elementwise_kernel", "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8")
    command = list(the_plan.command)
    assert command[command.index("-k") + 1] == f"regex:{the_plan.pattern}"
    assert the_plan.launch_skip == 12  # (10 + 20) launches over 5 steps, two warm-up steps
    assert the_plan.launch_count == 6
    assert all(section in command for section in SECTIONS)
    assert command[-3:] == [str(tmp_path / "train.py"), "--epochs", "1"] and "python3" in command
    assert "runs once more" in the_plan.cost
    by_regex = plan(kernels, "gemm", tmp_path / "train.py", [], tmp_path, steps=5, warmup_steps=2)
    assert by_regex.kernels == ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8",)
    assert plan(kernels, "no_such", tmp_path / "train.py", [], tmp_path, steps=5, warmup_steps=2) is None


def test_kernel_counters_on_a_trace_are_skipped_with_one_line(tmp_path, capsys):
    trace = _gpt2_trace(tmp_path)
    assert main(["diagnose", str(trace), "--kernel-counters", "3", "--format", "json", "-o",
                 str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert "kernel counters skipped: --kernel-counters runs a script again" in err


def _fake_ncu(tmp_path: Path, body: str):
    """A plan whose ncu is a small shell script standing in for Nsight Compute."""
    from advisor.collect.ncu_run import NcuPlan

    tool = tmp_path / "ncu"
    tool.write_text("#!/bin/sh\n" + body + "\n")
    tool.chmod(0o755)
    return NcuPlan(("k",), "k", 0, 3, (str(tool), "python3", "train.py"), tmp_path / "out.ncu-rep",
                   "the script runs once more under Nsight Compute.")


def test_counters_the_gpu_refuses_or_a_run_past_its_time_are_one_line(tmp_path):
    from advisor.collect.ncu_run import run

    refused = _fake_ncu(tmp_path, 'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"; exit 1')
    report, why = run(refused)
    assert report is None and "ERR_NVGPUCTRPERM" in why
    said: list[str] = []
    slow = _fake_ncu(tmp_path, "sleep 60 & wait")
    report, why = run(slow, timeout_s=1, say=said.append)
    assert report is None and "ran past 1 s and was stopped" in why
    assert said == [slow.cost], "the cost is said before it starts"
    asked: list[str] = []
    report, why = run(slow, confirm=lambda cost: asked.append(cost) or False)
    assert (report, why) == (None, "declined") and asked == [slow.cost]
    wrote = _fake_ncu(tmp_path, f'touch "{tmp_path / "out.ncu-rep"}"')
    assert run(wrote) == (tmp_path / "out.ncu-rep", None)
