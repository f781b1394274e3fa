"""The step model's replay on a small generated GPU loop whose first kernel ran 40 ms late,
queued behind work the trace does not hold: a replayed step is never negative, and every
invariant of the step model holds (the Hypothesis test of tests/test_step_model.py found
this trace; it is kept here as data)."""

from __future__ import annotations

import json

import pytest
from test_step_model import check_invariants

from advisor.diagnosis import diagnose
from advisor.importers import load

DEVICE = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920, "computeMajor": 8,
          "computeMinor": 0, "numSms": 108}

# A start-up cudaFree, then four recorded steps of one launch each; the first step's
# kernel on stream 7 starts at 41.8 ms, 40 ms after its launch, the others within 5 us.
EVENTS = [  # (category, name, pid, tid, ts in us, dur in us, args): complete ("X") events
    ("cuda_runtime", "cudaFree", 77, 77, 10.0, 1000.0, {}),
    ("cpu_op", "aten::mm", 77, 77, 1015.0, 4.0, {}),
    ("cuda_runtime", "cudaLaunchKernel", 77, 77, 1016.0, 2.0, {"correlation": 1001}),
    ("kernel", "kernel_0", 0, 7, 41787.504, 1.0, {"device": 0, "stream": 7, "correlation": 1001}),
    ("cpu_op", "aten::mm", 77, 77, 1021.0, 4.0, {}),
    ("cuda_runtime", "cudaLaunchKernel", 77, 77, 1022.0, 2.0, {"correlation": 1002}),
    ("kernel", "kernel_1", 0, 13, 1026.0, 1.0, {"device": 0, "stream": 13, "correlation": 1002}),
    ("user_annotation", "ProfilerStep#0", 77, 77, 1015.0, 189.802, {}),
    ("cpu_op", "aten::mm", 77, 77, 1205.802, 17.921, {}),
    ("cuda_runtime", "cudaLaunchKernel", 77, 77, 1206.802, 15.921, {"correlation": 1003}),
    ("kernel", "kernel_0", 0, 13, 1224.723, 1.0, {"device": 0, "stream": 13, "correlation": 1003}),
    ("user_annotation", "ProfilerStep#1", 77, 77, 1205.802, 137.555, {}),
    ("cpu_op", "aten::mm", 77, 77, 1344.357, 4.0, {}),
    ("cuda_runtime", "cudaLaunchKernel", 77, 77, 1345.357, 2.0, {"correlation": 1004}),
    ("kernel", "kernel_0", 0, 13, 1349.357, 1.0, {"device": 0, "stream": 13, "correlation": 1004}),
    ("user_annotation", "ProfilerStep#2", 77, 77, 1344.357, 205.436, {}),
    ("cpu_op", "aten::mm", 77, 77, 1550.793, 4.0, {}),
    ("cuda_runtime", "cudaLaunchKernel", 77, 77, 1551.793, 2.0, {"correlation": 1005}),
    ("kernel", "kernel_0", 0, 13, 1555.793, 1.0, {"device": 0, "stream": 13, "correlation": 1005}),
    ("user_annotation", "ProfilerStep#3", 77, 77, 1550.793, 6.0, {}),
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "queued_work_negative_step.json"
    events = [{"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
              for cat, name, pid, tid, ts, dur, args in EVENTS]
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [DEVICE], "traceEvents": events}))
    return path


def test_the_replayed_step_is_never_negative(trace):
    d = diagnose(load(trace))
    graph = d.model.graph
    lo, hi = d.model.window.start_ns, d.model.window.end_ns
    # The steps complete in their order and no faster than the host issues them: the
    # replayed step lies between nothing and the window (4 steps, 0.54 ms).
    assert 0 < graph.baseline <= hi - lo
    assert 0 < graph.recorded_baseline <= hi - lo


def test_a_trace_with_work_queued_far_past_its_steps_holds_the_invariants(trace):
    check_invariants(load(trace))
