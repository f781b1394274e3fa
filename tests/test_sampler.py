"""The host sampler: it starts and stops with the script whatever way the script ends, its
reads are in time order and bounded, children's CPU counts, its samples sit on the
trace's clock, and the Device and Model tables read them. Timing checks compare two runs
on this (shared) machine rather than trust an absolute figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advisor.collect import collect_script, run_script
from advisor.collect import sampler as sampler_module
from advisor.collect.sampler import SAMPLE_KIND, HostSampler, HostSamples
from advisor.importers import load
from advisor.reports.perfetto import timeline_events
from advisor.session import Session, conform_events, insert_unrelated
from advisor.session import intervals as iv
from advisor.tables import compute_tables
from advisor.tables.device import HostSampleSeries
from builders import MS, Trace

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SAMPLER_THREAD = "advisor-host-sampler"


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SAMPLER_THREAD]


def spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < deadline:
        for i in range(1000):
            x += i


def mean_cores(samples: HostSamples, lo: int, hi: int) -> float:
    """The samples' process CPU use over [lo, hi) in time_ns, through the tables' code."""
    frame = samples.events(0)
    series = HostSampleSeries(frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy(),
                              frame["value"].to_numpy(), frame["system_value"].to_numpy(),
                              frame["bytes"].to_numpy(dtype="float64"))
    return series.mean(series.cores, iv.Intervals(np.array([lo]), np.array([hi])))


# -- the sampler on its own ---------------------------------------------------------------------


def test_starts_stops_and_reads_in_time_order():
    before = len(sampler_threads())
    sampler = HostSampler(interval_s=0.01).start()
    assert len(sampler_threads()) == before + 1
    time.sleep(0.15)
    samples = sampler.stop()
    assert len(sampler_threads()) == before
    assert sampler.stop() is samples  # stopping twice is harmless
    assert len(samples) >= 5
    assert (np.diff(samples.time_ns) > 0).all()
    assert (np.diff(samples.process_cpu_ns) >= 0).all()
    assert (np.diff(samples.system_total_s) >= 0).all()
    assert (samples.rss_bytes > 0).all()
    assert samples.logical_cores >= 1 and samples.pid == os.getpid()
    frame = samples.events(int(samples.time_ns[0]))
    assert len(frame) == len(samples)
    assert frame["start_ns"].iat[0] == 0
    assert (frame["end_ns"].to_numpy()[:-1] == frame["start_ns"].to_numpy()[1:]).all()  # back to back
    system = frame["system_value"].dropna()
    assert len(system) >= len(frame) // 2  # NaN only where an interval fell within one clock tick
    assert ((system >= 0) & (system <= 1)).all()
    assert (frame["value"] >= 0).all()


def test_busy_reads_what_the_os_counted_and_more_than_idle():
    """A spinning main thread uses what the machine gives it (about a core on a quiet one,
    less where others hold the cores); sleeping, about none. The sampler's figure is set
    against the process's own CPU clock over the same time, never against a number a
    busy machine would miss."""
    with HostSampler(interval_s=0.02) as sampler:
        t0, c0 = time.time_ns(), time.process_time_ns()
        spin(0.3)
        t1, c1 = time.time_ns(), time.process_time_ns()
        time.sleep(0.3)
        t2 = time.time_ns()
    samples = sampler.stop()
    busy, idle = mean_cores(samples, t0, t1), mean_cores(samples, t1, t2)
    counted = (c1 - c0) / (t1 - t0)
    assert abs(busy - counted) < 0.2, (busy, counted)
    assert busy > idle and idle < 0.3, (busy, idle)


def test_the_sampler_leaves_its_own_cpu_out():
    with HostSampler(interval_s=0.005) as sampler:
        time.sleep(0.3)
    samples = sampler.stop()
    assert samples.sampler_cpu_ns > 0
    # Sleeping, the process used almost nothing, although the sampler read 60 times.
    assert samples.process_cpu_ns[-1] < 0.25 * (samples.time_ns[-1] - samples.time_ns[0])


@pytest.mark.parametrize("counters", ["proc", "psutil"])
def test_children_count_and_a_late_found_child_is_no_spike(monkeypatch, counters):
    """A child process spinning while the parent waits: its CPU time is the process's. The
    child is found by a scan some time after it started; its earlier time is spread over
    the reads since, so no sample shows the impossible many cores a lump would. Both ways
    of reading the counters: /proc (Linux) and psutil (everywhere)."""
    if counters == "proc" and not sys.platform.startswith("linux"):
        pytest.skip("/proc counters are Linux's")
    if counters == "psutil":
        monkeypatch.setattr(sampler_module, "_counters", sampler_module._PsutilCounters)
    import resource

    code = "import time\nd = time.perf_counter() + 0.6\nwhile time.perf_counter() < d: pass\n"
    with HostSampler(interval_s=0.03, child_scan_s=0.25) as sampler:
        t0, before = time.time_ns(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], check=True)
        t1, after = time.time_ns(), resource.getrusage(resource.RUSAGE_CHILDREN)
    samples = sampler.stop()
    assert samples.counters == counters
    assert samples.children_seen >= 1  # found by a scan while it ran
    # What the OS counted for the child over the same time (less than a core where others
    # hold the cores): the sampler's figure agrees with it.
    child = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e9 / (t1 - t0)
    assert abs(mean_cores(samples, t0, t1) - child) < 0.25, (mean_cores(samples, t0, t1), child)
    assert mean_cores(samples, t0, t1) > 0.1
    assert samples.rss_bytes.min() > 0 and np.isfinite(samples.events(0)["system_value"]).any()
    per_sample = samples.events(0)["value"].to_numpy()
    # One spinning child: about one core a read, give or take the counters' 10 ms clock
    # ticks, which over a 30 ms read (and the child's last ticks, counted as it exits) can
    # read as up to two. The child's earlier time lumped into one read would be about
    # eight (0.25 s of it in a 30 ms read).
    assert per_sample.max() < 2.5, per_sample


def test_capped_reads_are_halved_and_keep_the_span():
    sampler = HostSampler(interval_s=0.004, max_samples=12)
    sampler.start()
    began = time.time_ns()
    time.sleep(0.4)
    samples = sampler.stop()
    assert len(samples.time_ns) <= 12
    assert samples.downsampled >= 1
    assert samples.interval_s == pytest.approx(0.004 * 2 ** samples.downsampled)
    assert samples.time_ns[0] <= began and samples.time_ns[-1] - began >= 0.39e9  # the whole run, coarser
    assert (np.diff(samples.time_ns) > 0).all()


def test_halving_folds_rss_into_the_next_kept_read():
    sampler = HostSampler(interval_s=0.01, max_samples=4)
    sampler._t = [0, 10, 20, 30, 40]
    sampler._cpu = [0, 5, 10, 15, 20]
    sampler._busy = sampler._total = [0.0, 1.0, 2.0, 3.0, 4.0]
    sampler._rss = [1, 9, 2, 3, 7]
    sampler._halve()
    assert sampler._t == [0, 20, 40]
    assert sampler._cpu == [0, 10, 20]  # cumulative counters: the averages stay exact
    assert sampler._rss == [1, 9, 7]  # the peak of each merged interval survives
    assert sampler.interval_s == pytest.approx(0.02)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        HostSampler(interval_s=0)
    with pytest.raises(ValueError):
        HostSampler(max_samples=1)


# -- under run_script ---------------------------------------------------------------------------


@pytest.mark.parametrize("ending, code", [
    ("raise ValueError('bad batch')", 1),
    ("raise SystemExit(3)", 3),
    ("raise KeyboardInterrupt", 130),
])
def test_a_script_that_ends_badly_still_has_its_samples(tmp_path, capsys, ending, code):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(f"""
        import time
        time.sleep(0.4)  # the sampler's thread needs a core now and then, not the GIL
        {ending}
    """))
    # Without Python stacks: torch.profiler takes seconds over pytest's deep ones.
    run = run_script(script, [], save_trace_to=tmp_path / "trace.json", gpu=False, with_stack=False,
                     sample_interval_s=0.02)
    assert run.exit_code == code
    assert run.host_samples is not None and len(run.host_samples) >= 3
    assert not sampler_threads()


def test_sampling_can_be_turned_off(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("x = 1\n")
    run = run_script(script, [], gpu=False, sample_interval_s=None)
    assert run.host_samples is None
    assert not sampler_threads()


def test_samples_sit_on_the_traces_clock(tmp_path):
    """A record_function range starts right after a time.time_ns() read taken just before
    it; in the Session both are on one clock, within the cost of entering the range."""
    pytest.importorskip("torch")
    marks = tmp_path / "marks.json"
    script = tmp_path / "clock.py"
    script.write_text(textwrap.dedent(f"""
        import json, time, torch
        from torch.profiler import record_function
        reads = []
        for i in range(3):
            reads.append(time.time_ns())
            with record_function(f"clock_mark_{{i}}"):
                time.sleep(0.03)
        open({str(marks)!r}, "w").write(json.dumps(reads))
    """))
    collected = collect_script(script, [], gpu=False, steps=None)  # no steps: the whole run
    session = collected.session
    ev = session.events
    reads = json.loads(marks.read_text())
    for i, read in enumerate(reads):
        row = ev[ev["name"].astype(str) == f"clock_mark_{i}"]
        assert len(row) == 1
        offset = int(row["start_ns"].iat[0]) + session.meta.base_time_ns - read
        assert 0 <= offset < 5 * MS, offset
    samples = ev[ev["kind"] == SAMPLE_KIND]
    assert len(samples)
    # The samples span the run, so they cover every mark.
    first_mark = int(ev.loc[ev["name"].astype(str) == "clock_mark_0", "start_ns"].iat[0])
    assert samples["start_ns"].min() <= first_mark <= samples["end_ns"].max()
    assert session.meta.trace_metadata["host_sampler"]["samples"] == len(samples)


def test_without_torch_the_samples_are_the_session(tmp_path, monkeypatch):
    from advisor.collect import torch_hooks

    monkeypatch.setattr(torch_hooks, "import_torch", lambda: (None, "not installed"))
    script = tmp_path / "plain.py"
    script.write_text("import time\ndeadline = time.perf_counter() + 0.2\nwhile time.perf_counter() < deadline:\n    pass\n")
    session = collect_script(script, [], gpu=False, sample_interval_s=0.02).session
    assert set(session.events["kind"].astype(str)) == {SAMPLE_KIND}
    lo, hi = session.window()
    assert lo == 0 and hi >= 150 * MS  # the samples' own span, from the first read
    cpu = compute_tables(session, ["device"])["device"].loc["cpu"]
    assert cpu["busy_ns"] == 0  # nothing traced
    assert cpu["process_cpu_cores"] > 0.3  # but the script spun


def test_samples_on_another_clock_are_left_out():
    from advisor.collect.assemble import _with_samples

    t = Trace()
    t.step(0, 0, 100)
    events = t.session(gpu_measured=False).events
    with HostSampler(interval_s=0.01) as sampler:
        time.sleep(0.05)
    samples = sampler.stop()
    notes: list[str] = []
    # Realtime samples against a trace whose zero is unknown: decades apart.
    assert _with_samples(events, samples, 0, notes) is events
    assert len(notes) == 1 and "do not line up" in notes[0]
    notes.clear()
    placed = _with_samples(events, samples, int(samples.time_ns[0]) - 10 * MS, notes)
    assert not notes and (placed["kind"] == SAMPLE_KIND).sum() == len(samples)


def test_the_cupti_path_gets_the_samples_too(tmp_path, monkeypatch):
    """With a stand-in for the CUPTI collector (no GPU here): its capture is on realtime ns
    from its own start, as the real one's is, and the samples join its events."""
    pytest.importorskip("torch")
    from advisor.collect import cupti
    from advisor.collect.cupti import CuptiCapture
    from advisor.session import CollectorInfo, DeviceInfo
    from tests.test_gpu_wiring import SCRIPT, StandIn

    class Realtime(StandIn):
        def __init__(self):
            super().__init__()
            self.base = time.time_ns()

        def stop(self, *, partial_steps=()):
            end = time.time_ns() - self.base
            events = conform_events(pd.DataFrame({
                "name": ["ProfilerStep#0", "gemm"], "kind": ["step", "kernel"], "start_ns": [0, end // 2],
                "end_ns": [end, end // 2 + 1000], "step": [0, 0], "device": [-1, 0],
            }))
            return CuptiCapture(events=events, devices=[DeviceInfo(id=0, kind="gpu", name="Stand-in GPU")],
                                collector=CollectorInfo(name="cupti", gpu_measured=True), base_time_ns=self.base)

    monkeypatch.setattr(cupti, "start_collector", lambda torch, window=None, **kw: (Realtime(), None))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    session = collect_script(script, []).session
    assert session.meta.collector.name == "cupti"
    ev = session.events
    samples = ev[ev["kind"] == SAMPLE_KIND]
    assert len(samples) >= 1
    lo, hi = session.window()
    assert samples["end_ns"].max() > lo and samples["start_ns"].min() < hi
    assert (ev["launch"] < len(ev)).all()
    cpu = compute_tables(session, ["device"])["device"].loc["cpu"]
    assert cpu["process_cpu_cores"] >= 0 and cpu["peak_rss_bytes"] > 0


def test_starved_loader_uses_less_cpu_than_clean_training(tmp_path):
    """The starved loader sleeps in __getitem__; clean training computes throughout. The
    traced busy share says little of this; the sampled CPU use does."""
    pytest.importorskip("torch")
    starved = collect_script(REPO / "examples" / "starved_loader.py", ["--steps", "4"], gpu=False).session
    clean = collect_script(REPO / "examples" / "clean_train.py", ["--steps", "20"], gpu=False).session
    tables_starved = compute_tables(starved, ["device", "model"])
    tables_clean = compute_tables(clean, ["device", "model"])
    loader_cores = tables_starved["model"].loc["Dataloader", "process_cpu_cores"]
    clean_cores = tables_clean["device"].loc["cpu", "process_cpu_cores"]
    starved_cores = tables_starved["device"].loc["cpu", "process_cpu_cores"]
    # Ratios, not margins: on a machine others keep busy, clean training gets less than a
    # core, and the sleeping loader still uses a small part of what it gets.
    assert clean_cores > 3 * max(loader_cores, 0.02), (clean_cores, loader_cores)
    assert clean_cores > 3 * max(starved_cores, 0.02), (clean_cores, starved_cores)
    for tables in (tables_starved, tables_clean):
        cpu = tables["device"].loc["cpu"]
        assert cpu["peak_rss_bytes"] > 0
        assert 0 <= cpu["system_cpu_utilization"] <= 1
        assert cpu["process_cpu_utilization"] == pytest.approx(cpu["process_cpu_cores"] / cpu["logical_cores"])


# -- in the Session and the tables ---------------------------------------------------------------


def sample_rows(rows: list[tuple[float, float, float, float, int]], pid: int = 1) -> pd.DataFrame:
    """(start ms, end ms, cores, system 0..1, rss bytes) -> sample events."""
    return pd.DataFrame({
        "name": "cpu", "kind": SAMPLE_KIND, "category": "advisor_sampler",
        "start_ns": [round(r[0] * MS) for r in rows], "end_ns": [round(r[1] * MS) for r in rows],
        "pid": pid, "value": [r[2] for r in rows], "system_value": [r[3] for r in rows],
        "bytes": [r[4] for r in rows],
    })


def sampled_session(samples: pd.DataFrame) -> Session:
    """Two 100 ms steps (Dataloader 0-50 ms of each, Forward 50-100) with an op in each."""
    t = Trace()
    for number, base in ((0, 0), (1, 100)):
        t.step(number, base, base + 100)
        t.phase("Dataloader", base, base + 50)
        t.phase("Forward", base + 50, base + 100)
        t.op("aten::mm", base + 60, base + 70)
    session = t.session(gpu_measured=False)
    session.meta.devices[0].properties["logical_cores"] = 4
    session.events = insert_unrelated(session.events, samples)
    return session


def test_device_and_model_tables_read_the_samples():
    session = sampled_session(sample_rows([
        (-50, 0, 3.0, 0.9, 5000),  # before the window: not counted
        (0, 50, 0.5, 0.2, 100),
        (50, 100, 1.5, 0.4, 300),
        (100, 150, 0.5, 0.2, 200),
        (150, 200, 1.5, 0.4, 250),
        (200, 250, 3.0, 0.9, 9000),  # after it
    ]))
    tables = compute_tables(session, ["device", "model"])
    cpu = tables["device"].loc["cpu"]
    assert cpu["busy_ns"] == 20 * MS  # traced: the two ops, unchanged by the samples
    assert cpu["process_cpu_cores"] == pytest.approx(1.0)
    assert cpu["process_cpu_utilization"] == pytest.approx(0.25)
    assert cpu["system_cpu_utilization"] == pytest.approx(0.3)
    assert cpu["peak_rss_bytes"] == 300
    assert cpu["logical_cores"] == 4
    model = tables["model"]
    assert model.loc["Dataloader", "process_cpu_cores"] == pytest.approx(0.5)
    assert model.loc["Forward", "process_cpu_cores"] == pytest.approx(1.5)
    assert model.loc["ProfileStep", "process_cpu_cores"] == pytest.approx(1.0)
    assert np.isnan(model.loc["Backward", "process_cpu_cores"])  # no such phase


def test_a_sample_counts_for_the_time_it_shares_with_the_window():
    # One 200 ms sample straddling both steps and beyond: the window reads its rate.
    session = sampled_session(sample_rows([(-100, 100, 2.0, 0.5, 10), (100, 300, 1.0, 0.5, 20)]))
    cpu = compute_tables(session, ["device"])["device"].loc["cpu"]
    assert cpu["process_cpu_cores"] == pytest.approx(1.5)  # 100 ms at 2 cores, 100 ms at 1


def test_phases_too_short_for_the_samples_are_left_empty():
    # Samples as long as a whole step: each phase is half of every sample it touches,
    # which is the threshold; a 10 ms range inside a 100 ms sample would be far below it.
    session = sampled_session(sample_rows([(0, 100, 1.0, 0.5, 10), (100, 200, 1.0, 0.5, 10)]))
    model = compute_tables(session, ["model"])["model"]
    assert model.loc["Dataloader", "process_cpu_cores"] == pytest.approx(1.0)
    assert np.isnan(model.loc["Others", "process_cpu_cores"])  # no time outside phases
    t = Trace()
    t.step(0, 0, 100)
    t.phase("Dataloader", 0, 90)
    t.phase("Forward", 90, 100)
    session = t.session(gpu_measured=False)
    session.events = insert_unrelated(session.events, sample_rows([(0, 100, 1.0, 0.5, 10)]))
    model = compute_tables(session, ["model"])["model"]
    assert model.loc["Dataloader", "process_cpu_cores"] == pytest.approx(1.0)
    assert np.isnan(model.loc["Forward", "process_cpu_cores"])


def test_sessions_without_samples_leave_the_columns_empty():
    t = Trace()
    t.step(0, 0, 100)
    t.op("aten::mm", 10, 20)
    tables = compute_tables(t.session(gpu_measured=False), ["device", "model"])
    cpu = tables["device"].loc["cpu"]
    for column in ("process_cpu_cores", "process_cpu_utilization", "system_cpu_utilization", "peak_rss_bytes"):
        assert np.isnan(cpu[column])
    assert tables["model"]["process_cpu_cores"].isna().all()


def test_samples_do_not_make_the_window():
    t = Trace()
    t.op("aten::mm", 10, 20)
    session = t.session(gpu_measured=False)
    session.events = insert_unrelated(session.events, sample_rows([(0, 50, 1.0, 0.5, 10)]))
    assert session.window() == (10 * MS, 20 * MS)
    only = Session(session.meta, conform_events(sample_rows([(0, 50, 1.0, 0.5, 10), (50, 80, 1.0, 0.5, 10)])))
    assert only.window() == (0, 80 * MS)


def test_inserting_samples_keeps_every_relation():
    t = Trace()
    t.step(0, 0, 100)
    outer = t.op("aten::linear", 10, 40)
    inner = t.op("aten::addmm", 12, 38, parent=outer)
    call = t.call("cudaLaunchKernel", 20, 21, parent=inner)
    t.gpu("gemm", "kernel", 30, 45, launch=call)
    before = t.session().events
    after = insert_unrelated(before, sample_rows([(0, 15, 1.0, 0.5, 1), (15, 35, 1.0, 0.5, 1), (35, 60, 1.0, 0.5, 1)]))
    assert len(after) == len(before) + 3
    assert (after["id"].to_numpy() == np.arange(len(after))).all()
    assert (np.diff(after["start_ns"].to_numpy()) >= 0).all()
    names = after["name"].astype(str).to_numpy()

    def linked(frame, name, column):
        row = frame[frame["name"].astype(str) == name].iloc[0]
        target = int(row[column])
        return None if target < 0 else str(frame["name"].iat[target])

    for name, column in (("gemm", "launch"), ("gemm", "parent_op"), ("gemm", "top_op"),
                         ("cudaLaunchKernel", "parent_op"), ("aten::addmm", "parent_op"), ("aten::addmm", "top_op")):
        assert linked(after, name, column) == linked(before, name, column), (name, column)
    assert (after.loc[names == "cpu", ["launch", "parent_op", "top_op"]] == -1).all().all()


def test_samples_survive_save_and_load_and_old_sessions_still_load(tmp_path):
    session = sampled_session(sample_rows([(0, 100, 1.25, 0.5, 123), (100, 200, 0.75, 0.25, 456)]))
    loaded = load(session.save(tmp_path / "with"))
    rows = loaded.events[loaded.events["kind"] == SAMPLE_KIND]
    assert rows["value"].tolist() == [1.25, 0.75]
    assert rows["system_value"].tolist() == [0.5, 0.25]
    assert rows["bytes"].tolist() == [123, 456]
    # A session saved before the sample columns existed: no samples, no such columns.
    folder = sampled_session(sample_rows([])).save(tmp_path / "old")
    events = pd.read_parquet(folder / "events.parquet")
    assert not (events["kind"] == SAMPLE_KIND).any()
    events.drop(columns=["value", "system_value"]).to_parquet(folder / "events.parquet", index=False)
    old = load(folder)
    assert old.events["value"].isna().all()
    assert np.isnan(compute_tables(old, ["device"])["device"].loc["cpu", "process_cpu_cores"])


def test_the_timeline_draws_samples_as_counters():
    session = sampled_session(sample_rows([(0, 100, 1.25, 0.5, 123), (100, 200, 0.75, 0.25, 456)], pid=1))
    events, _top = timeline_events(session, [])
    parsed = [json.loads(e) for e in events]
    counters = [e for e in parsed if e["ph"] == "C"]
    by_name: dict[str, list] = {}
    for e in counters:
        by_name.setdefault(e["name"], []).append(e["args"]["value"])
    assert by_name == {"process CPU (cores)": [1.25, 0.75], "system CPU (%)": [50.0, 25.0],
                       "process RSS (bytes)": [123, 456]}
    assert not [e for e in parsed if e["ph"] == "X" and e["name"] == "cpu"]
