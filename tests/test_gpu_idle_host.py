"""The gpu_idle_host table (what the host ran while the GPU idled outside every operator)
and the rules that read it: host-bound on traces, launch-bound's Python between operators."""

from __future__ import annotations

import pytest
from conftest import shared_trace
from test_tables import Trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables
from advisor.tables.gpu_idle_host import NOTHING

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


def test_other_idle_time_is_named_by_the_innermost_python_and_split_at_the_model():
    session = metrics_every_step()
    tables = compute_tables(session, ["gpu_idle", "gpu_idle_host"])
    host, idle = tables["gpu_idle_host"], tables["gpu_idle"]
    assert host["idle_ns"].sum() == idle.at["other", "idle_ns"]
    # log_metrics runs 10 ms a step, 2 of them inside tolist: 8 ms self, all outside the model.
    assert host.at["train.py(55): log_metrics", "outside_model_ns"] == 2 * 8 * MS
    assert host.at["train.py(55): log_metrics", "in_model_ns"] == 0
    assert host.at["torch/_tensor.py(900): tolist", "outside_model_ns"] == 2 * 2 * MS
    # A library frame is named by the user's line it was called under.
    assert host.at["torch/_tensor.py(900): tolist", "user_line"] == "train.py:55"
    # forward's Python around the matmul is in the model: 8 ms less the op (1 ms) and its kernel (1 ms).
    assert host.at["model.py(10): forward", "in_model_ns"] == 2 * 6 * MS
    assert host.at["model.py(10): forward", "share_of_step"] == pytest.approx(6 / 20)
    assert NOTHING not in host.index


def test_host_bound_on_a_trace_names_the_python_outside_the_model():
    session = metrics_every_step()
    findings = run_rules(session, compute_tables(session)).findings
    (host_bound,) = [f for f in findings if f.rule == "host-bound"]
    assert "log_metrics" in host_bound.message and "8.00 ms per step" in host_bound.message
    assert host_bound.saving.high_ms_per_step == pytest.approx(12.0)  # all 12 ms outside Forward
    lines = [(e.file, e.line) for e in host_bound.evidence if e.kind == "source_line"]
    assert ("train.py", 55) in lines
    launch = next(f for f in findings if f.rule == "launch-bound")
    assert launch.metrics["idle_python_ns_per_step"] == pytest.approx(6 * MS)
    assert "forward (model.py:10)" in launch.message


@pytest.mark.parametrize("name", ["bert_small_infer_h100.json.gz", "qwen0.5b_infer_h100.json.gz",
                                  "ddp_cnn_a100_rank0.json.gz", "resnet50_v100_num_workers_0.pt.trace.json.gz",
                                  "resnet50_v100_num_workers_4.pt.trace.json.gz"])
def test_on_real_traces_it_accounts_for_all_the_other_time_and_leaves_little_unnamed(name):
    tables = compute_tables(load(shared_trace(name)), ["gpu_idle", "gpu_idle_host"])
    host = tables["gpu_idle_host"]
    assert host["idle_ns"].sum() == tables["gpu_idle"].at["other", "idle_ns"]
    assert (host["in_model_ns"] + host["outside_model_ns"] == host["idle_ns"]).all()
    unnamed = host.at[NOTHING, "share_of_step"] if NOTHING in host.index else 0.0
    assert unnamed < 0.10


def test_transformer_inference_names_the_model_python_between_ops():
    tables = compute_tables(load(shared_trace("bert_small_infer_h100.json.gz")), ["gpu_idle_host"])
    host = tables["gpu_idle_host"]
    assert "transformers/models/bert/modeling_bert.py(181): forward" in host.index
    assert host["outside_model_ns"].sum() == 0  # inference: the whole step is Forward
