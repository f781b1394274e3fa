"""The diagnosis at the job's own pace (advisor.step.pace): the profiler's cost is never the user's.

Checked on the GPU recordings in cases/ (an H200 run whose first op recorder made each
recorded step two to three times the same step unrecorded): the step graph replayed at the
job's pace gives the step the same run measured without the profiler, the host alone never
takes longer than a step the job measured, and a fix that pins pageable copies names where
its copy rate comes from. On hand-made sessions: where no step ran unrecorded and nothing
was calibrated, the host is replayed as recorded and the pace says so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from advisor.importers import load
from advisor.rules import run_rules
from advisor.step import build_step_model
from advisor.tables import compute_tables

CASES = Path(__file__).resolve().parents[1] / "cases"
GPU_CASES = sorted(p.parent.parent.name for p in CASES.glob("gpu_*/session/session.json"))


def model_of(name: str):
    return build_step_model(load(CASES / name / "session"))


@pytest.mark.parametrize("name", GPU_CASES)
def test_the_replayed_step_is_the_step_the_job_measured_unprofiled(name):
    model = model_of(name)
    unrecorded = model.unrecorded_step_ns
    assert unrecorded, "the GPU cases ran steps after the window"
    graph = model.graph
    assert model.pace.source == "timed steps" and model.pace.changes
    # As recorded, the graph replays the profiled step: two to three times the job's.
    assert graph.recorded_baseline > 1.5 * unrecorded
    assert graph.baseline == pytest.approx(unrecorded, rel=0.10)


def test_what_recording_added_is_taken_off_phase_by_phase():
    model = model_of("gpu_small_batch")
    times = model.times
    steady = times.recorded[times.recorded["step"].isin(model.window.steps["step"])]
    added = float(steady["duration_ns"].mean() - times.unrecorded["duration_ns"].mean())
    # What the pace removes is what the recorded steps took over the unrecorded ones (the
    # waits on the device, which end when the device does, are not scaled).
    assert model.pace.removed_ns == pytest.approx(added, rel=0.10)
    assert "job's own pace" in model.pace.says


def test_a_trace_without_timed_steps_is_replayed_as_recorded_and_says_so(tmp_path):
    from builders import synth_trace

    session = load(synth_trace(tmp_path / "t.json", 2000))
    model = build_step_model(session)
    assert not model.pace.changes and model.pace.source == ""
    assert "profiler's own cost included" in model.pace.says
    assert model.graph.baseline == model.graph.recorded_baseline


def test_pinning_a_pageable_copy_is_sized_at_a_pinned_rate_it_names():
    session = load(CASES / "gpu_pageable_copies" / "session")
    steady = build_step_model(session).session
    finding = next(f for f in run_rules(steady, compute_tables(steady)).findings if f.rule == "sync-memcpy-stall")
    # No pinned copy in this session and no calibration here: the knowledge base's link.
    assert "pinned rate" in finding.saving.basis and "PCIe Gen5 x16" in finding.saving.basis
    assert "an estimate" in finding.saving.basis
    assert finding.saving.ms_per_step > 0.9, "the waits dropped and the copies shrunk: about a third of the step"


def test_the_pinned_twin_measures_its_own_pinned_rate():
    from advisor.rules.copy_rates import pinned_rate
    from advisor.rules.registry import RuleContext

    model = model_of("gpu_pageable_copies_pinned")
    ctx = RuleContext(tables={}, spec=None, step_count=model.steps, mean_step_ns=model.mean_step_ns,
                      window_ns=model.window.duration_ns, gpu_measured=True, model=model)
    rate = pinned_rate(ctx, "HtoD")
    assert rate is not None and not rate.estimate and "this session's own pinned HtoD copies" in rate.source
    assert 40 < rate.gbps < 70  # 7 MB copies over PCIe Gen5 x16


def test_a_host_that_is_only_slow_under_the_profiler_is_not_host_bound():
    """The first recordings' Python op recorder cost some 40 us an op: as recorded, the
    host looked slow at every kernel; at the job's pace it is an ordinary eager loop."""
    for name in GPU_CASES:
        model = model_of(name)
        steady = model.session
        found = [f for f in run_rules(steady, compute_tables(steady)).findings if f.rule == "host-bound"
                 and f.metrics.get("where") == "inside the model"]
        assert not found, f"{name}: {found[0].message}"


def test_pace_weighs_no_wait_on_the_device(monkeypatch):
    model = model_of("gpu_pageable_copies")
    graph = model.graph
    waits = graph.host_nodes("wait")
    assert waits.any() and (graph.pace[waits] == 1.0).all()
    assert (graph.pace[graph.kind == 1] == 1.0).all(), "GPU work keeps its time"
    assert isinstance(pd.Series(graph.pace).describe(), pd.Series)
