"""A step is what repeats: iterations found in traces that mark no step, one-off work set
apart before anything is sized, a profile of one pass said at the top of the report (not
ranked among the findings), and the host's waits on the device never read as its own work.

The planted cases (cases/synth_wrapped_training, synth_compiled_iterations,
synth_gemm_benchmark, synth_serving_syncs, synth_one_pass_layers, synth_sync_benchmark,
synth_one_cold_pass) check each signal end to end; these tests check the parts, and the
real traces with their ProfilerStep ranges taken out against the same traces with them.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from builders import MS, Trace
from conftest import shared_trace

from advisor.diagnosis import diagnose
from advisor.findings import Severity
from advisor.importers import load
from advisor.session.attribute import main_thread
from advisor.step import build_step_model
from advisor.step.iterations import _Hashes, _recurring, find_iterations
from advisor.step.waits import blocking_calls
from advisor.units import format_saving


def _without_steps(src, dst):
    """A real trace with its ProfilerStep ranges taken out: the same loop, unmarked."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def _top(diagnosis):
    top = diagnosis.findings[0] if diagnosis.findings else None
    return (top.rule, top.saving.ms_per_step) if top else (None, 0.0)


# -- the loop's thread -----------------------------------------------------------------------------


def test_the_loop_s_thread_is_not_autograd_s_however_many_ops_it_holds():
    """On a GPU, backward runs on a thread of its own with more operators than the loop's:
    the loop's thread is the one that calls the model, not the busiest."""
    t = Trace()
    for i in range(3):
        base = i * 10.0
        for k in range(4):  # forward, on the loop's thread
            t.op("aten::linear", base + 0.2 * k, base + 0.2 * k + 0.1)
        for k in range(6):  # backward: outer node ranges, each with an operator inside
            node = t.op("autograd::engine::evaluate_function: AddmmBackward0", base + 2 + k, base + 2.8 + k, tid=2)
            t.op("aten::mm", base + 2.1 + k, base + 2.7 + k, parent=node, tid=2)
    session = t.session(gpu_measured=False)
    assert main_thread(session.events) == (1, 1)


def test_a_thread_holding_the_optimizer_steps_runs_the_loop():
    t = Trace()
    for i in range(3):
        t.op("aten::add", i * 10.0, i * 10.0 + 1, tid=3)
        t.op("aten::mul", i * 10.0 + 1, i * 10.0 + 2, tid=3)
        t.add("Optimizer.step#SGD.step", "annotation", i * 10.0 + 5, i * 10.0 + 6)
    assert main_thread(t.session(gpu_measured=False).events) == (1, 1)


# -- real traces, unmarked -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet50_v100_num_workers_0.pt.trace.json.gz", "ddp_cnn_a100_rank0.json.gz",
                                  "resnet50_v100_num_workers_4.pt.trace.json.gz"])
def test_a_real_loop_without_its_step_marks_gets_the_same_top_finding(name, tmp_path):
    """The loop wrapped whole, no ProfilerStep: its iterations are found from its own marks
    (the loader's reads, the optimizer's steps, found on the loop's thread past autograd's
    busier one), and the top finding and its saving are those of the marked trace."""
    marked = shared_trace(name)
    unmarked = _without_steps(marked, tmp_path / name)
    with_marks, without = diagnose(load(marked)), diagnose(load(unmarked))
    assert without.model.window.inferred and without.model.window.recurs
    assert without.model.steps == with_marks.model.steps
    (rule, saving), (rule_marked, saving_marked) = _top(without), _top(with_marks)
    assert rule == rule_marked
    assert saving == pytest.approx(saving_marked, rel=0.1)
    assert not without.report.session.window.headline


# -- what repeats --------------------------------------------------------------------------------


def test_one_op_called_n_times_is_n_iterations_and_its_set_up_is_set_apart():
    """A benchmark: inputs made (200 ms), then one operator called ten times (2 ms each):
    ten iterations, the set-up named once and in no step."""
    t = Trace()
    t.op("aten::randn", 0, 200)
    for i in range(10):
        start = 201 + 2.0 * i
        op = t.op("aten::mm", start, start + 1.8)
        t.call("cudaLaunchKernel", start + 0.1, start + 0.2, parent=op)
    model = build_step_model(t.session(gpu_measured=False))
    assert model.window.source == "op sequence" and model.steps == 10
    assert model.window.start_ns == 201 * MS
    (setup,) = [s for s in model.window.set_apart if s.kind == "set-up"]
    assert setup.duration_ns == 200 * MS and "aten::randn" in setup.what
    assert "10 steady" in model.window.how


def test_a_range_that_recurs_is_an_iteration_even_when_the_first_one_holds_most_of_the_run():
    """Three compiled regions, the first compiling for 40 ms: the region is an iteration
    (the first set apart as start-up), not a wrapper of the run to look inside."""
    t = Trace()
    start = 0.0
    for took in (43.5, 5.2, 4.9):
        t.add("Torch-Compiled Region: 0/0", "annotation", start, start + took)
        t.op("CompiledFunction", start + 0.1, start + took - 0.1)
        start += took + 0.1
    model = build_step_model(t.session(gpu_measured=False))
    assert model.window.source == "annotations"
    assert model.steps == 2
    assert [s.kind for s in model.window.set_apart] == ["start-up step"]


def test_repeated_ranges_are_one_range_whatever_numbers_their_names_carry():
    t = Trace()
    for i in range(4):
        t.add(f"execute_context_{i}_generation_{32 + i}", "annotation", i * 10.0, i * 10.0 + 8)
        t.op("aten::mm", i * 10.0 + 1, i * 10.0 + 7)
    model = build_step_model(t.session(gpu_measured=False))
    assert model.window.source == "annotations" and model.steps == 4


def _symbols(text):
    return np.array([ord(c) for c in text], dtype=np.int64)


def test_layers_of_one_pass_are_not_iterations_where_the_pass_goes_on_after_them():
    """Embedding, four identical layers, then a head holding far more work than a layer:
    the layers recur, the pass does not."""
    symbols = _symbols("E" + "LAM" * 4 + "LH")
    work = np.array([1] + [1, 5, 1] * 4 + [1, 40], dtype=np.float64)
    starts = np.arange(len(symbols), dtype=np.int64)
    assert _recurring(symbols, work, starts, starts + 1) is None
    # Where what follows the last block begins another one, the profile stopped inside it:
    # iterations.
    symbols = _symbols("E" + "LAM" * 4 + "LA")
    work = np.array([1] + [1, 5, 1] * 4 + [1, 5], dtype=np.float64)
    assert _recurring(symbols, work, starts, starts + 1) is not None


def test_a_block_of_bare_operators_without_shapes_is_no_iteration_but_one_call_or_a_call_site_is():
    """conv, relu, conv, relu...: a network's layers recur in one pass just so, so a block of
    several operators that carry no shapes and no call site is not taken for an iteration;
    one operator called N times is (a benchmark), and so is a block holding the script's own
    call site."""
    symbols = _symbols("CR" * 8)
    work = np.ones(len(symbols))
    starts = np.arange(len(symbols), dtype=np.int64)
    bare = np.zeros(len(symbols), dtype=bool)
    assert _recurring(symbols, work, starts, starts + 1, sites=bare, shaped=bare) is None
    site = bare.copy()
    site[1::2] = True
    heads, unit, _ = _recurring(symbols, work, starts, starts + 1, sites=site, shaped=bare)
    assert unit == 2 and len(heads) == 8
    one = _symbols("M" * 8)
    heads, unit, _ = _recurring(one, np.ones(8), np.arange(8), np.arange(8) + 1, sites=bare[:8], shaped=bare[:8])
    assert unit == 1 and len(heads) == 8


def test_calls_that_repeat_at_an_uneven_pace_are_no_loop():
    """Three calls of one operator with a long pause between two of them (a test program
    calling matmul here and there) are not three iterations."""
    symbols = _symbols("MMM")
    starts = np.array([0, 10, 5_000], dtype=np.int64)
    assert _recurring(symbols, np.ones(3), starts, starts + 5) is None


def test_the_slice_hashes_agree_with_the_slices():
    symbols = np.array([3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1], dtype=np.int64)
    h = _Hashes(symbols)
    assert h.of(np.array([0]), np.array([4]))[0] == h.of(np.array([8]), np.array([12]))[0]
    assert h.of(np.array([0]), np.array([4]))[0] != h.of(np.array([1]), np.array([5]))[0]


def test_a_host_running_ahead_of_the_device_gets_steps_on_the_device_s_pace():
    """Ten launches 0.1 ms apart of 2 ms kernels, one wait at the end: each step is a
    kernel's 2 ms on the device, not the host's 0.1 ms."""
    t = Trace()
    gpu = 1.0
    for i in range(10):
        start = 1.0 + 0.1 * i
        op = t.op("aten::mm", start, start + 0.05)
        call = t.call("cudaLaunchKernel", start + 0.01, start + 0.04, parent=op)
        gpu = max(gpu, start + 0.05) + 2.0
        t.gpu("gemm", "kernel", gpu - 2.0, gpu, launch=call)
    found = find_iterations(t.session().events, (1, 1))
    took = (found.steps["end_ns"] - found.steps["start_ns"]).to_numpy()
    assert len(took) == 10 and np.allclose(took, 2 * MS, rtol=0.05)


def test_the_kernels_recurring_give_the_steps_where_the_host_recorded_nothing():
    t = Trace()
    at = 0.0
    for _ in range(5):
        for name in ("gemm", "softmax", "gemm_out"):
            t.gpu(name, "kernel", at, at + 0.5)
            at += 0.6
    found = find_iterations(t.session().events, None)
    assert found.source == "kernel sequence" and len(found.steps) == 5


# -- one pass: a headline, savings per pass ------------------------------------------------------


def _one_pass():
    t = Trace()
    for k, name in enumerate(("aten::conv2d", "aten::batch_norm", "aten::relu", "aten::max_pool2d", "aten::linear")):
        start = k * 2.0
        op = t.op(name, start, start + 1.5)
        call = t.call("cudaLaunchKernel", start + 0.1, start + 1.4, parent=op)
        t.gpu(f"kernel_{k}", "kernel", start + 1.45, start + 1.5, launch=call)
    return t.session()


def test_a_profile_of_one_pass_is_said_at_the_top_and_never_ranked_among_the_findings():
    diagnosis = diagnose(_one_pass())
    window = diagnosis.report.session.window
    assert window.one_pass and window.headline.startswith("One pass")
    assert "torch.profiler.schedule" in window.headline
    assert "not-steady-state" not in {f.rule for f in diagnosis.findings}
    assert diagnosis.findings, "the pass's idle GPU is still judged"
    for finding in diagnosis.findings:
        assert finding.saving.per == "pass" and "/pass" in format_saving(finding.saving)
        # Seen once, a cost is not known to recur: never HIGH.
        assert finding.severity.rank <= Severity.medium.rank, (finding.rule, finding.severity)


@pytest.mark.parametrize("fmt", ["terminal_text", "render_markdown", "render_html", "render_json"])
def test_every_format_shows_the_one_pass_headline(fmt):
    import advisor.reports

    text = getattr(advisor.reports, fmt)(diagnose(_one_pass()).report)
    assert "One pass: this profile holds no step" in " ".join(text.split())


def test_a_profile_that_recurs_has_no_headline_and_savings_per_step():
    t = Trace()
    for i in range(4):
        t.step(i, i * 10.0, i * 10.0 + 10)
        op = t.op("aten::mm", i * 10.0, i * 10.0 + 9)
        call = t.call("cudaLaunchKernel", i * 10.0 + 8, i * 10.0 + 8.1, parent=op)
        t.gpu("gemm", "kernel", i * 10.0 + 8.2, i * 10.0 + 9.5, launch=call)
    diagnosis = diagnose(t.session())
    assert not diagnosis.report.session.window.headline and not diagnosis.report.session.window.one_pass
    assert all(f.saving.per == "step" for f in diagnosis.findings)


# -- waits are waits -------------------------------------------------------------------------------


def test_python_synchronize_frames_are_waits_even_without_their_runtime_call(tmp_path):
    """torch.cuda.synchronize() recorded as Python frames only (a tracer that leaves the
    runtime call out): a device synchronize, and never the host's own work."""
    t = Trace()
    op = t.op("aten::mm", 0, 0.05)
    call = t.call("cudaLaunchKernel", 0.01, 0.04, parent=op)
    t.gpu("gemm", "kernel", 0.05, 0.15, launch=call)
    outer = t.add("torch/cuda/__init__.py(1040): synchronize", "python", 0.1, 322.0)
    t.add("<built-in method _cuda_synchronize of PyCapsule object at 0x7f00>", "python", 0.11, 321.9)
    model = build_step_model(t.session())
    waits = blocking_calls(model.facts)
    assert waits["row"].tolist() == [outer] and waits["reason"].tolist() == ["device synchronize"]
    assert model.partition.ns("blocking sync") > 300 * MS
    assert model.partition.ns("host outside model") < 1 * MS


def test_a_synchronize_frame_around_its_runtime_call_is_one_wait():
    t = Trace()
    t.add("torch/cuda/__init__.py(1040): synchronize", "python", 0, 10)
    t.call("cudaDeviceSynchronize", 0.1, 9.9)
    waits = blocking_calls(build_step_model(t.session()).facts)
    assert waits["name"].tolist() == ["cudaDeviceSynchronize"]


def test_a_lazy_first_launch_is_start_up_not_work_in_flight():
    """A 60 ms launch call (its kernel's module loaded on first use) whose kernel starts as
    it returns: start-up, and the kernel waited on nothing the trace does not hold."""
    t = Trace()
    for i in range(4):
        start = 100.0 * i
        op = t.op("aten::mm", start, start + (60 if i == 0 else 1))
        call = t.call("cudaLaunchKernel", start + 0.1, start + (59.9 if i == 0 else 0.2), parent=op)
        t.gpu("gemm", "kernel", start + (60 if i == 0 else 0.3), start + (61 if i == 0 else 1.3), launch=call)
        t.add("Optimizer.step#SGD.step", "annotation", start + 70, start + 71)
    model = build_step_model(t.session())
    assert not [s for s in model.window.set_apart if s.kind == "in flight"]


def test_the_window_note_names_everything_set_apart_in_one_line():
    t = Trace()
    t.op("aten::randn", 0, 200)
    for i in range(6):
        start = 201 + 2.0 * i
        t.op("aten::mm", start, start + 1.8)
    session = build_step_model(t.session(gpu_measured=False)).session
    (line,) = [n for n in session.meta.collector.notes if n.startswith("Seen once and set apart")]
    assert "200 ms (set-up 200 ms)" in line


def test_steps_found_keep_the_schema_of_steps():
    found = find_iterations(pd.DataFrame({c: [] for c in ("kind", "name", "pid", "tid", "start_ns", "end_ns")}), None)
    assert found is None
