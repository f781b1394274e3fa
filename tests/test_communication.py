"""communication-not-overlapped on one rank: collectives with no computation beside them,
judged from the distributed table, and only where the GPU sets the step's pace."""

from __future__ import annotations

import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables

MS = 1_000_000


def comm_session(*, host_ms: float, steps: int = 6):
    """Steps of a 40 ms matmul on the compute stream and then a 20 ms all-reduce on the
    communication stream, 4 ms of it beside the matmul and 16 ms alone. The host launches
    both, then works ``host_ms`` more and waits for the all-reduce: with little host work
    the GPU sets the pace, with much the host does."""
    t = Trace()
    base = 0.0
    for number in range(1, steps + 1):
        op = t.op("aten::mm", base, base + 1)
        t.gpu("sgemm", "kernel", base + 1, base + 41, launch=t.call("cudaLaunchKernel", base + 0.5, base + 0.6,
                                                                     parent=op))
        comm = t.op("c10d::allreduce_", base + 1, base + 2)
        t.gpu("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", base + 37, base + 57, stream=40, tid=40,
              launch=t.call("cudaLaunchKernel", base + 1.2, base + 1.3, parent=comm))
        t.op("aten::cpu_work", base + 2, base + 2 + host_ms)
        end = max(base + 2 + host_ms, base + 57) + 0.5
        t.call("cudaStreamSynchronize", base + 2 + host_ms, end)
        t.step(number, base, end)
        base = end
    return t.session()


def comm_finding(session):
    findings = run_rules(session, compute_tables(session)).findings
    return next((f for f in findings if f.rule == "communication-not-overlapped"), None)


def test_exposed_collectives_on_a_gpu_bound_rank_are_named_with_the_ddp_fix():
    finding = comm_finding(comm_session(host_ms=5))
    assert finding is not None
    assert "16.0 ms of it" in finding.message and "with no computation beside them" in finding.message
    # Overlap hides the 16 ms alone at most, half of it at the point estimate; the step is
    # the GPU's, so it loses what is hidden.
    assert finding.saving.high_ms_per_step <= 16.0 + 0.1
    assert 4.0 <= finding.saving.ms_per_step <= 16.0
    assert "bucket_cap_mb" in finding.recommendation and "no_sync" in finding.recommendation


def test_where_the_host_sets_the_pace_hiding_collectives_saves_nothing():
    # The host works 80 ms a step after launching: the GPU's 57 ms are done long before,
    # and hiding the all-reduce would not shorten the step.
    assert comm_finding(comm_session(host_ms=80)) is None


def test_the_ddp_trace_exposes_collectives_but_its_host_sets_the_pace():
    session = load(shared_trace("ddp_cnn_a100_rank0.json.gz"))
    tables = compute_tables(session)
    alone = tables["distributed"].at["Communication (not overlapped)", "total_ns"] / 3
    assert alone == pytest.approx(13.2e6, rel=0.01)  # 5.9 % of each 222 ms step
    # The GPU idles three quarters of the step while the host launches: hiding the
    # collectives would not shorten it, so no finding promises that it would.
    assert "communication-not-overlapped" not in {f.rule for f in run_rules(session, tables).findings}
