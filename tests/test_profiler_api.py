"""advisor.Profiler, the profiler API for code that wants control.

- Every scheduler form on a CPU training loop records exactly the steps it asks for, hands
  each span to on_trace_ready once, and does not lose the last span when the loop ends
  early, breaks or raises.
- Spans are Sessions of the host collector with the Profiler's steps and the hooks' phases;
  the GPU path hands the span to the CUPTI collector (a stand-in here) with torch.profiler off.
- RecordEvent / region ranges reach the UserDefined table.
- timer_only collects nothing, times steps and reads, and its figures are the Perf table's.
- summary(), diagnose(), report(), export() and the ready-made callbacks.
- The public surface: advisor.__all__ is complete and names no private module.
"""

from __future__ import annotations

import re
import threading
import time
import types
import warnings

import pandas as pd
import pytest

import advisor
from advisor import ProfilerState as S
from advisor.profiler import timer as profiler_timer

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from advisor.collect import cupti, torch_hooks  # noqa: E402
from advisor.collect.hooks import base as hooks_base  # noqa: E402
from advisor.collect.cupti import CuptiCapture  # noqa: E402
from advisor.importers import load  # noqa: E402
from advisor.session import CollectorInfo, DeviceInfo, Session, conform_events  # noqa: E402
from advisor.step import build_step_model  # noqa: E402
from advisor.tables import compute_tables  # noqa: E402

FAST = {"record_shapes": False, "with_stack": False}  # the spans' content is not under test here


class Spans:
    """An on_trace_ready callback that writes down what each call saw."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, prof: advisor.Profiler) -> None:
        self.calls.append({
            "span": prof.span,
            "steps": prof.recorded_steps,
            "trace": prof.trace_path is not None and prof.trace_path.is_file(),
            "state": prof.current_state,
        })

    @property
    def steps(self) -> list[list[int]]:
        return [c["steps"] for c in self.calls]


def make_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return train


def range_loop(prof: advisor.Profiler, iterations: int, *, fail_at: int | None = None) -> None:
    """A loop without a DataLoader: ``iterations`` steps, step() at the end of each."""
    train = make_training()
    with prof:
        for i in range(iterations):
            if i == fail_at:
                raise KeyError("failed in the loop")
            train(torch.randn(4, 8), torch.randint(0, 2, (4,)))
            prof.step(num_samples=4)


def loader_loop(prof: advisor.Profiler, batches: int, *, break_after: int | None = None) -> None:
    """A DataLoader loop of ``batches`` batches of 4."""
    train = make_training()
    data = TensorDataset(torch.randn(batches * 4, 8), torch.randint(0, 2, (batches * 4,)))
    with prof:
        for i, (x, y) in enumerate(DataLoader(data, batch_size=4)):
            train(x, y)
            prof.step(num_samples=len(x))
            if i == break_after:
                break


TORCH_NAMES = {"NONE": S.CLOSED, "WARMUP": S.READY, "RECORD": S.RECORD, "RECORD_AND_SAVE": S.RECORD_AND_RETURN}


def spans_of(schedule, steps: int) -> list[list[int]]:
    """The spans a scheduler asks for over steps 0..steps-1, worked out from its states:
    runs of RECORD / RECORD_AND_RETURN steps, each ending after a RECORD_AND_RETURN."""
    spans, current = [], []
    for step in range(steps):
        state = schedule(step)
        state = TORCH_NAMES.get(getattr(state, "name", ""), state) if not isinstance(state, S) else state
        if state in (S.RECORD, S.RECORD_AND_RETURN):
            current.append(step)
        elif current:
            spans.append(current)
            current = []
        if state is S.RECORD_AND_RETURN:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


# -- schedulers, without torch's help ------------------------------------------------------


def test_make_scheduler_follows_paddles_examples():
    # paddle's make_scheduler docs: batch 0 closed, 1 ready, 2-5 recorded, returned at 5.
    states = [advisor.make_scheduler(closed=1, ready=1, record=4, repeat=1)(i) for i in range(8)]
    assert states == [S.CLOSED, S.READY, S.RECORD, S.RECORD, S.RECORD, S.RECORD_AND_RETURN, S.CLOSED, S.CLOSED]
    # skip_first=1: 3-6, 9-12, 15-18, ... until the loop ends.
    schedule = advisor.make_scheduler(closed=1, ready=1, record=4, skip_first=1)
    assert spans_of(schedule, 20) == [[3, 4, 5, 6], [9, 10, 11, 12], [15, 16, 17, 18]]


@pytest.mark.parametrize("wait,warmup,active,repeat,skip_first", [
    (1, 1, 2, 2, 0), (0, 0, 3, 0, 2), (2, 1, 1, 3, 1), (0, 2, 1, 1, 0), (3, 0, 2, 0, 5),
])
def test_make_scheduler_is_torch_schedule_renamed(wait, warmup, active, repeat, skip_first):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about warm-ups of 0
        theirs = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    ours = advisor.make_scheduler(closed=wait, ready=warmup, record=active, repeat=repeat, skip_first=skip_first)
    assert [ours(i) for i in range(40)] == [TORCH_NAMES[theirs(i).name] for i in range(40)]


@pytest.mark.parametrize("kwargs", [
    {"closed": 1, "ready": 1, "record": 0}, {"closed": -1, "ready": 0, "record": 2},
    {"closed": 0, "ready": 0, "record": 2, "repeat": -1}, {"closed": True, "ready": 0, "record": 2},
    {"closed": 0, "ready": 0, "record": 1.5},
])
def test_make_scheduler_refuses_bad_counts(kwargs):
    with pytest.raises(ValueError):
        advisor.make_scheduler(**kwargs)


@pytest.mark.parametrize("bad", [(5, 5), (4, 2), (-1, 3), (1, 2, 3), "2:5", 3])
def test_bad_schedulers_are_refused_at_construction(bad):
    with pytest.raises((ValueError, TypeError)):
        advisor.Profiler(scheduler=bad)


def test_a_scheduler_returning_something_else_is_refused():
    prof = advisor.Profiler(scheduler=lambda step: "record")
    with pytest.raises(TypeError, match="must return an advisor.ProfilerState"):
        prof.start()
    assert profiler_timer._ACTIVE is None  # the failed start left nothing behind


# -- every scheduler form on a training loop -------------------------------------------------


SCHEDULES = {
    "none": (None, 6, [[0, 1, 2, 3, 4, 5]]),
    "range": ((2, 5), 8, [[2, 3, 4]]),
    "range_from_0": ((0, 3), 6, [[0, 1, 2]]),
    "make_scheduler_repeat": (advisor.make_scheduler(closed=1, ready=1, record=2, repeat=2), 12, [[2, 3], [6, 7]]),
    "make_scheduler_until_end": (advisor.make_scheduler(closed=1, ready=0, record=3), 10, [[1, 2, 3], [5, 6, 7], [9]]),
    "skip_first": (advisor.make_scheduler(closed=0, ready=1, record=2, repeat=1, skip_first=3), 9, [[4, 5]]),
    "callable": (lambda s: S.RECORD if s in (1, 2, 5) else S.CLOSED, 8, [[1, 2], [5]]),
    "callable_back_to_back": (lambda s: S.RECORD_AND_RETURN if s in (2, 3) else S.CLOSED, 6, [[2], [3]]),
    "torch_schedule": (torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1), 8, [[2, 3]]),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_scheduler_records_the_steps_it_asks_for(name):
    schedule, iterations, expected = SCHEDULES[name]
    spans = Spans()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.profiler.schedule warns about warm-ups of 0
        range_loop(advisor.Profiler(scheduler=schedule, on_trace_ready=spans, **FAST), iterations)
    assert spans.steps == expected
    assert [c["span"] for c in spans.calls] == list(range(len(expected)))  # each span once, in order
    assert all(c["trace"] for c in spans.calls)
    if callable(schedule):
        assert spans_of(schedule, iterations) == expected


@pytest.mark.parametrize("name", ["none", "range", "make_scheduler_repeat"])
def test_the_same_on_a_dataloader_loop(name):
    schedule, iterations, expected = SCHEDULES[name]
    spans = Spans()
    loader_loop(advisor.Profiler(scheduler=schedule, on_trace_ready=spans, **FAST), iterations)
    assert spans.steps == expected


def test_the_last_span_is_handed_over_when_the_loop_ends_early():
    spans = Spans()
    # Steps 2..7 asked for, the loop has 5 iterations: 2, 3, 4 exist.
    range_loop(advisor.Profiler(scheduler=(2, 8), on_trace_ready=spans, **FAST), 5)
    assert spans.steps == [[2, 3, 4]]
    assert spans.calls[0]["state"] is S.RECORD  # handed over from stop(), mid-schedule

    spans = Spans()
    loader_loop(advisor.Profiler(scheduler=(2, 8), on_trace_ready=spans, **FAST), 5)
    assert spans.steps == [[2, 3, 4]]


def test_a_loop_left_by_break_keeps_its_steps():
    spans = Spans()
    loader_loop(advisor.Profiler(scheduler=(1, 10), on_trace_ready=spans, **FAST), 12, break_after=4)
    assert spans.steps == [[1, 2, 3, 4]]


def test_a_loop_that_raises_still_hands_over_its_span():
    spans = Spans()
    with pytest.raises(KeyError, match="failed in the loop"):
        range_loop(advisor.Profiler(scheduler=(1, 10), on_trace_ready=spans, **FAST), 8, fail_at=4)
    # Step 4 began and failed: it is partial and left out.
    assert spans.steps == [[1, 2, 3]]
    assert hooks_base.ACTIVE is None and profiler_timer._ACTIVE is None


def test_ready_steps_that_no_record_follows_are_discarded():
    spans = Spans()
    schedule = lambda s: S.READY if s in (1, 2) else S.CLOSED  # noqa: E731
    prof = advisor.Profiler(scheduler=schedule, on_trace_ready=spans, **FAST)
    prof.start()
    prof.step()
    assert hooks_base.ACTIVE is not None  # step 1: warming up
    assert not torch.autograd.profiler._is_profiler_enabled  # ... but not recording
    prof.step()
    prof.step()  # step 3: closed again
    assert hooks_base.ACTIVE is None
    prof.stop()
    assert spans.calls == [] and prof.session is None


def test_ready_then_record_records_only_the_recorded_steps():
    spans = Spans()
    prof = advisor.Profiler(scheduler=(3, 5), on_trace_ready=spans, **FAST)
    prof.start()
    for step in range(6):
        enabled = torch.autograd.profiler._is_profiler_enabled
        assert enabled == (step in (3, 4)), step
        prof.step()
    prof.stop()
    assert spans.steps == [[3, 4]]


def test_everything_is_put_back_after_stop():
    from torch.utils.data import dataloader

    before = vars(dataloader._BaseDataLoaderIter)["__next__"]
    loader_loop(advisor.Profiler(scheduler=(1, 3), **FAST), 4)
    assert vars(dataloader._BaseDataLoaderIter)["__next__"] is before
    assert hooks_base.ACTIVE is None and profiler_timer._ACTIVE is None
    assert not torch.autograd.profiler._is_profiler_enabled


def test_one_profiler_at_a_time():
    first = advisor.Profiler(timer_only=True)
    first.start()
    try:
        with pytest.raises(RuntimeError, match="another advisor.Profiler"):
            advisor.Profiler(timer_only=True).start()
        with pytest.raises(RuntimeError, match="already started"):
            first.start()
    finally:
        first.stop()
    with pytest.raises(RuntimeError, match="not started"):
        first.step()
    first.stop()  # a second stop does nothing


# -- what a span holds -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    """A DataLoader loop with user ranges, steps 2-5 recorded, shapes and stacks on."""
    captured = {}

    def keep(prof):
        captured["trace_text"] = prof.trace_path.read_text()

    @advisor.region("augment")
    def augment(x):
        return x * 1.01

    train = make_training()
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    prof = advisor.Profiler(scheduler=(2, 6), on_trace_ready=keep)
    with prof:
        for x, y in DataLoader(data, batch_size=4):
            x = augment(x)
            with advisor.RecordEvent("train"):
                train(x, y)
            event = advisor.RecordEvent("after")
            event.begin()
            event.end()
            prof.step(num_samples=4)
    return prof, captured


def test_a_span_is_a_session_of_the_host_collector(recorded):
    prof, captured = recorded
    session = prof.session
    assert isinstance(session, Session)
    assert session.meta.source_format == "profiler"
    assert session.meta.collector.name == "host" and session.meta.collector.gpu_measured is False
    assert session.meta.trace_metadata["step_source"] == "manual"
    assert session.meta.trace_metadata["batch_size"] == 4
    assert list(session.steps()["step"]) == [2, 3, 4, 5]
    assert re.findall(r'"ProfilerStep#(\d+)"', captured["trace_text"]) == ["2", "3", "4", "5"]


def test_phases_and_user_ranges_reach_the_tables(recorded):
    prof, _ = recorded
    tables = compute_tables(prof.session, ["model", "userdefined", "perf"])
    model = tables["model"]
    for phase in ("Dataloader", "Forward", "Backward", "Optimization"):
        assert model.loc[phase, "cpu_total_ns"] > 0, phase
    user = tables["userdefined"]
    # One call a step in the steps the tables read: all four, less a first step the step
    # model sets apart as start-up (a busy machine can make it slow).
    steady = build_step_model(prof.session).session.steps()
    assert len(steady) in (3, 4)
    for name in ("augment", "train", "after"):
        assert user.loc[name, "calls"] == len(steady), name
    assert tables["perf"].loc["ips", "unit"] == "samples/s"


def test_record_event_outside_any_profiler_and_misuse():
    with advisor.RecordEvent("nothing listens"):
        pass
    event = advisor.RecordEvent("twice")
    event.begin()
    with pytest.raises(RuntimeError, match="already open"):
        event.begin()
    event.end()
    event.end()  # closing a closed range does nothing
    with pytest.raises(ValueError):
        advisor.RecordEvent("")

    @advisor.region("decorated")
    def decorated(a, b=2):
        """Adds."""
        return a + b

    assert decorated(1) == 3 and decorated.__name__ == "decorated" and decorated.__doc__ == "Adds."


def test_record_event_is_recorded_by_a_plain_torch_profiler():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with advisor.region("in torch's profile"):
            torch.ones(2).sum()
    assert "in torch's profile" in {e.name for e in prof.events()}


# -- timer_only ------------------------------------------------------------------------------


class SlowReads(Dataset):
    def __init__(self, n: int, delay_s: float):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        time.sleep(self.delay_s)
        return torch.full((4,), float(index))


def test_timer_only_collects_nothing(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("timer_only must not start a collector")

    monkeypatch.setattr(torch_hooks.HostCollector, "start", refuse)
    monkeypatch.setattr(torch.profiler, "profile", refuse)
    prof = advisor.Profiler(timer_only=True)
    with prof:
        for batch in DataLoader(SlowReads(12, 0.0), batch_size=4):
            assert not torch.autograd.profiler._is_profiler_enabled
            prof.step(num_samples=len(batch))
    out = capsys.readouterr().out
    assert "Perf Summary (timer_only)" in out and "reader_cost" in out
    # Three batches, three steps: the step the last step() began read nothing and is not timed.
    assert prof.recorded_steps == [0, 1, 2]
    assert prof.session.meta.collector.name == "timer"


def test_step_info_reads_like_paddles_and_covers_the_steps_since_the_last_call(capsys):
    prof = advisor.Profiler(timer_only=True)
    with prof:
        for index, batch in enumerate(DataLoader(SlowReads(20, 0.0005), batch_size=4)):
            time.sleep(0.002 if index < 3 else 0.03)
            prof.step(num_samples=len(batch))
            if index == 2:
                first = prof.step_info(unit="images")
    second = prof.step_info(unit="images")
    pattern = r"reader_cost: (\d+\.\d{5}) s batch_cost: (\d+\.\d{5}) s ips: (\d+\.\d{3}) images/s"
    one, two = re.fullmatch(pattern, first), re.fullmatch(pattern, second)
    assert one and two, (first, second)
    assert float(one[1]) >= 0.002 and float(two[1]) >= 0.002  # four reads of >= 0.5 ms each
    assert float(one[2]) < 0.025 <= float(two[2])  # the second call saw only the slow steps
    assert float(two[3]) == pytest.approx(4 / float(two[2]), rel=0.01)
    assert prof.step_info() == "no step has ended yet"  # nothing since the last call


def test_without_num_samples_ips_is_in_steps_and_without_a_loader_no_reader_cost(capsys):
    prof = advisor.Profiler(timer_only=True)
    with prof:
        for _ in range(4):
            time.sleep(0.001)
            prof.step()
    line = prof.step_info()
    assert line.startswith("batch_cost: ") and line.endswith(" steps/s")
    perf = compute_tables(prof.session, ["perf"])["perf"]
    assert pd.isna(perf.loc["reader_cost", "avg"])  # not measured, not zero
    assert prof.recorded_steps == [0, 1, 2, 3]  # step 4, begun by the last step(), is not timed
    assert "Reader ratio: -" in capsys.readouterr().out


def test_the_timer_agrees_with_the_perf_table(capsys):
    prof = advisor.Profiler(timer_only=True)
    with prof:
        for batch in DataLoader(SlowReads(24, 0.0003), batch_size=4):
            time.sleep(0.001)
            prof.step(num_samples=len(batch))
    timer = prof._timer
    assert timer.stats().steps == 6
    # The table averages the steady steps; a first step that a loaded machine made an
    # outlier is set apart (start-up), so the timer's figures are taken over the same steps.
    steady = build_step_model(prof.session).facts.steps["step"].to_numpy()
    assert len(steady) >= 4
    at = [list(timer.numbers).index(n) for n in steady]
    batch = [timer.ends[i] - timer.starts[i] for i in at]
    perf = compute_tables(prof.session, ["perf"])["perf"]
    assert perf.loc["batch_cost", "avg"] == pytest.approx(sum(batch) / len(at))
    assert perf.loc["reader_cost", "avg"] == pytest.approx(sum(timer.reader[i] for i in at) / len(at))
    assert perf.loc["ips", "avg"] == pytest.approx(4 * len(at) * 1e9 / sum(batch))  # samples over time
    assert perf.loc["reader_cost", "avg"] >= 4 * 0.0003 * 1e9


def test_reads_on_another_thread_are_not_the_loops(capsys):
    def read_elsewhere():
        for _ in DataLoader(SlowReads(8, 0.0), batch_size=4):
            pass

    prof = advisor.Profiler(timer_only=True)
    with prof:
        thread = threading.Thread(target=read_elsewhere)
        thread.start()
        thread.join()
        prof.step()
    assert not prof._timer.loader_seen


def test_timer_only_finds_a_starving_loader(capsys):
    prof = advisor.Profiler(timer_only=True)
    with prof:
        for batch in DataLoader(SlowReads(24, 0.002), batch_size=4):
            prof.step(num_samples=len(batch))
    assert "dataloader-starvation" in [f.rule for f in prof.diagnose()]


# -- results ---------------------------------------------------------------------------------


def test_summary_prints_the_tables_sorted_and_in_the_unit_asked(recorded, capsys):
    prof, _ = recorded
    prof.summary(sorted_by="calls", time_unit="us", op_detail=False, thread_sep=True, limit=0)
    out = capsys.readouterr().out
    for title in ("Overview Summary", "Model Summary", "Operator Summary", "UserDefined Summary", "Perf Summary"):
        assert title in out, title
    assert "Operator Kernel Detail" not in out
    assert "thread_sep: not supported" in out
    assert "cpu_total_(us)" in out and "Time unit: us" in out
    prof.summary(sorted_by=advisor.SortedKeys.CPUTotal, tables=["model"], time_unit="s")
    out = capsys.readouterr().out
    assert "cpu_total_(s)" in out and "Operator Summary" not in out


def test_summary_time_units_scale_the_numbers(recorded, capsys):
    from advisor.profiler.profiler import _in_unit

    prof, _ = recorded
    model = compute_tables(prof.session, ["model"])["model"]
    shown = _in_unit(model, "ms")
    assert shown["cpu_total_(ms)"].tolist() == pytest.approx((model["cpu_total_ns"] / 1e6).tolist())
    assert shown.attrs == model.attrs


def test_summary_refuses_what_it_cannot_do(recorded):
    prof, _ = recorded
    with pytest.raises(ValueError, match="time_unit"):
        prof.summary(time_unit="minutes")
    with pytest.raises(ValueError, match="no table it sorts has that column"):
        prof.summary(sorted_by="no_such_column")
    with pytest.raises(ValueError, match="unknown table"):
        prof.summary(tables=["nope"])
    with pytest.raises(RuntimeError, match="no span has been recorded"):
        advisor.Profiler().summary()


def test_diagnose_and_report(recorded, tmp_path):
    prof, _ = recorded
    findings = prof.diagnose()
    assert isinstance(findings, list)
    prof.report("json", tmp_path / "report.json")
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    assert prof.session.steps()["step"].tolist() == [2, 3, 4, 5]  # what the schedule recorded
    # The report's steps are the steady ones: a first recorded step that a loaded machine
    # made an outlier is set apart as start-up, and the window names it.
    numbers = report["session"]["steps"]["numbers"]
    assert numbers in ([2, 3, 4, 5], [3, 4, 5]), numbers
    if numbers == [3, 4, 5]:
        assert any(s["what"].startswith("step #2:") for s in report["session"]["window"]["set_apart"])
    assert [f["rule"] for f in report["findings"]] == [f.rule for f in findings]


def test_the_callbacks_write_what_advisor_reads_again(tmp_path):
    from advisor.cli import main

    callbacks = [advisor.export_timeline(tmp_path / "timelines", worker_name="w"),
                 advisor.save_session(tmp_path / "sessions", worker_name="w")]
    schedule = advisor.make_scheduler(closed=1, ready=1, record=2, repeat=2)
    range_loop(advisor.Profiler(scheduler=schedule, on_trace_ready=lambda p: [c(p) for c in callbacks], **FAST), 9)
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == ["w_span0.pt.trace.json", "w_span1.pt.trace.json"]
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["w_0", "w_1"]
    assert list(load(tmp_path / "timelines" / "w_span1.pt.trace.json").steps()["step"]) == [6, 7]
    assert list(Session.load(tmp_path / "sessions" / "w_0").steps()["step"]) == [2, 3]
    assert main(["diagnose", str(tmp_path / "sessions" / "w_1"), "--format", "json", "-o", str(tmp_path / "r.json")]) == 0


def test_export_by_hand_gzipped(recorded, tmp_path):
    prof, _ = recorded
    path = prof.export(tmp_path / "span.json.gz", findings=False)
    assert list(load(path).steps()["step"]) == [2, 3, 4, 5]


# -- where the Profiler cannot or should not record ---------------------------------------------


def test_under_another_advisor_collector_it_only_times(capsys):
    outer = torch_hooks.HostCollector(torch, profiler=False)
    outer.start()
    try:
        spans = Spans()
        prof = advisor.Profiler(scheduler=(1, 3), on_trace_ready=spans)
        with pytest.warns(RuntimeWarning, match="already profiles this process"):
            range_loop(prof, 4)
    finally:
        outer.stop()
    assert spans.calls == [] and prof.session is None
    assert prof.step_info().startswith("batch_cost: ")
    assert any("already profiles" in note for note in prof.notes)


def test_a_span_that_cannot_be_read_back_warns_and_the_loop_goes_on(monkeypatch):
    import advisor.importers

    calls = {"n": 0}
    real = advisor.importers.load_kineto

    def first_fails(path, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("unreadable")
        return real(path, **kwargs)

    monkeypatch.setattr(advisor.importers, "load_kineto", first_fails)
    spans = Spans()
    schedule = advisor.make_scheduler(closed=1, ready=0, record=2, repeat=2)
    with pytest.warns(RuntimeWarning, match=r"could not be read back \(ValueError: unreadable\): it is lost"):
        range_loop(advisor.Profiler(scheduler=schedule, on_trace_ready=spans, **FAST), 7)
    assert spans.steps == [[4, 5]]  # the first span was lost, the second came through
    assert spans.calls[0]["span"] == 0


def test_a_collector_that_cannot_start_warns_and_the_loop_goes_on(monkeypatch):
    def refuse(self):
        raise OSError("no profiler today")

    monkeypatch.setattr(torch_hooks.HostCollector, "start", refuse)
    spans = Spans()
    prof = advisor.Profiler(scheduler=(1, 3), on_trace_ready=spans, **FAST)
    with pytest.warns(RuntimeWarning, match="could not start at step") as caught:
        range_loop(prof, 4)
    # Step 0 (READY) and step 1 (RECORD) each tried; the loop ran on, timed.
    assert [str(w.message).count("could not start at step ") for w in caught] == [1, 1]
    assert spans.calls == [] and prof.step_info().startswith("batch_cost: ")


def test_asking_for_the_gpu_without_one_warns_and_profiles_the_host():
    spans = Spans()
    prof = advisor.Profiler(targets=[advisor.ProfilerTarget.GPU, "cpu"], scheduler=(1, 2), on_trace_ready=spans, **FAST)
    with pytest.warns(RuntimeWarning, match="GPU is not profiled"):
        range_loop(prof, 3)
    assert spans.steps == [[1]]
    assert "GPU not measured" in " ".join(prof.session.meta.collector.notes)
    with pytest.raises(ValueError, match="unknown profiler target"):
        advisor.Profiler(targets=["tpu"])


class StandIn:
    """A GPU collector standing in for CUPTI: records what it is told."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.tokens: dict[int, str] = {}
        self.profiler_on: list[bool] = []

    def step_started(self, number):
        self.calls.append(("step", number))

    def step_ended(self, number, *, partial=False):
        self.calls.append(("ended", number, partial))

    def range_opened(self, name):
        self.tokens[len(self.tokens) + 1] = name
        self.profiler_on.append(bool(torch.autograd.profiler._is_profiler_enabled))
        return len(self.tokens)

    def range_closed(self, token):
        self.calls.append(("closed", self.tokens[token]))

    def hand_over(self, where=""):
        self.calls.append(("hand_over", where))

    def stop(self, *, partial_steps=()):
        self.calls.append(("stop", tuple(partial_steps)))
        events = conform_events(pd.DataFrame({
            "name": ["ProfilerStep#1", "ProfilerStep#2", "gemm"], "kind": ["step", "step", "kernel"],
            "start_ns": [0, 100, 10], "end_ns": [100, 200, 60], "step": [1, 2, 1], "device": [-1, -1, 0],
        }))
        return CuptiCapture(events=events, devices=[DeviceInfo(id=0, kind="gpu", name="Stand-in GPU")],
                            collector=CollectorInfo(name="cupti", gpu_measured=True), base_time_ns=7)


def test_on_a_gpu_the_cupti_collector_records_the_span(monkeypatch):
    stand_in = StandIn()
    windows = []

    def start_collector(torch_module, window="default", **kw):
        windows.append(window)
        return stand_in, None

    monkeypatch.setattr(cupti, "unavailable_reason", lambda torch_module: None)
    monkeypatch.setattr(cupti, "start_collector", start_collector)
    spans = Spans()
    prof = advisor.Profiler(scheduler=(1, 3), on_trace_ready=spans)
    train = make_training()
    with prof:
        for _ in range(4):
            with advisor.RecordEvent("mine"):
                train(torch.randn(4, 8), torch.randint(0, 2, (4,)))
            prof.step()
    assert windows == [None]  # the span is the window
    assert [c for c in stand_in.calls if c[0] == "step"] == [("step", 1), ("step", 2)]
    assert ("closed", "mine") in stand_in.calls and ("closed", "advisor::Forward") in stand_in.calls
    assert stand_in.profiler_on and not any(stand_in.profiler_on)  # torch.profiler stayed off
    assert spans.steps == [[1, 2]] and spans.calls[0]["trace"] is False
    assert prof.session.meta.collector.name == "cupti" and prof.session.meta.collector.gpu_measured
    assert [d.name for d in prof.session.meta.devices][1:] == ["Stand-in GPU"]


# -- the public surface ----------------------------------------------------------------------


def test_all_is_complete_and_names_no_private_module():
    names = advisor.__all__
    assert len(names) == len(set(names))
    for name in names:
        value = getattr(advisor, name)
        assert not isinstance(value, types.ModuleType), name
        assert name == "__version__" or not name.startswith("_"), name
    for name in ("Profiler", "RecordEvent", "region", "make_scheduler", "ProfilerState", "ProfilerTarget",
                 "SortedKeys", "export_timeline", "save_session"):
        assert name in names, name
    # Public callables and classes of the package's top level are all exported.
    public = {n for n, v in vars(advisor).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType) and n != "annotations"}
    assert public <= set(names), public - set(names)
    namespace: dict = {}
    exec("from advisor import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(names)
