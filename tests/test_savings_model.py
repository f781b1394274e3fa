"""The saving a fix that overlaps loading can promise: the step replayed with the loading
overlapped (advisor.step.whatif) on hand-made loops, the floors worker processes and the
cores set (advisor.rules.savings), the step_gpu table, and the ResNet-50 trace pair, whose
second trace is the fix applied."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from builders import Trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.rules.savings import StepFigures, best_workers, step_after, worker_floor
from advisor.session import CollectorInfo, Session, SessionMeta, conform_events
from advisor.step import build_step_model
from advisor.step.whatif import Fix, what_if
from advisor.tables import compute_tables

MS = 1_000_000
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
RESNET_BEFORE = TRACES / "resnet50_v100_num_workers_0.pt.trace.json.gz"
RESNET_AFTER = TRACES / "resnet50_v100_num_workers_4.pt.trace.json.gz"


def loop(steps: int = 3, *, loading: float = 40, host: float = 60, kernel: float = 0.0):
    """Steps of ``loading`` ms in the Dataloader phase, then ``host`` ms of Forward that
    launches one kernel of ``kernel`` ms (none where 0) at its start; the host waits for the
    device at the step's end where there is a kernel."""
    t = Trace()
    at = 0.0
    for n in range(steps):
        gpu_end = at + loading + 0.02 + kernel
        end = max(at + loading + host, gpu_end if kernel else 0.0) + (0.01 if kernel else 0.0)
        t.step(n, at, end)
        t.phase("Dataloader", at, at + loading)
        t.phase("Forward", at + loading, end)
        if kernel:
            call = t.call("cudaLaunchKernel", at + loading, at + loading + 0.01)
            t.gpu("gemm", "kernel", at + loading + 0.02, gpu_end, launch=call)
            t.call("cudaDeviceSynchronize", at + loading + host, end)
        at = end
    return build_step_model(t.session(gpu_measured=bool(kernel)))


GONE = {"loading": 0.0}


# -- the step replayed with the loading overlapped ----------------------------------------------


def test_without_a_gpu_the_rest_of_the_host_work_is_what_remains():
    model = loop()
    point = what_if(model.graph, Fix("workers", GONE, rest_factor=1.05))
    assert point.before_ns == pytest.approx(100 * MS)
    assert point.after_ns == pytest.approx(60 * MS * 1.05)
    worst = what_if(model.graph, Fix("workers, at worst", GONE, rest_factor=1.3))
    best = what_if(model.graph, Fix("workers, at best", GONE))
    assert worst.saved_ns < point.saved_ns < best.saved_ns == pytest.approx(40 * MS)


def test_the_gpu_s_own_work_is_a_floor():
    model = loop(host=10, kernel=90)  # the host waits for a 90 ms kernel each step
    replay = what_if(model.graph, Fix("workers", GONE))
    assert replay.before_ns == pytest.approx(130 * MS, rel=1e-3)
    assert replay.after_ns == pytest.approx(90 * MS, rel=1e-3)  # the kernel, back to back


def test_a_fix_never_saves_more_than_it_changes_nor_goes_negative():
    model = loop(host=10, kernel=90)
    slower = what_if(model.graph, Fix("workers, at worst", GONE, rest_factor=3.0))
    assert 0 <= slower.saved_ns <= slower.changed_ns
    floored = what_if(model.graph, Fix("workers", GONE, floor_ns=200 * MS))
    assert floored.saved_ns == 0.0 and floored.floor_bound


def test_too_few_workers_and_too_few_cores_are_floors():
    fig = StepFigures(step_ns=100 * MS, moved_ns=90 * MS, workers=2)
    assert step_after(fig, 1.0) == (pytest.approx(45 * MS), "workers")
    on_two_cores = StepFigures(**{**fig.__dict__, "workers": 4, "cores": 2.0})
    assert step_after(on_two_cores, 1.0) == (pytest.approx(50 * MS), "cpu")  # (10 + 90) / 2
    waiting = StepFigures(**{**on_two_cores.__dict__, "moved_cpu_share": 0.1})
    assert step_after(waiting, 1.0) == (pytest.approx(22.5 * MS), "workers")  # 90 / 4: the cores are not the limit


def test_best_workers_takes_the_fewest_that_come_close_to_the_best():
    fig = StepFigures(step_ns=100 * MS, moved_ns=90 * MS, cores=2.0)
    assert best_workers(fig, 1.0, cap=8) == 2  # beyond two the cores bind
    waiting = StepFigures(**{**fig.__dict__, "moved_cpu_share": 0.05})
    assert best_workers(waiting, 1.0, cap=8) == 8


# -- the step_gpu table --------------------------------------------------------------------------


def _session() -> Session:
    rows, next_id = [], 0

    def add(**row):
        nonlocal next_id
        rows.append({"id": next_id, **row})
        next_id += 1
        return next_id - 1

    for i in range(2):
        start = i * 100 * MS
        add(name=f"ProfilerStep#{i}", kind="step", start_ns=start, end_ns=start + 100 * MS, step=i, pid=1, tid=1)
        for k in range(3):  # three launches, the last at +60 ms; its kernel ends at +80 ms
            at = start + (20 + 20 * k) * MS
            launch = add(name="cudaLaunchKernel", kind="runtime", start_ns=at, end_ns=at + MS // 100, step=i,
                         pid=1, tid=1, correlation=10 * i + k)
            add(name="k", kind="kernel", start_ns=at + MS, end_ns=at + (20 if k == 2 else 5) * MS, device=0,
                stream=7, correlation=10 * i + k, launch=launch, step=i)
        add(name="tiny", kind="kernel", start_ns=start + 90 * MS, end_ns=start + 90 * MS + 4_000, device=0,
            stream=7, step=i)
    meta = SessionMeta(source="t", source_format="kineto", created="2024-01-01T00:00:00+00:00",
                       collector=CollectorInfo(name="kineto-import", gpu_measured=True))
    return Session(meta, conform_events(pd.DataFrame(rows)))


def test_step_gpu_counts_the_gpu_s_work_and_its_tail_per_step():
    table = compute_tables(_session(), ["step_gpu"])["step_gpu"]
    assert list(table.index) == ["step 0", "step 1", "mean"]
    row = table.loc["step 0"]
    assert row["step_ns"] == 100 * MS
    assert row["kernels"] == 4 and row["short_kernels"] == 1 and row["launches"] == 3
    assert row["gpu_busy_ns"] == 4 * MS + 4 * MS + 19 * MS + 4_000
    # the last launch returns at +60.01 ms; the step's GPU work runs until +90.004 ms
    assert row["tail_ns"] == 90 * MS + 4_000 - (60 * MS + MS // 100)
    assert table.loc["mean", "kernels"] == 4


def test_step_gpu_is_empty_with_a_note_when_the_gpu_was_not_measured():
    session = _session()
    session.meta.collector = CollectorInfo(name="host", gpu_measured=False)
    events = session.events
    session = Session(session.meta, events[~events["kind"].isin(["kernel"])].reset_index(drop=True))
    table = compute_tables(session, ["step_gpu"])["step_gpu"]
    assert table.empty and table.attrs["notes"]


# -- the ResNet-50 pair: the fix applied --------------------------------------------------------


@pytest.mark.skipif(not (RESNET_BEFORE.is_file() and RESNET_AFTER.is_file()),
                    reason=f"the ResNet-50 trace pair is not in {TRACES}")
def test_the_loader_saving_holds_on_the_resnet_pair():
    before, after = load(RESNET_BEFORE), load(RESNET_AFTER)
    findings = run_rules(before, compute_tables(before)).findings
    finding = max(findings, key=lambda f: f.saving.ms_per_step)
    assert finding.rule == "dataloader-starvation"

    def mean_step(session):  # the steady steps' (the second trace's first step waits on work in flight)
        return build_step_model(session).mean_step_ns / MS

    measured = mean_step(before) - mean_step(after)  # 174.8 -> 131.3 ms
    saving = finding.saving
    assert saving.low_ms_per_step <= measured <= saving.high_ms_per_step
    assert 0.67 <= saving.ms_per_step / measured <= 1.5
    assert "the GPU's own work" in saving.remains


def test_the_workers_floor_is_what_the_graph_cannot_see():
    fig = StepFigures(step_ns=100 * MS, moved_ns=90 * MS, workers=2)
    assert worker_floor(fig, 1.0) == pytest.approx(45 * MS)
    on_two_cores = StepFigures(**{**fig.__dict__, "workers": 4, "cores": 2.0})
    assert worker_floor(on_two_cores, 1.0) == pytest.approx(50 * MS)  # (10 + 90) / 2: the cores bind
    waiting = StepFigures(**{**on_two_cores.__dict__, "moved_cpu_share": 0.1})
    assert worker_floor(waiting, 1.0) == pytest.approx(22.5 * MS)


def test_handing_each_batch_over_is_part_of_every_floor():
    # A batch of 2 ms to make, 1 ms of the step's own, 2 cores: free hand-overs would make
    # 2 workers worth 1.5 ms a step; a main process that spends 0.7 ms receiving each batch
    # and a worker 1.5 ms sending it leave (1 + 0.7 + 2 + 1.5) / 2 = 2.6 ms, close to the 3.
    free = StepFigures(step_ns=3 * MS, moved_ns=2 * MS, workers=2, cores=2.0)
    assert step_after(free, 1.0) == (pytest.approx(1.5 * MS), "cpu")
    handed = StepFigures(**{**free.__dict__, "handoff_ns": 0.7 * MS, "handoff_worker_ns": 1.5 * MS})
    assert step_after(handed, 1.0) == (pytest.approx(2.6 * MS), "cpu")
    assert worker_floor(handed, 1.0) == pytest.approx(2.6 * MS)
    # The main process receives every batch itself: with enough cores that is its floor.
    many_cores = StepFigures(**{**handed.__dict__, "cores": 16.0, "workers": 8})
    assert step_after(many_cores, 1.0) == (pytest.approx(1.7 * MS), "host")  # 1 + 0.7
    # A worker's batch takes its sending too: one worker makes a batch every 3.5 ms.
    one = StepFigures(**{**handed.__dict__, "cores": 16.0, "workers": 1})
    assert step_after(one, 1.0) == (pytest.approx(3.5 * MS), "workers")
