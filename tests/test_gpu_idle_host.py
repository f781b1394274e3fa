"""The gpu_idle_host table (what the host ran while the GPU idled with the host at work, by
the innermost range, each nanosecond once) and host-bound, which reads it on traces."""

from __future__ import annotations

import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables
from advisor.tables.gpu_idle_host import NOTHING

HOST_CAUSES = ["host in model", "host outside model", "unrecorded"]

MS = 1_000_000


def metrics_every_step():
    """Two 20 ms steps: a Forward phase of 8 ms whose Python calls one matmul (1 ms on the
    GPU), then 10 ms of the script's own Python outside every phase with the GPU idle."""
    t = Trace()
    for number, base in ((1, 0), (2, 20)):
        t.step(number, base, base + 20)
        t.phase("Forward", base, base + 8)
        t.add("train.py(30): train", "python", base, base + 20)
        t.add("model.py(10): forward", "python", base, base + 8)
        mm = t.op("aten::mm", base + 1, base + 2)
        t.gpu("gemm", "kernel", base + 2, base + 3, launch=t.call("cudaLaunchKernel", base + 1.5, base + 1.8, parent=mm))
        t.add("train.py(55): log_metrics", "python", base + 9, base + 19)
        t.add("torch/_tensor.py(900): tolist", "python", base + 12, base + 14)
    return t.session()


def test_the_host_s_idle_time_is_named_by_the_innermost_range_and_split_at_the_model():
    session = metrics_every_step()
    tables = compute_tables(session, ["gpu_idle", "gpu_idle_host"])
    host, idle = tables["gpu_idle_host"], tables["gpu_idle"]
    # Each nanosecond once: the rows are the GPU idle time with the host at work.
    assert host["idle_ns"].sum() == idle.loc[HOST_CAUSES, "idle_ns"].sum()
    # log_metrics runs 10 ms a step, 2 of them inside tolist: 8 ms its own, all outside the model.
    assert host.at["train.py(55): log_metrics", "outside_model_ns"] == 2 * 8 * MS
    assert host.at["train.py(55): log_metrics", "in_model_ns"] == 0
    assert host.at["torch/_tensor.py(900): tolist", "outside_model_ns"] == 2 * 2 * MS
    # A library frame is named by the user's line it was called under, and by the
    # outermost call of the user's code around it.
    assert host.at["torch/_tensor.py(900): tolist", "user_line"] == "train.py:55"
    assert host.at["torch/_tensor.py(900): tolist", "outer_function"] == "train"
    # forward's Python around the matmul is in the model: 8 ms less the op (1 ms) and its kernel (1 ms).
    assert host.at["model.py(10): forward", "in_model_ns"] == 2 * 6 * MS
    assert host.at["model.py(10): forward", "share_of_step"] == pytest.approx(6 / 20)
    assert NOTHING not in host.index


def test_host_bound_on_a_trace_names_the_python_outside_the_model():
    session = metrics_every_step()
    findings = run_rules(session, compute_tables(session)).findings
    (host_bound,) = [f for f in findings if f.rule == "host-bound"]
    assert "log_metrics" in host_bound.message and "8.00 ms per step" in host_bound.message
    assert "runs under train" in host_bound.message  # the outermost call of the user's code
    # All 12 ms outside Forward at most: the step replayed without them.
    assert host_bound.saving.high_ms_per_step == pytest.approx(12.0, abs=0.01)
    lines = [(e.file, e.line) for e in host_bound.evidence if e.kind == "source_line"]
    assert ("train.py", 55) in lines
    # One kernel a step is not launch overhead, however idle the GPU.
    assert "launch-bound" not in {f.rule for f in findings}


@pytest.mark.parametrize("name", ["bert_small_infer_h100.json.gz", "qwen0.5b_infer_h100.json.gz",
                                  "ddp_cnn_a100_rank0.json.gz", "resnet50_v100_num_workers_0.pt.trace.json.gz",
                                  "resnet50_v100_num_workers_4.pt.trace.json.gz"])
def test_on_real_traces_it_accounts_for_all_the_host_s_time_and_leaves_little_unnamed(name):
    tables = compute_tables(load(shared_trace(name)), ["gpu_idle", "gpu_idle_host"])
    host = tables["gpu_idle_host"]
    assert host["idle_ns"].sum() == tables["gpu_idle"].loc[HOST_CAUSES, "idle_ns"].sum()
    assert (host["in_model_ns"] + host["outside_model_ns"] == host["idle_ns"]).all()
    unnamed = host.at[NOTHING, "share_of_step"] if NOTHING in host.index else 0.0
    assert unnamed < 0.10


def test_transformer_inference_names_the_model_python_between_ops():
    tables = compute_tables(load(shared_trace("bert_small_infer_h100.json.gz")), ["gpu_idle_host"])
    host = tables["gpu_idle_host"]
    assert "transformers/models/bert/modeling_bert.py(181): forward" in host.index
    # Forward is the model's call (the top nn.Module frame): the harness's Python around it,
    # in the step but outside the model, is a small share, named by the function it ran in.
    assert host["in_model_ns"].sum() > 10 * host["outside_model_ns"].sum() > 0
    outside = host[(host["outside_model_ns"] > 0) & (host["source"] == "python")]
    assert set(outside["user_function"]) == {"run_on_input"}


def test_a_function_called_from_two_lines_is_named_by_the_line_that_holds_most_of_its_time():
    """tolist runs 1 ms a step under train.py:40 and 5 ms under train.py:55: the row names
    line 55, whichever call comes first."""
    t = Trace()
    for number, base in ((1, 0), (2, 20)):
        t.step(number, base, base + 20)
        t.add("train.py(30): train", "python", base, base + 20)
        t.add("train.py(40): peek", "python", base + 1, base + 3)
        t.add("torch/_tensor.py(900): tolist", "python", base + 1, base + 2)
        t.add("train.py(55): log_metrics", "python", base + 5, base + 15)
        t.add("torch/_tensor.py(900): tolist", "python", base + 6, base + 11)
        mm = t.op("aten::mm", base + 16, base + 17)
        launch = t.call("cudaLaunchKernel", base + 16.2, base + 16.5, parent=mm)
        t.gpu("gemm", "kernel", base + 17, base + 18, launch=launch)
    host = compute_tables(t.session(), ["gpu_idle_host"])["gpu_idle_host"]
    assert host.at["torch/_tensor.py(900): tolist", "user_line"] == "train.py:55"
    assert host.at["torch/_tensor.py(900): tolist", "user_function"] == "log_metrics"
