"""communication-not-overlapped on one rank: collectives with no computation beside them,
judged from the distributed table, and only where the GPU sets the step's pace."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import shared_trace

from advisor.importers import load
from advisor.rules import RuleContext, builtin_specs, run_rules
from advisor.rules.engine import checks
from advisor.tables import compute_tables

MS = 1_000_000


def context(*, gpu_busy_ms: float, blocking_ms: float) -> RuleContext:
    """Two 100 ms steps; per step 20 ms of collectives, 16 ms of them alone, and 30 ms of
    computation alone."""
    spec = next(s for s in builtin_specs() if s.id == "communication-not-overlapped")
    distributed = pd.DataFrame({"total_ns": [200 * MS, 40 * MS, 90 * MS, 8 * MS, 32 * MS, 60 * MS]},
                               index=["ProfileStep", "Communication", "Computation", "Overlap",
                                      "Communication (not overlapped)", "Computation (not overlapped)"])
    balance = pd.DataFrame({"step_ns": [100 * MS], "gpu_busy_ns": [gpu_busy_ms * MS],
                            "blocking_ns": [blocking_ms * MS]}, index=["mean"])
    idle = pd.DataFrame({"idle_ns": [2 * (100 - gpu_busy_ms) * MS]}, index=["launching"])
    return RuleContext(tables={"distributed": distributed, "step_gpu": balance, "gpu_idle": idle}, spec=spec,
                       step_count=2, mean_step_ns=100 * MS, window_ns=200 * MS, gpu_measured=True)


def test_exposed_collectives_on_a_gpu_bound_rank_are_named_with_the_ddp_fix():
    (finding,) = checks()["communication-not-overlapped"](context(gpu_busy_ms=98, blocking_ms=10))
    assert "16.0 ms of it (16.0% of the step) with no computation beside them" in finding.message
    assert finding.saving.ms_per_step == pytest.approx(8.0)  # half of the 16 ms the lone computation could hide
    assert finding.saving.high_ms_per_step == pytest.approx(16.0)
    assert "bucket_cap_mb" in finding.recommendation and "no_sync" in finding.recommendation


def test_where_the_host_sets_the_pace_hiding_collectives_saves_only_the_waits_on_a_busy_gpu():
    assert checks()["communication-not-overlapped"](context(gpu_busy_ms=40, blocking_ms=0.05)) == []
    (finding,) = checks()["communication-not-overlapped"](context(gpu_busy_ms=40, blocking_ms=3))
    assert finding.saving.ms_per_step == pytest.approx(3.0) and "the host sets the pace" in finding.message


def test_the_ddp_trace_exposes_collectives_but_its_host_sets_the_pace():
    session = load(shared_trace("ddp_cnn_a100_rank0.json.gz"))
    tables = compute_tables(session)
    alone = tables["distributed"].at["Communication (not overlapped)", "total_ns"] / 3
    assert alone == pytest.approx(13.2e6, rel=0.01)  # 5.9 % of each 222 ms step
    # The GPU idles three quarters of the step while the host launches: hiding the
    # collectives would not shorten it, so no finding promises that it would.
    assert "communication-not-overlapped" not in {f.rule for f in run_rules(session, tables).findings}
