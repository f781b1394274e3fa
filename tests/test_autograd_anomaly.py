"""The autograd_anomaly table and autograd-anomaly-detection: backward's NaN checks that
anomaly detection adds, on hand-made sessions with known answers (the stack capture in
forward, from the sampler's samples, is checked on the recorded case cpu_anomaly_left_on)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import Trace

from advisor.rules import run_rules
from advisor.tables import compute_tables

FUNCTIONS = 10  # autograd functions backward runs a step


def session(*, anomaly: bool = True):
    """Four CPU steps of 20 ms: a Forward phase (8 ms of one operator), a Backward phase
    of ten autograd functions (each 0.5 ms of its own work, then, with ``anomaly``, a NaN
    check: aten::isnan 0.2 ms and aten::_is_any_true 0.25 ms inside the function's range),
    and the script's own NaN check of the loss outside both (not anomaly mode's)."""
    t = Trace()
    for number in range(1, 5):
        base = 20.0 * (number - 1)
        t.step(number, base, base + 20)
        t.phase("Forward", base, base + 8)
        t.op("aten::linear", base + 0.1, base + 7.9)
        t.phase("Backward", base + 8, base + 18)
        for k in range(FUNCTIONS):
            start = base + 8 + k
            engine = t.op("autograd::engine::evaluate_function: AddmmBackward0", start, start + 0.96)
            t.op("aten::mm", start + 0.01, start + 0.5, parent=engine)
            if anomaly:
                t.op("aten::isnan", start + 0.5, start + 0.7, parent=engine)
                t.op("aten::_is_any_true", start + 0.7, start + 0.95, parent=engine)
        t.op("aten::isnan", base + 18.5, base + 18.7)  # torch.isnan(loss).any() in the script
        t.op("aten::_is_any_true", base + 18.7, base + 18.8)
    return t.session(gpu_measured=False)


def test_the_table_counts_backwards_checks_and_leaves_the_scripts_own_out():
    table = compute_tables(session(), ["autograd_anomaly"])["autograd_anomaly"]
    row = table.loc["anomaly detection"]
    assert row["checks"] == 4 * FUNCTIONS and row["checks_per_step"] == FUNCTIONS
    assert row["check_per_step_ns"] == pytest.approx(FUNCTIONS * 0.45e6)
    assert row["forward_samples"] == 0 and row["capture_samples"] == 0  # no sampler in a hand-made session
    assert compute_tables(session(anomaly=False), ["autograd_anomaly"])["autograd_anomaly"].empty


def test_the_rule_names_anomaly_detection_and_saves_the_checks():
    planted = session()
    findings = {f.rule: f for f in run_rules(planted, compute_tables(planted)).findings}
    finding = findings["autograd-anomaly-detection"]
    assert f"each of its {FUNCTIONS} functions a step for NaN" in finding.message
    assert "set_detect_anomaly" in finding.recommendation
    # The step replayed without the checks: 4.5 ms of host work a step, nothing else changed.
    assert finding.saving.ms_per_step == pytest.approx(4.5, abs=0.05)
    clean = session(anomaly=False)
    assert "autograd-anomaly-detection" not in {f.rule for f in run_rules(clean, compute_tables(clean)).findings}


def test_the_launchers_frames_in_each_captured_stack_are_its_share_not_the_scripts():
    from advisor.tables.autograd_anomaly import _launcher_share

    # Innermost first: the capture, two frames of the script's model, its <module>, then
    # three frames of whatever ran it (advisor): 3 of the 6 frames the capture formats.
    stack = ";".join(["/py/lib/traceback.py(10): format_stack", "/torch/nn/linear.py(5): forward",
                      "train.py(20): main", "train.py(30): <module>", "<frozen runpy>(88): _run_code",
                      "/advisor/collect/script.py(9): run_script", "/bin/advisor(8): <module>"])
    assert _launcher_share(stack) == pytest.approx(3 / 6)
    # Run alone (python train.py), the script's <module> is the outermost frame.
    assert _launcher_share(stack.split(";<frozen runpy>")[0]) == 0.0


CASE = Path(__file__).resolve().parents[1] / "cases" / "cpu_anomaly_left_on" / "session"


def test_on_the_recorded_case_the_point_counts_the_scripts_frames_and_the_high_end_the_capture_as_recorded():
    from advisor.importers.loader import load

    session = load(CASE)
    finding = next(f for f in run_rules(session, compute_tables(session)).findings
                   if f.rule == "autograd-anomaly-detection")
    assert "run alone" in finding.message and "under advisor" in finding.message
    # About half of each captured stack is advisor's own frames: the point is well under the
    # capture as recorded, which is the high end.
    assert finding.saving.ms_per_step < 0.8 * finding.saving.high_ms_per_step


def test_on_the_recorded_case_the_share_is_of_the_step_the_combined_estimate_replays():
    # The share is of the job's own step (the launcher's frames out of the capture), the step
    # the combined estimate replays too: alone, the finding and the combined estimate give the
    # same share (they were 25 % against 32 %, the finding's of the step as recorded).
    from advisor.diagnosis import diagnose
    from advisor.importers.loader import load

    # Alone: the case's AdamW is a finding of its own (optimizer-not-fused), left out here.
    report = diagnose(load(CASE), disabled=["optimizer-not-fused"]).report
    finding = next(f for f in report.findings if f.rule == "autograd-anomaly-detection")
    assert report.combined is not None and report.combined.rules == ["autograd-anomaly-detection"]
    assert finding.saving.ms_per_step == pytest.approx(report.combined.ms_per_step, rel=0.01)
    assert finding.saving.share_of_step == pytest.approx(report.combined.share_of_step, abs=0.02)
    assert finding.saving.ms_per_step * 1e6 / report.session.steps.mean_step_ns < finding.saving.share_of_step - 0.04
